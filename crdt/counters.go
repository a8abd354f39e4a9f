package crdt

import (
	"maps"
	"slices"
	"strings"
)

// Counters is the joined state of the per-window G-counters: for every
// (key, window), the largest count seen from each replica. It is what a PoP
// knows about all PoPs, its own flushed counts included.
//
// Join is the only way counts enter, and it takes the per-replica maximum, so
// the state is a join-semilattice: any two Counters that have joined the same
// slots, in any order and any number of times, have equal Slots. Zero counts
// are never stored. DropBefore removes old windows and raises a floor below
// which later slots are ignored.
//
// The zero value is an empty Counters ready to use. A Counters is not safe for
// concurrent use.
type Counters struct {
	windows map[int64]map[string][]count // window -> key -> counts sorted by replica
	names   map[string]string            // interned replica names
	n       int                          // number of stored slots
	floor   int64                        // windows below floor are dropped; valid if floored
	floored bool
}

// count is one replica's count within a (key, window).
type count struct {
	replica string
	n       uint64
}

// Join merges slots into c, keeping for each (key, window, replica) the larger
// count. It returns how many slots grew (or appeared). Slots with a zero
// count, and slots for a window below the floor set by DropBefore, change
// nothing. The order of slots does not matter, and joining a slot twice has
// the effect of joining it once.
func (c *Counters) Join(slots ...Slot) (changed int) {
	var (
		wm   map[string][]count
		last int64
	)
	for _, s := range slots {
		if s.Count == 0 || (c.floored && s.Window < c.floor) {
			continue
		}
		if wm == nil || s.Window != last {
			wm, last = c.window(s.Window), s.Window
		}
		if c.join(wm, s) {
			changed++
		}
	}
	return changed
}

// window returns the key map for window w, creating it if needed.
func (c *Counters) window(w int64) map[string][]count {
	wm := c.windows[w]
	if wm == nil {
		if c.windows == nil {
			c.windows = make(map[int64]map[string][]count)
		}
		wm = make(map[string][]count)
		c.windows[w] = wm
	}
	return wm
}

// join merges one slot into the key map of its window and reports whether it
// grew. Requires s.Count > 0, so that no zero count is ever stored.
func (c *Counters) join(wm map[string][]count, s Slot) bool {
	cs := wm[s.Key]
	i, found := search(cs, s.Replica)
	if found {
		if s.Count <= cs[i].n {
			return false
		}
		cs[i].n = s.Count // shares the backing array with the map's value
		return true
	}
	wm[s.Key] = slices.Insert(cs, i, count{replica: c.intern(s.Replica), n: s.Count})
	c.n++
	return true
}

// intern returns the stored copy of the replica name r, so that a million
// slots of a few replicas share a few strings however the slots were decoded.
func (c *Counters) intern(r string) string {
	if s, ok := c.names[r]; ok {
		return s
	}
	if c.names == nil {
		c.names = make(map[string]string)
	}
	c.names[r] = r
	return r
}

// search finds replica in counts sorted by replica: its index and true, or
// the index to insert it at and false.
func search(cs []count, replica string) (int, bool) {
	return slices.BinarySearchFunc(cs, replica, func(e count, r string) int {
		return strings.Compare(e.replica, r)
	})
}

// Total returns the sum of the counts for (key, window) over the replicas
// that in accepts; a nil in accepts every replica. The sum saturates at
// math.MaxUint64 instead of wrapping. It allocates nothing and costs one call
// of in per replica that has counted the key in the window.
func (c *Counters) Total(key string, window int64, in func(replica string) bool) uint64 {
	var sum uint64
	for _, e := range c.windows[window][key] {
		if in == nil || in(e.replica) {
			sum = addSat(sum, e.n)
		}
	}
	return sum
}

// Replica returns the count of one replica for (key, window), zero if c has
// none.
func (c *Counters) Replica(key string, window int64, replica string) uint64 {
	cs := c.windows[window][key]
	if i, ok := search(cs, replica); ok {
		return cs[i].n
	}
	return 0
}

// DropBefore removes every slot of every window before window and returns how
// many slots it removed. It also raises c's floor to window: from now on Join
// ignores slots for windows before it, so a late or redelivered slot cannot
// bring a dropped window back. The floor never goes down; DropBefore with a
// lower window than before drops nothing.
func (c *Counters) DropBefore(window int64) (dropped int) {
	if !c.floored || window > c.floor {
		c.floor, c.floored = window, true
	}
	for w, wm := range c.windows {
		if w < c.floor {
			for _, cs := range wm {
				dropped += len(cs)
			}
			delete(c.windows, w)
		}
	}
	c.n -= dropped
	if c.n == 0 {
		c.names = nil // let a churn of replica names be collected
	}
	return dropped
}

// Slots returns the whole state as slots, one per (key, window, replica) with
// a non-zero count, in CompareSlots order. It is what an anti-entropy exchange
// or a snapshot sends: joining c.Slots() into another Counters makes it hold
// at least everything c holds. The slice is new; the caller owns it.
func (c *Counters) Slots() []Slot {
	if c.n == 0 {
		return nil
	}
	out := make([]Slot, 0, c.n)
	for _, w := range slices.Sorted(maps.Keys(c.windows)) {
		wm := c.windows[w]
		for _, k := range slices.Sorted(maps.Keys(wm)) {
			for _, e := range wm[k] {
				out = append(out, Slot{Key: k, Window: w, Replica: e.replica, Count: e.n})
			}
		}
	}
	return out
}

// Len returns the number of slots c holds (non-zero counts over all keys,
// windows and replicas).
func (c *Counters) Len() int { return c.n }
