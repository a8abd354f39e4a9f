// Package replication moves a PoP's CRDT counts and mitigation bits to the
// other PoPs over NATS JetStream, and keeps the PoP's durable state in Pebble.
//
// The model (see crdt): every PoP is one replica; its own count for a (limit
// key, window) only grows; every flush interval it publishes the absolute
// values of the slots that changed, and receivers join them by per-replica
// maximum, so duplicates, reordering and redelivery are harmless. A periodic
// full-state exchange (anti-entropy) repairs whatever a lost message left
// behind.
//
// The protocol itself — when to flush, snapshot and beacon, what to retry,
// which bits to take, which regions are cut off — is replication/core, a
// pure state machine; the Replicator is its NATS JetStream driver, and the
// simulator its other one.
//
// replication imports crdt and proto, never pop: a PoP's counter store
// implements Counts, and cmd wires the two together (the simulator wires Counts
// to a simulated transport instead).
package replication

import (
	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/region"
)

// Counts is a PoP's counter store as replication sees it. Implementations
// are safe for concurrent use: replication calls them from its own goroutines
// while the PoP checks requests.
type Counts interface {
	// Delta returns this PoP's own slots that changed since the last call,
	// with their absolute counts (crdt.Local.Delta), and persists nothing.
	// The caller must persist what Delta returned before publishing it
	// (core.Ready.Save, Saver), so that a restart never publishes a lower
	// value.
	Delta() []crdt.Slot
	// Own returns every own slot, for snapshots.
	Own() []crdt.Slot
	// Restore raises own counts to slots after a restart; it never lowers one.
	Restore(own []crdt.Slot)
	// Apply joins other replicas' slots into the store's view of remote
	// counts. Slots of this PoP's own replica are ignored. sent is the unix
	// ns time stamped on the delta batch or snapshot the slots came in (the
	// sender's clock), 0 when unknown.
	Apply(sent int64, remote []crdt.Slot)
	// Remote returns every remote slot, for snapshots and persistence.
	Remote() []crdt.Slot
}

// Counts has no DropBefore: limits of different units keep windows of
// different ages (a day limit's previous window is a day old, a second
// limit's one second old), so only the store, which knows each key's window,
// drops old windows.

// Topology names the regions and the PoPs in each (region.Topology).
type Topology = region.Topology

// Bits is a PoP's table of mitigation bits as replication sees it: keys known
// to be over a region or global limit, denied without counting until a time.
// Implementations are safe for concurrent use.
type Bits interface {
	// BitsDelta returns the bits this PoP issued or extended since the last
	// call (crdt.Bit.Origin is this PoP).
	BitsDelta() []crdt.Bit
	// ApplyBits joins other PoPs' bits: per (key, scope) the latest Until
	// wins. The caller passes only bits whose scope concerns this PoP.
	ApplyBits(bits []crdt.Bit)
}

// BitsNotifier is a Bits that says when it issues a bit. The Replicator then
// publishes bits as soon as they are issued (at most one batch per
// Config.BitsInterval) instead of with the next flush: a bit is worth most
// when it reaches the other PoPs before the counts that tell the same story,
// which wait for the flush.
type BitsNotifier interface {
	Bits
	// BitsIssued returns a channel that receives (without blocking the
	// issuer, so several issues may yield one receive) after BitsDelta has
	// something new.
	BitsIssued() <-chan struct{}
}
