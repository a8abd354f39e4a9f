package replication

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrStreamConfig is returned, wrapped with the differences, by
// Replicator.StreamErr while the region's stream is configured otherwise than
// StreamConfig says: its subjects, subject transforms, republishing, mirror,
// sources or limits. A stream that transforms one PoP's subject into
// another's would let that PoP speak for the other, one whose subjects
// miss the PoPs' would drop every batch, and one without its sources would
// cut the region off: the PoP does not consume such a stream, and fails
// /readyz saying what differs, until the stream is as expected again.
var ErrStreamConfig = errors.New("replication: the region's stream is not configured as expected")

// streamDiff returns, one line each, how got differs from want in what the
// replication relies on. Values the server fills in for an unset limit (-1
// for 0) count as equal, and want without MaxBytes accepts any; a source given by Domain is equal to one with the
// domain's API prefix as External (nats.go sends it so).
func streamDiff(want, got jetstream.StreamConfig) []string {
	var d []string
	differ := func(what string, w, g any) {
		d = append(d, fmt.Sprintf("%s is %v, want %v", what, g, w))
	}
	if !sameSet(want.Subjects, got.Subjects) {
		d = append(d, fmt.Sprintf("subjects are %q, want %q", got.Subjects, want.Subjects))
	}
	if t := got.SubjectTransform; t != nil {
		d = append(d, fmt.Sprintf("it has a subject transform (%q to %q), want none", t.Source, t.Destination))
	}
	if p := got.RePublish; p != nil {
		d = append(d, fmt.Sprintf("it republishes (%q to %q), want not", p.Source, p.Destination))
	}
	if got.Mirror != nil {
		d = append(d, fmt.Sprintf("it mirrors stream %q, want no mirror", got.Mirror.Name))
	}
	if ws, gs := sourceKeys(want.Sources), sourceKeys(got.Sources); !slices.Equal(ws, gs) {
		d = append(d, fmt.Sprintf("sources are [%s], want [%s]", strings.Join(gs, "; "), strings.Join(ws, "; ")))
	}
	if want.Retention != got.Retention {
		differ("retention", want.Retention, got.Retention)
	}
	if want.Discard != got.Discard {
		differ("discard policy", want.Discard, got.Discard)
	}
	if want.Storage != got.Storage {
		differ("storage", want.Storage, got.Storage)
	}
	if want.MaxAge != got.MaxAge {
		differ("max age", want.MaxAge, got.MaxAge)
	}
	if want.Duplicates != got.Duplicates {
		differ("duplicate window", want.Duplicates, got.Duplicates)
	}
	// A PoP without a cap of its own (Config.MaxBytes 0: external servers
	// the operator sized) takes the stream's: only its administrator can
	// set one.
	if want.MaxBytes > 0 && unlimited(want.MaxBytes) != unlimited(got.MaxBytes) {
		differ("max bytes", unlimited(want.MaxBytes), unlimited(got.MaxBytes))
	}
	if unlimited(want.MaxMsgs) != unlimited(got.MaxMsgs) {
		differ("max messages", unlimited(want.MaxMsgs), unlimited(got.MaxMsgs))
	}
	if unlimited(want.MaxMsgsPerSubject) != unlimited(got.MaxMsgsPerSubject) {
		differ("max messages per subject", unlimited(want.MaxMsgsPerSubject), unlimited(got.MaxMsgsPerSubject))
	}
	if unlimited(int64(want.MaxMsgSize)) != unlimited(int64(got.MaxMsgSize)) {
		differ("max message size", unlimited(int64(want.MaxMsgSize)), unlimited(int64(got.MaxMsgSize)))
	}
	if want.Replicas != got.Replicas && !(want.Replicas <= 1 && got.Replicas <= 1) {
		differ("replicas", want.Replicas, got.Replicas)
	}
	if got.Sealed {
		d = append(d, "it is sealed (takes no message), want not")
	}
	if got.NoAck {
		d = append(d, "it does not acknowledge publishes, want it to")
	}
	return d
}

// unlimited maps the ways of saying "no limit" (0 in a request, -1 in the
// server's answer) to -1.
func unlimited(v int64) int64 {
	if v <= 0 {
		return -1
	}
	return v
}

func sameSet(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

// sourceKeys describes each source by what decides which messages it brings
// and from where, sorted.
func sourceKeys(ss []*jetstream.StreamSource) []string {
	out := make([]string, 0, len(ss))
	for _, s := range ss {
		if s == nil {
			continue
		}
		prefix := ""
		switch {
		case s.External != nil:
			prefix = s.External.APIPrefix
		case s.Domain != "":
			prefix = "$JS." + s.Domain + ".API"
		}
		k := fmt.Sprintf("%s filter %q api %q", s.Name, s.FilterSubject, prefix)
		for _, t := range s.SubjectTransforms {
			k += fmt.Sprintf(" transform %q to %q", t.Source, t.Destination)
		}
		if s.OptStartSeq != 0 || s.OptStartTime != nil {
			k += " from a start position"
		}
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
