package core

import (
	"fmt"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/region"
)

// Kind is what a Message carries.
type Kind uint8

const (
	// Delta is a batch of own slots that changed, absolute counts.
	Delta Kind = iota
	// Snapshot is the sender's full own state and active bits.
	Snapshot
	// BitsBatch is a batch of mitigation bits.
	BitsBatch
	// Hello is a numbered presence beacon; it carries only Seq.
	Hello
)

func (k Kind) String() string {
	switch k {
	case Delta:
		return "delta"
	case Snapshot:
		return "snapshot"
	case BitsBatch:
		return "bits"
	case Hello:
		return "hello"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Message is one protocol message, decoded: what the core asks to publish
// (Ready.Messages) and what a driver hands to Step.
type Message struct {
	Kind Kind
	// Region and POP name the sender.
	Region, POP string
	// Seq numbers the sender's batches (deltas, snapshots, bits) or, for a
	// Hello, its beacons. Both count up from the unix ns the sender's core
	// started at, so they grow across restarts. A driver that splits a
	// message in several may number the parts from Seq up, and must then
	// never reuse a number (see the Replicator).
	Seq uint64
	// Sent is the sender's unix ns when it built the message (the delta's
	// send time, the snapshot's, the bits' issue stamp); 0 when unknown. On
	// a Hello it is the sender's RAW clock, without its correction.
	Sent  int64
	Slots []crdt.Slot
	Bits  []crdt.Bit
	// Issued, on a received bits batch, is each bit's issue time when the
	// sender gave one per bit; nil means Sent for all.
	Issued []int64
	// Echo, on a Hello, tells the PoPs whose beacons the sender heard when
	// their last beacon left and arrived (clock.go).
	Echo []Echo
}

// Apply is remote state for the driver to apply, from one received message.
//
// A presence beacon is applied too, with neither slots nor bits: the
// driver tells Counts that implement BeaconCounts.
type Apply struct {
	// Kind, Region and POP are those of the message it came in.
	Kind        Kind
	Region, POP string
	// Sent is the message's send time (Counts.Apply's sent).
	Sent int64
	// Slots to join into the counts.
	Slots []crdt.Slot
	// Bits to join into the bit table, filtered by region.AcceptBit.
	Bits []crdt.Bit
	// Issued, for bits from a bits batch, is each kept bit's issue time (for
	// a propagation delay); nil for snapshots.
	Issued []int64
}

// Ready is what the driver must do, in this order: save Save (with
// everything applied since the last save) when Save is non-empty or SaveDue;
// publish Messages only once that save succeeded (else report the Delta and
// Snapshot messages Failed, unpublished); apply Apply; act on Share and
// Unreachable; then call Advance.
type Ready struct {
	// Save holds own slots that Messages carry and that must be durable
	// before any of them is published.
	Save []crdt.Slot
	// SaveDue says a flush interval passed: a durable driver saves now even
	// when Save is empty, so what it applied since is persisted too.
	SaveDue bool
	// Messages to publish, in order.
	Messages []Message
	// Apply is received state to apply, in order of arrival.
	Apply []Apply
	// Share is the new share of global limits, 0 when unchanged.
	Share float64
	// Unreachable lists, sorted, the regions cut off, when UnreachableChanged.
	Unreachable        []string
	UnreachableChanged bool
	// DroppedBits counts the received bits not applied, by reason.
	DroppedBits [region.NumBitDrops]int
	// Rejected counts what Step refused or clamped, by reason (check.go);
	// RejectedWhy describes one example of each, for a log line.
	Rejected    [NumRejects]int
	RejectedWhy [NumRejects]string
	// ClockOffset, when ClockChanged, is the new correction of the PoP's
	// clock: from now on the driver hands the core, and its store decides
	// on, its raw clock plus ClockOffset (clock.go).
	ClockOffset  int64
	ClockChanged bool
}

func (rd *Ready) empty() bool {
	return len(rd.Save) == 0 && !rd.SaveDue && len(rd.Messages) == 0 && len(rd.Apply) == 0 &&
		rd.Share == 0 && !rd.UnreachableChanged && !rd.ClockChanged && rd.DroppedBits == [region.NumBitDrops]int{} &&
		rd.Rejected == [NumRejects]int{}
}

// Stats are the core's counters and gauges.
type Stats struct {
	RetrySlots     int    // own slots waiting to be published again
	RetryBits      int    // own bits waiting to be published again
	RetryOverflows uint64 // times the retry set overflowed into a snapshot
}
