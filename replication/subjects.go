package replication

import (
	"fmt"
	"strings"
	"time"
)

// Subjects and streams.
//
// A PoP publishes its delta batches on edgelimit.<region>.delta.<pop>, its
// mitigation bits on edgelimit.<region>.bits.<pop> and its snapshots on
// edgelimit.<region>.snapshot.<pop>. Each region has one stream,
// EDGELIMIT_<REGION> (the region upper-cased), that captures
// edgelimit.<region>.> and sources, from every other region's stream, that
// region's own subjects (edgelimit.<other>.>; the filter keeps a message from
// bouncing back and forth between two streams that source each other). So
// each region's stream holds every region's batches, and a PoP reads only its
// own region's stream. Presence beacons go on edgelimit._hello.<region>.<pop>,
// which no stream captures ("_" cannot start a region name), and the slots
// of a delta whose keys are near their limit, again, for the direct path
// between regions (Config.Direct), on edgelimit._hot.<region>.<pop>.
//
// Found the hard way: without the source filters, two regions' streams that
// source each other copy every message back and forth forever.
const (
	subjectRoot    = "edgelimit"
	kindDelta      = "delta"
	kindSnapshot   = "snapshot"
	kindBits       = "bits"
	helloToken     = "_hello"
	hotToken       = "_hot"
	streamPrefix   = "EDGELIMIT_"
	defaultMaxAge  = 2 * time.Minute
	defaultAckWait = 2 * time.Second
	maxMessage     = 1 << 20 // bytes; NATS's default max payload
	minMessage     = 4 << 10 // bytes; the least MaxMessageBytes
	headerRoom     = 1 << 10 // bytes left in a message for NATS headers

	// A source of the region's stream that showed no activity for
	// sourceStale (the server sends it heartbeats every second) is stalled;
	// sources are checked every sourceCheck.
	sourceStale = 3 * time.Second
	sourceCheck = time.Second
)

// StreamName returns the name of region's stream: "EDGELIMIT_" and the
// region upper-cased.
func StreamName(region string) string { return streamPrefix + strings.ToUpper(region) }

// DeltaSubject returns the subject pop of region publishes its delta batches
// on.
func DeltaSubject(region, pop string) string {
	return subjectRoot + "." + region + "." + kindDelta + "." + pop
}

// SnapshotSubject returns the subject pop of region publishes its snapshots
// on.
func SnapshotSubject(region, pop string) string {
	return subjectRoot + "." + region + "." + kindSnapshot + "." + pop
}

// BitsSubject returns the subject pop of region publishes its mitigation
// bits (MitigationBatch messages) on.
func BitsSubject(region, pop string) string {
	return subjectRoot + "." + region + "." + kindBits + "." + pop
}

func helloSubject(region, pop string) string {
	return subjectRoot + "." + helloToken + "." + region + "." + pop
}

// hotSubject returns the subject pop of region publishes its hot slots on
// (HotCounts), outside every stream.
func hotSubject(region, pop string) string {
	return subjectRoot + "." + hotToken + "." + region + "." + pop
}

// validToken checks that name can be a NATS subject token and a stream name
// part: letters, digits, '-' and '_', not starting with '_'.
func validToken(what, name string) error {
	if name == "" {
		return fmt.Errorf("replication: empty %s name", what)
	}
	if name[0] == '_' {
		return fmt.Errorf("replication: %s name %q starts with '_'", what, name)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("replication: %s name %q has %q; use letters, digits, '-' and '_'", what, name, c)
		}
	}
	return nil
}

// parseSubject splits edgelimit.<region>.<kind>.<pop>.
func parseSubject(subject string) (region, kind, pop string, ok bool) {
	rest, ok := strings.CutPrefix(subject, subjectRoot+".")
	if !ok {
		return "", "", "", false
	}
	region, rest, ok1 := strings.Cut(rest, ".")
	kind, pop, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || region == "" || kind == "" || pop == "" || strings.Contains(pop, ".") {
		return "", "", "", false
	}
	return region, kind, pop, true
}
