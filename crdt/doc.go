// Package crdt implements the conflict-free replicated data types through
// which edgelimit's points of presence (PoPs) share what they counted: per-window
// grow-only counters (G-counters) and the max-registers that carry mitigation
// bits.
//
// The package holds values only. It reads no clock, does no IO and starts no
// goroutines; every instant it needs (a window start, a "now") is an argument.
// It imports the standard library only, and nothing else in edgelimit. The
// sub-package crdttest holds helpers for tests and the simulator.
//
// # Model
//
// Every PoP is one replica, named by a string. For each limit key and each
// window (an epoch-aligned window start in unix nanoseconds) a replica owns one
// count that only grows. A Slot is that count at one moment: (Key, Window,
// Replica, Count). Replicas exchange slots carrying the ABSOLUTE count, never
// an increment, and a receiver keeps, per (key, window, replica), the largest
// count it has seen. That join is commutative, associative and idempotent, so
// duplicated, reordered or redelivered slots are harmless, and any two
// replicas that have seen the same slots, in any order and any number of
// times, hold the same state. A lost slot is repaired by any later slot of the
// same replica for the same (key, window), or by a full-state exchange
// (anti-entropy) of Counters.Slots. The total for a (key, window) is the sum
// over replicas, optionally restricted to a region's replicas.
//
// A count of zero and an absent slot are the same thing: Join ignores zero
// counts and Slots never returns one, so equal states have equal Slots.
//
// Windows older than the previous one are dropped everywhere (DropBefore).
// After DropBefore(w) a Counters or Local also ignores any later slot or Add
// for a window before w, so a late redelivery cannot bring a dropped window
// back.
//
// Mitigation bits ("key is over its region or global limit until t") are
// max-registers: per (key, scope) the bit with the latest Until wins, ties
// broken by Origin so that every replica picks the same bit.
//
// # Usage
//
// A PoP keeps one Local for the counts it makes itself and one Counters for
// everything it has heard (its own flushed slots included):
//
//	own := crdt.NewLocal("fra1")
//	var all crdt.Counters
//
//	// On each allowed request:
//	own.Add(key, window, 1)
//
//	// Every flush interval: persist, then publish, then join locally.
//	delta := own.Delta()
//	save(delta)
//	publish(delta)
//	all.Join(delta...)
//
//	// On each batch received from another PoP:
//	all.Join(batch...)
//
//	// In a check: this region's view, or the global one.
//	regional := all.Total(key, window, inRegion)
//	global := all.Total(key, window, nil)
//
//	// When a window rolls over:
//	own.DropBefore(prev)
//	all.DropBefore(prev)
//
// After a restart the PoP first calls own.Restore with the slots it saved and
// all.Join with the merged state it saved, and only then counts again; see
// Local for why that order keeps the published counts monotonic.
//
// # Concurrency
//
// No type here is safe for concurrent use. Callers hold a lock, or confine a
// value to one goroutine.
package crdt
