package crdt

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// Slot is one replica's absolute count for one (key, window): the unit that
// replicas exchange and join. A Slot with Count zero carries no information;
// Join ignores it.
type Slot struct {
	Key     string // limit key; opaque to this package, "" is a valid key
	Window  int64  // window start, unix nanoseconds, epoch-aligned by the caller
	Replica string // the replica (PoP) that owns the count
	Count   uint64 // the replica's absolute count for (Key, Window); only grows
}

// String formats s for logs and test failures.
func (s Slot) String() string {
	return fmt.Sprintf("key=%q window=%d replica=%q count=%d", s.Key, s.Window, s.Replica, s.Count)
}

// CompareSlots orders slots by Window, then Key, then Replica, then Count. It
// is the order in which Counters.Slots, Local.Slots and Local.Delta return
// slots, so outputs are deterministic and two states can be diffed by a
// merge walk.
func CompareSlots(a, b Slot) int {
	if c := cmp.Compare(a.Window, b.Window); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Key, b.Key); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Replica, b.Replica); c != 0 {
		return c
	}
	return cmp.Compare(a.Count, b.Count)
}

// OneOf returns a replica filter for Counters.Total that accepts exactly the
// named replicas, e.g. the PoPs of one region. Build it once (when the region
// map loads) and reuse it: the filter costs a few string comparisons (a map lookup for more than
// eight names) per replica. OneOf()
// with no names accepts nothing.
func OneOf(replicas ...string) func(replica string) bool {
	if len(replicas) <= 8 {
		// A few short names compare faster than they hash.
		names := slices.Clone(replicas)
		return func(replica string) bool {
			for _, n := range names {
				if n == replica {
					return true
				}
			}
			return false
		}
	}
	set := make(map[string]struct{}, len(replicas))
	for _, r := range replicas {
		set[r] = struct{}{}
	}
	return func(replica string) bool {
		_, ok := set[replica]
		return ok
	}
}

// addSat returns a+b, or math.MaxUint64 if the sum overflows. Counts saturate
// rather than wrap so that a count can never appear to shrink.
func addSat(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxUint64
}
