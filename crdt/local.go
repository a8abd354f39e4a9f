package crdt

import (
	"cmp"
	"slices"
	"strings"
	"unsafe"
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
	windows windows[own] // per window, key -> own count
	hash    hasher
	dirty   []dirtyRef // counts changed since the last Delta
	order   []int32    // scratch for Delta's sort
	names   []byte     // the chunk new keys' bytes are copied to (see insert)
	n       int        // number of counts
	floor   int64      // windows below floor are dropped; valid if floored
	floored bool
}

// own is this replica's count for one (key, window), held inline in its
// window's table.
type own struct {
	n     uint64
	dirty bool // in Local.dirty
}

// dirtyRef names a changed count by its window and key hash rather than by
// its slot, since a table moves its slots when it grows. Delta looks the
// count up again, once per changed count and flush.
type dirtyRef struct {
	window int64
	hash   uint64
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
	h := l.hash.string(key)
	wt := l.windows.open(window)
	i := wt.find(h)
	if i < 0 {
		i = l.insert(wt, h, key)
	}
	return l.add(wt, i, n)
}

// AddBytes is Add for a key held in bytes: it converts the key to a string
// (an allocation) only for a (key, window) it does not hold yet, so counting
// a known key allocates nothing.
func (l *Local) AddBytes(key []byte, window int64, n uint64) uint64 {
	if l.floored && window < l.floor {
		return 0
	}
	h := l.hash.bytes(key) // equal to l.hash.string(string(key))
	wt := l.windows.get(window)
	i := -1
	if wt != nil {
		i = wt.find(h)
	}
	switch {
	case n == 0 && i < 0:
		return 0
	case n == 0:
		return wt.table.slots[i].v.n
	case i < 0:
		if wt == nil {
			wt = l.windows.open(window)
		}
		i = l.insertBytes(wt, h, key)
	}
	return l.add(wt, i, n)
}

// insert adds the key of hash h to wt with a zero count and returns its slot.
// Callers raise the count at once, so no zero count stays held.
//
// The key's bytes are copied into a chunk shared with the keys inserted
// before and after it, rather than each into an allocation of its own: the
// keys of a window then sit together in a few megabytes, not scattered over
// the heap, and the work that reads them all (Delta's and Slots' sorts, a
// peer hashing the slots it joins) finds them in cache far more often. It
// also keeps the caller's string from being retained.
func (l *Local) insert(wt *window[own], h uint64, key string) int {
	return l.insertBytes(wt, h, unsafe.Slice(unsafe.StringData(key), len(key)))
}

// keyChunk is the size of the chunks insert copies keys to.
const keyChunk = 64 << 10

func (l *Local) insertBytes(wt *window[own], h uint64, key []byte) int {
	l.n++
	if len(key) > cap(l.names)-len(l.names) {
		l.names = make([]byte, 0, max(keyChunk, len(key)))
	}
	start := len(l.names)
	l.names = append(l.names, key...)
	// Bytes once appended are never written again (later keys go after
	// them, or to a new chunk), so the string may view them.
	return wt.insert(h, unsafe.String(unsafe.SliceData(l.names[start:]), len(key)))
}

// add adds n > 0 to the count in slot i of wt, marks it dirty and returns it.
func (l *Local) add(wt *window[own], i int, n uint64) uint64 {
	c := &wt.table.slots[i]
	c.v.n = addSat(c.v.n, n)
	l.markDirty(wt.start, c)
	return c.v.n
}

// Count returns this replica's count for (key, window), zero if none.
func (l *Local) Count(key string, window int64) uint64 {
	return l.CountOf(l.Key(key), window)
}

// Key returns key's KeyHash for l.
func (l *Local) Key(key string) KeyHash { return KeyHash(l.hash.string(key)) }

// CountOf is Count of the key hashed k.
func (l *Local) CountOf(k KeyHash, window int64) uint64 {
	wt := l.windows.get(window)
	if wt == nil {
		return 0
	}
	if i := wt.find(uint64(k)); i >= 0 {
		return wt.table.slots[i].v.n
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
		h := l.hash.string(s.Key)
		wt := l.windows.open(s.Window)
		i := wt.find(h)
		if i < 0 {
			i = l.insert(wt, h, s.Key)
		}
		if c := &wt.table.slots[i]; s.Count > c.v.n {
			c.v.n = s.Count
			l.markDirty(wt.start, c)
			raised++
		}
	}
	return raised
}

func (l *Local) markDirty(window int64, c *entry[own]) {
	if !c.v.dirty {
		c.v.dirty = true
		l.dirty = append(l.dirty, dirtyRef{window: window, hash: c.hash})
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
	out := make([]Slot, len(l.dirty))
	var wt *window[own]
	for j, d := range l.dirty {
		if wt == nil || wt.start != d.window {
			wt = l.windows.get(d.window) // held: DropBefore drops the refs of dropped windows
		}
		i := wt.find(d.hash)
		c := &wt.table.slots[i]
		c.v.dirty = false
		out[j] = Slot{Key: wt.keys[i], Window: d.window, Replica: l.replica, Count: c.v.n}
	}
	l.dirty = l.dirty[:0]
	// Sorting by (window, key) is CompareSlots order, since every slot has
	// the same replica and a distinct (window, key). Sorting indexes and then
	// moving each slot once is cheaper than letting the sort swap slots of
	// 48 bytes; the indexes are kept for the next Delta.
	order := l.order[:0]
	for j := range out {
		order = append(order, int32(j))
	}
	slices.SortFunc(order, func(a, b int32) int {
		sa, sb := &out[a], &out[b]
		if c := cmp.Compare(sa.Window, sb.Window); c != 0 {
			return c
		}
		return strings.Compare(sa.Key, sb.Key)
	})
	// Put out[order[k]] at k, one permutation cycle at a time.
	for k := range order {
		if int(order[k]) == k {
			continue
		}
		first, j := out[k], k
		for {
			src := int(order[j])
			order[j] = int32(j) // done
			if src == k {
				out[j] = first
				break
			}
			out[j] = out[src]
			j = src
		}
	}
	l.order = order
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
	var idx []int
	for _, wt := range l.windows { // sorted by window
		idx = wt.occupied(idx[:0])
		slices.SortFunc(idx, func(a, b int) int { return strings.Compare(wt.keys[a], wt.keys[b]) })
		for _, i := range idx {
			out = append(out, Slot{Key: wt.keys[i], Window: wt.start, Replica: l.replica, Count: wt.table.slots[i].v.n})
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
	_, dropped = l.windows.dropBefore(l.floor)
	l.n -= dropped
	if dropped > 0 {
		l.dirty = slices.DeleteFunc(l.dirty, func(d dirtyRef) bool { return d.window < l.floor })
	}
	return dropped
}

// Len returns the number of (key, window) counts l holds.
func (l *Local) Len() int { return l.n }
