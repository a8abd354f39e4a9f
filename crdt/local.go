package crdt

import (
	"cmp"
	"maps"
	"slices"
	"strings"
)

// Local is one replica's own counts, the only counts it may increase, and the
// set of them that changed since the last flush. Add counts; Delta hands out
// the changed counts as absolute slots to publish; Slots hands out all of them
// for a snapshot.
//
// Local guarantees, by construction, that no value it hands out for a
// (key, window) is lower than one it handed out before: a count changes only
// by Add (which adds an unsigned amount, saturating at math.MaxUint64) or by
// Restore (which keeps the larger of the held and the restored count), and
// DropBefore raises a floor below which Add and Restore are ignored, so a
// dropped window never restarts from zero. Across a crash the guarantee needs
// two things from the driver: it persists each Delta before publishing it,
// and on restart it calls Restore with what it persisted before the first Add
// or Delta (an Add made before Restore may be hidden by the restored count).
//
// The zero value is a Local for the replica named ""; use NewLocal. A Local is
// not safe for concurrent use.
type Local struct {
	replica string
	windows map[int64]map[string]*cell // window -> key -> own count
	dirty   []*cell                    // cells changed since the last Delta
	n       int                        // number of cells
	floor   int64                      // windows below floor are dropped; valid if floored
	floored bool
}

// cell is this replica's count for one (key, window).
type cell struct {
	key    string
	window int64
	n      uint64
	dirty  bool // in Local.dirty
}

// NewLocal returns an empty Local for the named replica.
func NewLocal(replica string) *Local {
	return &Local{replica: replica}
}

// Replica returns the name of the replica whose counts l holds.
func (l *Local) Replica() string { return l.replica }

// Add adds n to this replica's count for (key, window), marks it for the next
// Delta, and returns the new count. The count saturates at math.MaxUint64.
// Adding zero changes nothing. An Add for a window before the floor set by
// DropBefore is ignored and returns zero.
func (l *Local) Add(key string, window int64, n uint64) uint64 {
	if l.floored && window < l.floor {
		return 0
	}
	if n == 0 {
		return l.Count(key, window)
	}
	c := l.cell(key, window)
	c.n = addSat(c.n, n)
	l.markDirty(c)
	return c.n
}

// AddBytes is Add for a key held in bytes: it converts the key to a string
// (an allocation) only for a (key, window) it does not hold yet, so counting
// a known key allocates nothing.
func (l *Local) AddBytes(key []byte, window int64, n uint64) uint64 {
	if wm := l.windows[window]; wm != nil && !(l.floored && window < l.floor) {
		if c := wm[string(key)]; c != nil { // no allocation: a lookup
			if n > 0 {
				c.n = addSat(c.n, n)
				l.markDirty(c)
			}
			return c.n
		}
	}
	return l.Add(string(key), window, n)
}

// Count returns this replica's count for (key, window), zero if none.
func (l *Local) Count(key string, window int64) uint64 {
	if c := l.windows[window][key]; c != nil {
		return c.n
	}
	return 0
}

// Restore raises this replica's counts to the given slots, typically the ones
// persisted before a restart, and returns how many counts it raised. A count
// never goes down: a slot lower than what l holds changes nothing. Raised
// counts are marked for the next Delta, so a value that was persisted but
// perhaps never published is published again. Slots of other replicas, slots
// with a zero count and slots for windows before the floor are ignored.
func (l *Local) Restore(slots ...Slot) (raised int) {
	for _, s := range slots {
		if s.Replica != l.replica || s.Count == 0 || (l.floored && s.Window < l.floor) {
			continue
		}
		c := l.cell(s.Key, s.Window)
		if s.Count > c.n {
			c.n = s.Count
			l.markDirty(c)
			raised++
		}
	}
	return raised
}

// cell returns the cell for (key, window), creating it with a zero count.
// Callers raise the count of a new cell at once, so no zero count stays held.
func (l *Local) cell(key string, window int64) *cell {
	wm := l.windows[window]
	if wm == nil {
		if l.windows == nil {
			l.windows = make(map[int64]map[string]*cell)
		}
		wm = make(map[string]*cell)
		l.windows[window] = wm
	}
	c := wm[key]
	if c == nil {
		c = &cell{key: key, window: window}
		wm[key] = c
		l.n++
	}
	return c
}

func (l *Local) markDirty(c *cell) {
	if !c.dirty {
		c.dirty = true
		l.dirty = append(l.dirty, c)
	}
}

// Delta returns the current absolute count of every (key, window) that
// changed since the previous Delta, in CompareSlots order, and clears the
// changed set. It returns nil when nothing changed. Each value is at least any
// value returned before for the same (key, window). The slice is new; the
// caller owns it.
func (l *Local) Delta() []Slot {
	if len(l.dirty) == 0 {
		return nil
	}
	// Sorting the pointers by (window, key) is CompareSlots order, since
	// every slot has the same replica and a distinct (window, key).
	slices.SortFunc(l.dirty, func(a, b *cell) int {
		if c := cmp.Compare(a.window, b.window); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	})
	out := make([]Slot, len(l.dirty))
	for i, c := range l.dirty {
		c.dirty = false
		out[i] = Slot{Key: c.key, Window: c.window, Replica: l.replica, Count: c.n}
	}
	clear(l.dirty) // drop the pointers so dropped cells can be collected
	l.dirty = l.dirty[:0]
	return out
}

// Pending returns how many (key, window) counts changed since the last Delta.
func (l *Local) Pending() int { return len(l.dirty) }

// Slots returns all of this replica's counts, in CompareSlots order, without
// touching the changed set: what a snapshot persists or an anti-entropy
// exchange sends. The slice is new; the caller owns it.
func (l *Local) Slots() []Slot {
	if l.n == 0 {
		return nil
	}
	out := make([]Slot, 0, l.n)
	for _, w := range slices.Sorted(maps.Keys(l.windows)) {
		wm := l.windows[w]
		for _, k := range slices.Sorted(maps.Keys(wm)) {
			out = append(out, Slot{Key: k, Window: w, Replica: l.replica, Count: wm[k].n})
		}
	}
	return out
}

// DropBefore removes the counts of every window before window, including any
// not yet handed out by Delta, and returns how many it removed. It raises l's
// floor to window: later Adds and Restores for earlier windows are ignored.
// The floor never goes down.
func (l *Local) DropBefore(window int64) (dropped int) {
	if !l.floored || window > l.floor {
		l.floor, l.floored = window, true
	}
	for w, wm := range l.windows {
		if w < l.floor {
			dropped += len(wm)
			delete(l.windows, w)
		}
	}
	l.n -= dropped
	if dropped > 0 {
		kept := l.dirty[:0]
		for _, c := range l.dirty {
			if c.window >= l.floor {
				kept = append(kept, c)
			}
		}
		clear(l.dirty[len(kept):])
		l.dirty = kept
	}
	return dropped
}

// Len returns the number of (key, window) counts l holds.
func (l *Local) Len() int { return l.n }
