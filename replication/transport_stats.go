package replication

import (
	"context"
	"fmt"
	"log/slog"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/edgelimit/edgelimit/region"
	"github.com/edgelimit/edgelimit/replication/core"
)

// DropReason says why a received message was dropped instead of applied.
type DropReason int

const (
	// DropDecode: the payload is not a protobuf message of the subject's
	// kind (garbage, truncated, invalid UTF-8 in a name).
	DropDecode DropReason = iota
	// DropInvalid: the message decodes but fails Validate (no replica,
	// keys and counts of different lengths, ...).
	DropInvalid
	// DropRevision: the message requires a newer schema revision than this
	// reader knows (edgelimitpb.ErrNewerRevision); applying part of it could
	// lose counts, so it waits for anti-entropy after an upgrade.
	DropRevision
	// DropSubject: the subject is under edgelimit.<region>. but is not one
	// this reader knows (edgelimit.<region>.delta|snapshot|bits.<pop>).
	DropSubject
	// DropMismatch: the message names another replica or region than its
	// subject does.
	DropMismatch

	// NumDropReasons is the number of drop reasons, for arrays indexed by
	// DropReason.
	NumDropReasons = iota
)

// String returns the reason's metric label.
func (d DropReason) String() string {
	switch d {
	case DropDecode:
		return "decode"
	case DropInvalid:
		return "invalid"
	case DropRevision:
		return "revision"
	case DropSubject:
		return "subject"
	case DropMismatch:
		return "mismatch"
	}
	return fmt.Sprintf("DropReason(%d)", int(d))
}

// BitDropReason says why a received mitigation bit was not applied: the
// rule is region's (region.AcceptBit). It counts single bits of messages
// that were themselves valid; a message that does not decode or validate is
// counted once under its DropReason.
type BitDropReason = region.BitDrop

// The bit drop reasons (see region.BitDrop).
const (
	BitDropScope      = region.BitDropScope
	BitDropRegion     = region.BitDropRegion
	BitDropExpired    = region.BitDropExpired
	BitDropOwn        = region.BitDropOwn
	NumBitDropReasons = region.NumBitDrops
)

// Stats is a point-in-time copy of a Replicator's counters. Counters only
// grow while the Replicator lives.
type Stats struct {
	// PublishedBatches, PublishedSlots and PublishedBytes count the delta
	// batches whose publish JetStream acknowledged, the slots in them and
	// their payload bytes (without NATS headers).
	PublishedBatches, PublishedSlots, PublishedBytes uint64
	// PublishedSnapshots and PublishedSnapshotSlots count acknowledged
	// snapshot messages (a snapshot may take several) and their slots.
	PublishedSnapshots, PublishedSnapshotSlots uint64
	// PublishFailures counts messages whose publish failed or was not
	// acknowledged in time; a failed delta's slots are retried next flush.
	PublishFailures uint64
	// RetrySlots is how many own slots JetStream has not acknowledged yet:
	// those waiting to be published again after a failure, and those
	// published and awaiting their acknowledgement (which, while NATS is
	// unreachable, fail and wait again).
	RetrySlots int
	// RetryOverflows counts the times the retry set grew past its cap and was
	// replaced by a full snapshot of the PoP's own counts.
	RetryOverflows uint64

	// AppliedBatches and AppliedSlots count other PoPs' delta batches
	// applied, and their slots.
	AppliedBatches, AppliedSlots uint64
	// AppliedSnapshots and AppliedSnapshotSlots count other PoPs' snapshot
	// messages applied (from the stream or directly) and their slots.
	AppliedSnapshots, AppliedSnapshotSlots uint64
	// DirectSnapshots counts, of AppliedSnapshots, those taken directly off
	// another region's subject instead of from the stream.
	DirectSnapshots uint64
	// DirectBatches and DirectSlots count other regions' delta batches, and
	// their slots, taken directly off their subjects — their hot slots on a
	// direct path (Config.Direct), and whole batches while stream sourcing
	// from their region was stalled (not included in AppliedBatches).
	DirectBatches, DirectSlots uint64
	// HotBatches counts the batches of this PoP's hot slots it published
	// for other regions' direct paths (HotCounts).
	HotBatches uint64
	// StalledSources is how many other regions' stream sources were stalled
	// at the last check.
	StalledSources int
	// ClockOffset is the correction of the wall clock the PoPs agreed on
	// (core's clock.go): the PoP decides at the wall clock plus this.
	ClockOffset time.Duration
	// SkippedOwn counts this PoP's own messages read back from the stream.
	SkippedOwn uint64
	// Dropped counts dropped stream messages by reason.
	Dropped [NumDropReasons]uint64
	// LastAppliedSeq is the stream sequence of the last stream message
	// handled (applied, skipped or dropped), as passed to OnApplied.
	LastAppliedSeq uint64

	// PublishedBits counts the mitigation bits in MitigationBatch messages
	// JetStream acknowledged (a bit retried after a failure counts once per
	// acknowledged publish). PublishedBitBatches counts those messages.
	PublishedBits, PublishedBitBatches uint64
	// PublishedSnapshotBits counts the own active bits carried by
	// acknowledged snapshot messages.
	PublishedSnapshotBits uint64
	// RetryBits is how many bits wait to be published again.
	RetryBits int
	// AppliedBits counts other PoPs' bits passed to Bits.ApplyBits, from
	// batches (stream or direct) and snapshots; a bit that arrives both
	// from the stream and directly counts twice (the join absorbs it).
	// AppliedSnapshotBits is the part of it that came in snapshots.
	AppliedBits, AppliedSnapshotBits uint64
	// DroppedBits counts received bits not applied, by reason.
	DroppedBits [NumBitDropReasons]uint64
	// Rejected counts what the receiver's checks refused or clamped, by
	// reason (RejectReason): messages from outside the topology, slots and
	// bits that were not their sender's, counts and bits' ends past
	// Config.Bounds.
	Rejected [NumRejectReasons]uint64
	// BitLag is the propagation delay of bits applied from batches: the
	// receiver's clock when it applied a bit minus the origin's clock at the
	// flush that published it (issued_unix_nano). It includes neither the
	// wait for the flush nor snapshot bits (whose issue time is the
	// snapshot's).
	BitLag LagStats

	// Lag is the distribution of replication lag of applied delta batches
	// (from the stream or directly):
	// the receiver's clock when it applied a batch minus the sender's clock
	// when it built it. It does not include the wait for the flush.
	Lag LagStats
}

// DroppedTotal returns the number of dropped messages over all reasons.
func (s Stats) DroppedTotal() uint64 {
	var n uint64
	for _, d := range s.Dropped {
		n += d
	}
	return n
}

// LagStats summarizes a lag histogram. Quantiles are upper bounds of
// histogram buckets, at most 1/16 (6.25%) above the true value.
type LagStats struct {
	Count    uint64
	P50, P99 time.Duration
	Max      time.Duration
}

// lagHistogram is a log-linear histogram of durations in microseconds: exact
// below 32 µs, then 16 buckets per power of two. It is safe for concurrent
// use; Record is lock-free.
type lagHistogram struct {
	buckets [lagBuckets]atomic.Uint64
	count   atomic.Uint64
	max     atomic.Int64 // microseconds
}

const (
	lagSub     = 16 // buckets per power of two
	lagSubBits = 4
	lagBuckets = 2*lagSub + (40-5)*lagSub // up to 2^40 µs, about 12 days
)

// lagBucket returns the bucket of v microseconds.
func lagBucket(v uint64) int {
	if v < 2*lagSub {
		return int(v)
	}
	exp := bits.Len64(v) - 1 // >= 5
	mant := int(v>>(exp-lagSubBits)) & (lagSub - 1)
	i := 2*lagSub + (exp-5)*lagSub + mant
	return min(i, lagBuckets-1)
}

// lagUpper returns the largest value, in microseconds, of bucket i.
func lagUpper(i int) uint64 {
	if i < 2*lagSub {
		return uint64(i)
	}
	exp := (i-2*lagSub)/lagSub + 5
	mant := uint64((i - 2*lagSub) % lagSub)
	return ((lagSub+mant+1)<<(exp-lagSubBits) - 1)
}

// Record adds one observation; a negative d (clock skew) counts as zero.
func (h *lagHistogram) Record(d time.Duration) {
	us := max(d.Microseconds(), 0)
	h.buckets[lagBucket(uint64(us))].Add(1)
	h.count.Add(1)
	for {
		m := h.max.Load()
		if us <= m || h.max.CompareAndSwap(m, us) {
			break
		}
	}
}

// Stats returns the count, p50, p99 and max recorded so far.
func (h *lagHistogram) Stats() LagStats {
	var counts [lagBuckets]uint64
	var total uint64
	for i := range h.buckets {
		counts[i] = h.buckets[i].Load()
		total += counts[i]
	}
	s := LagStats{Count: total, Max: time.Duration(h.max.Load()) * time.Microsecond}
	if total == 0 {
		return s
	}
	quantile := func(q float64) time.Duration {
		rank := uint64(q*float64(total) + 0.5)
		rank = max(rank, 1)
		var seen uint64
		for i, c := range counts {
			seen += c
			if seen >= rank {
				return min(time.Duration(lagUpper(i))*time.Microsecond, s.Max)
			}
		}
		return s.Max
	}
	s.P50, s.P99 = quantile(0.50), quantile(0.99)
	return s
}

// logLimiter lets one log line per key through per interval and counts the
// ones it suppressed in between. It is safe for concurrent use.
type logLimiter struct {
	interval time.Duration
	slots    [NumDropReasons + numLogKinds]struct {
		last       atomic.Int64 // unix nanoseconds of the last line let through
		suppressed atomic.Uint64
	}
}

// Log kinds other than drop reasons, placed after them in logLimiter.slots.
const (
	logPublish = NumDropReasons + iota
	logSetup
	logSnapshot
	logReject   // logReject+Reject: one slot per reject reason
	numLogKinds = iota + core.NumRejects - 1
)

// log writes the line for kind k unless one was written less than interval
// ago; the line carries how many were suppressed since the last one.
func (l *logLimiter) log(logger *slog.Logger, k int, level slog.Level, msg string, args ...any) {
	s := &l.slots[k]
	now := time.Now().UnixNano()
	last := s.last.Load()
	if now-last < int64(l.interval) || !s.last.CompareAndSwap(last, now) {
		s.suppressed.Add(1)
		return
	}
	if n := s.suppressed.Swap(0); n > 0 {
		args = append(args, "suppressed", n)
	}
	logger.Log(context.Background(), level, msg, args...)
}
