package crdt

import (
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
	windows windows[counts] // per window, key -> counts
	hash    hasher
	names   []string          // interned replica names, by index
	ids     map[string]uint32 // replica name -> index in names
	n       int               // number of stored slots
	hashes  []uint64          // Join's scratch (see touch)
	touched uint64            // what touch read, kept so the reads are not optimized away
	floor   int64             // windows below floor are dropped; valid if floored
	floored bool
}

// counts is the counts of one (key, window). The first replica to count the
// key is held inline, so that a key counted by one other PoP, the common case
// (an anycast client stays on one PoP), costs one cache miss to join or read;
// further replicas are a list in the window's nodes, one more miss. Replicas
// are indexes into Counters.names rather than strings, and the list is an
// index rather than a slice: a slot of the table is then 24 bytes free of
// pointers, half what a slice made it, so more of a table stays in cache and
// the garbage collector never scans it.
type counts struct {
	n    uint64 // the first replica's count, never zero
	rep  uint32
	more uint32 // 1 + the index in the window's nodes of the next replica's count; 0 ends the list
}

// repNode is a further replica's count of a (key, window), in its window's
// nodes.
type repNode struct {
	n         uint64
	rep, next uint32 // next as counts.more
}

// repCount is one replica's count, as Slots sorts them.
type repCount struct {
	rep uint32
	n   uint64
}

// Join merges slots into c, keeping for each (key, window, replica) the larger
// count. It returns how many slots grew (or appeared). Slots with a zero
// count, and slots for a window below the floor set by DropBefore, change
// nothing. The order of slots does not matter, and joining a slot twice has
// the effect of joining it once.
func (c *Counters) Join(slots ...Slot) (changed int) {
	if len(slots) >= sortedJoin && len(slots) < 1<<sortIndexBits {
		return c.joinSorted(slots)
	}
	return c.joinInOrder(slots, c.touch(slots))
}

// touchMin is the batch size from which Join first hashes every slot and
// reads its home slot, before joining any.
const touchMin = 32

// touch hashes the keys of slots and reads each one's home slot in its
// window's table, and returns the hashes; nil for a small batch. The reads
// do not depend on one another, so the processor has many cache misses under
// way at once instead of one per join, and the joins that follow find their
// slots in cache: a delta from another PoP is a few hundred random keys.
func (c *Counters) touch(slots []Slot) []uint64 {
	if len(slots) < touchMin {
		return nil
	}
	hashes := c.hashes[:0]
	var (
		wt  *window[counts]
		sum uint64
	)
	for i := range slots {
		s := &slots[i]
		h := c.hash.string(s.Key)
		hashes = append(hashes, h)
		if wt == nil || s.Window != wt.start {
			wt = c.windows.get(s.Window)
		}
		if wt != nil && wt.n > 0 {
			sum += wt.slots[h>>wt.shift].hash
		}
	}
	c.hashes, c.touched = hashes, sum
	return hashes
}

// sortedJoin is the batch size from which Join visits slots in the order of
// their place in the tables rather than in the order given, provided the
// batch has fewer than 1<<sortIndexBits slots and at most sortedWindows
// windows (a flush or a snapshot has two or three).
const (
	sortedJoin    = 1024
	sortIndexBits = 21
	sortedWindows = 8
)

// joinSorted is Join for a large batch, a snapshot above all. Joined in the
// order given, every slot is a cache and TLB miss somewhere in a table of
// tens of megabytes; joined by window and then by hash, whose top bits are
// the home slot, the batch sweeps each table from one end to the other, and
// the hardware fetches ahead. Sorting costs far less than the misses it
// saves once a batch is a fair part of a table.
func (c *Counters) joinSorted(slots []Slot) (changed int) {
	// Each slot's hash, 0 for a slot that changes nothing, and the few
	// windows of the batch.
	hashes := make([]uint64, len(slots))
	var windows []int64
	for i := range slots {
		s := &slots[i]
		if s.Count == 0 || (c.floored && s.Window < c.floor) {
			continue
		}
		hashes[i] = c.hash.string(s.Key) // never 0
		if !slices.Contains(windows, s.Window) {
			if len(windows) == sortedWindows {
				return c.joinInOrder(slots, hashes) // an odd batch: not worth sorting
			}
			windows = append(windows, s.Window)
		}
	}
	slices.Sort(windows)
	// Per window, sort the slots by hash as plain integers, the slot's
	// index in the low bits: fast to sort, and slots of one (key, window)
	// keep their order, so the count of changes is the one joining in the
	// order given reports. The home slot comes from the top bits, which the
	// index does not touch.
	const low = 1<<sortIndexBits - 1
	order := make([]uint64, 0, len(slots))
	var (
		lastRep string
		rep     uint32
		haveRep bool
	)
	for _, w := range windows {
		order = order[:0]
		for i := range slots {
			if hashes[i] != 0 && slots[i].Window == w {
				order = append(order, hashes[i]&^low|uint64(i))
			}
		}
		slices.Sort(order)
		wt := c.windows.open(w)
		for _, o := range order {
			i := int(o & low)
			s := &slots[i]
			if !haveRep || s.Replica != lastRep {
				rep, lastRep, haveRep = c.intern(s.Replica), s.Replica, true
			}
			if c.join(wt, s, rep, hashes[i]) {
				changed++
			}
		}
	}
	return changed
}

// joinInOrder joins slots in the order given. hashes, when not nil, holds
// their keys' hashes, or 0 where not worked out yet.
func (c *Counters) joinInOrder(slots []Slot, hashes []uint64) (changed int) {
	var (
		wt      *window[counts]
		lastRep string
		rep     uint32
		haveRep bool
	)
	for i := range slots {
		s := &slots[i]
		if s.Count == 0 || (c.floored && s.Window < c.floor) {
			continue
		}
		if wt == nil || s.Window != wt.start {
			wt = c.windows.open(s.Window)
		}
		if !haveRep || s.Replica != lastRep {
			rep, lastRep, haveRep = c.intern(s.Replica), s.Replica, true
		}
		var h uint64
		if hashes != nil {
			h = hashes[i]
		}
		if h == 0 {
			h = c.hash.string(s.Key)
		}
		if c.join(wt, s, rep, h) {
			changed++
		}
	}
	return changed
}

// join merges one slot, of interned replica rep and key hash h, into the
// table of its window and reports whether it grew. Requires s.Count > 0, so
// that no zero count is ever stored.
func (c *Counters) join(wt *window[counts], s *Slot, rep uint32, h uint64) bool {
	i := wt.find(h)
	if i < 0 {
		i = wt.insert(h, s.Key)
		wt.table.slots[i].v = counts{n: s.Count, rep: rep}
		wt.count++
		c.n++
		return true
	}
	e := &wt.table.slots[i].v
	if e.rep == rep {
		if s.Count <= e.n {
			return false
		}
		e.n = s.Count
		return true
	}
	for j := e.more; j != 0; j = wt.nodes[j-1].next {
		if m := &wt.nodes[j-1]; m.rep == rep {
			if s.Count <= m.n {
				return false
			}
			m.n = s.Count
			return true
		}
	}
	// The new replica goes first in the list: order does not matter.
	wt.nodes = append(wt.nodes, repNode{n: s.Count, rep: rep, next: e.more})
	e.more = uint32(len(wt.nodes))
	wt.count++
	c.n++
	return true
}

// intern returns the index of the replica name r, adding a copy of r to the
// names if it is new. The copy keeps a name decoded from a large message from
// keeping the whole message alive.
func (c *Counters) intern(r string) uint32 {
	if id, ok := c.ids[r]; ok {
		return id
	}
	if c.ids == nil {
		c.ids = make(map[string]uint32)
	}
	id := uint32(len(c.names))
	r = strings.Clone(r)
	c.names = append(c.names, r)
	c.ids[r] = id
	return id
}

// KeyHash is a key as one Counters or Local hashes it. Made once with Key,
// it spares hashing the key again for every window looked up (a check reads
// the current, the previous and the next window); it is valid only with the
// Counters or Local that made it.
type KeyHash uint64

// Key returns key's KeyHash for c.
func (c *Counters) Key(key string) KeyHash { return KeyHash(c.hash.string(key)) }

// lookup returns the counts of the key hashed h in window and their window,
// or nil.
func (c *Counters) lookup(h KeyHash, window int64) (*counts, *window[counts]) {
	wt := c.windows.get(window)
	if wt == nil {
		return nil, nil
	}
	i := wt.find(uint64(h))
	if i < 0 {
		return nil, nil
	}
	return &wt.table.slots[i].v, wt
}

// Total returns the sum of the counts for (key, window) over the replicas
// that in accepts; a nil in accepts every replica. The sum saturates at
// math.MaxUint64 instead of wrapping. It allocates nothing and costs one call
// of in per replica that has counted the key in the window.
func (c *Counters) Total(key string, window int64, in func(replica string) bool) uint64 {
	return c.TotalOf(c.Key(key), window, in)
}

// TotalOf is Total of the key hashed k.
func (c *Counters) TotalOf(k KeyHash, window int64, in func(replica string) bool) uint64 {
	e, wt := c.lookup(k, window)
	if e == nil {
		return 0
	}
	var sum uint64
	if in == nil || in(c.names[e.rep]) {
		sum = e.n
	}
	for j := e.more; j != 0; j = wt.nodes[j-1].next {
		if m := &wt.nodes[j-1]; in == nil || in(c.names[m.rep]) {
			sum = addSat(sum, m.n)
		}
	}
	return sum
}

// Each calls f with every replica's count for (key, window) that in accepts
// (nil accepts every replica). It allocates nothing.
func (c *Counters) Each(key string, window int64, in func(replica string) bool, f func(replica string, n uint64)) {
	c.EachOf(c.Key(key), window, in, f)
}

// EachOf is Each of the key hashed k.
func (c *Counters) EachOf(k KeyHash, window int64, in func(replica string) bool, f func(replica string, n uint64)) {
	e, wt := c.lookup(k, window)
	if e == nil {
		return
	}
	if name := c.names[e.rep]; in == nil || in(name) {
		f(name, e.n)
	}
	for j := e.more; j != 0; j = wt.nodes[j-1].next {
		m := &wt.nodes[j-1]
		if name := c.names[m.rep]; in == nil || in(name) {
			f(name, m.n)
		}
	}
}

// Replica returns the count of one replica for (key, window), zero if c has
// none.
func (c *Counters) Replica(key string, window int64, replica string) uint64 {
	rep, ok := c.ids[replica]
	if !ok {
		return 0
	}
	e, wt := c.lookup(c.Key(key), window)
	switch {
	case e == nil:
		return 0
	case e.rep == rep:
		return e.n
	}
	for j := e.more; j != 0; j = wt.nodes[j-1].next {
		if m := &wt.nodes[j-1]; m.rep == rep {
			return m.n
		}
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
	dropped, _ = c.windows.dropBefore(c.floor)
	c.n -= dropped
	if c.n == 0 {
		// No slot refers to a replica index any more: forget the names, so
		// that a churn of replica names is collected.
		c.names, c.ids = nil, nil
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
	// rank[id] orders the replica names, so that a key's counts sort by a
	// small integer rather than by name.
	byName := make([]uint32, len(c.names))
	for id := range byName {
		byName[id] = uint32(id)
	}
	slices.SortFunc(byName, func(a, b uint32) int { return strings.Compare(c.names[a], c.names[b]) })
	rank := make([]uint32, len(c.names))
	for r, id := range byName {
		rank[id] = uint32(r)
	}
	var (
		idx []int
		cs  []repCount
	)
	for _, wt := range c.windows { // sorted by window
		idx = wt.occupied(idx[:0])
		slices.SortFunc(idx, func(a, b int) int { return strings.Compare(wt.keys[a], wt.keys[b]) })
		for _, i := range idx {
			k, e := wt.keys[i], &wt.table.slots[i].v
			cs = append(cs[:0], repCount{rep: e.rep, n: e.n})
			for j := e.more; j != 0; j = wt.nodes[j-1].next {
				cs = append(cs, repCount{rep: wt.nodes[j-1].rep, n: wt.nodes[j-1].n})
			}
			// Insertion sort: a key has a few replicas at most.
			for j := 1; j < len(cs); j++ {
				for m := j; m > 0 && rank[cs[m].rep] < rank[cs[m-1].rep]; m-- {
					cs[m], cs[m-1] = cs[m-1], cs[m]
				}
			}
			for _, x := range cs {
				out = append(out, Slot{Key: k, Window: wt.start, Replica: c.names[x.rep], Count: x.n})
			}
		}
	}
	return out
}

// Len returns the number of slots c holds (non-zero counts over all keys,
// windows and replicas).
func (c *Counters) Len() int { return c.n }
