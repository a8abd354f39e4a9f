package crdt

import (
	"hash/maphash"
	"math/bits"
)

// table is the keys of one window: an open-addressing hash table with linear
// probing whose slots hold the value inline. A lookup touches one slot,
// usually one cache line, where a Go map would also chase the key's bytes
// and, for Counters, the backing array of the counts: with half a million keys
// per window that is the difference between one cache miss per lookup and
// three or four.
//
// Slots are found by the key's 64-bit hash alone; the key itself is kept
// beside the slots only to name the key in Slots and Delta (it is never
// compared on the hot path). Two keys whose hashes collide would share one
// count: with a seeded 64-bit hash and a million keys, the chance that any
// two collide is about n²/2⁶⁵ ≈ 3·10⁻⁸. The seed is random per Counters or
// Local, so a client cannot choose keys that collide or that pile up on one
// probe chain.
//
// A hash's home slot is taken from its top bits rather than its bottom ones,
// so that hashes in increasing order have home slots in increasing order
// whatever the table's size: a large batch joined in hash order then sweeps
// the table from one end to the other (see Counters.Join).
//
// Nothing is ever deleted from a table: Counters and Local only drop whole
// windows, that is whole tables, so there are no tombstones to manage.
type table[V any] struct {
	slots []entry[V]
	keys  []string // keys[i] names slots[i]
	n     int      // occupied slots
	mask  uint64
	shift uint // a hash's home slot is its top bits: h >> shift
}

type entry[V any] struct {
	hash uint64 // 0 marks an empty slot; real hashes are never 0
	v    V
}

const minTableSize = 16

// find returns the index of the slot holding h, or -1. h must not be 0.
func (t *table[V]) find(h uint64) int {
	if t.n == 0 {
		return -1
	}
	for i := h >> t.shift; ; i = (i + 1) & t.mask {
		switch t.slots[i].hash {
		case h:
			return int(i)
		case 0:
			return -1
		}
	}
}

// insert adds h (absent) named key with a zero value, growing the table to
// keep it at most half full, and returns its slot. Indexes returned before
// are invalid after an insert.
//
// Half, not the three quarters of pop/store's table: here the common lookup
// is of a key the table does not hold yet (a key's first count in a new
// window), and linear probing's expected probes for an absent key grow as
// 1/(1−load)²: 2.5 slots at one half, 8.5 at three quarters.
func (t *table[V]) insert(h uint64, key string) int {
	if 2*(t.n+1) > len(t.slots) {
		t.grow()
	}
	i := h >> t.shift
	for t.slots[i].hash != 0 {
		i = (i + 1) & t.mask
	}
	t.slots[i].hash = h
	t.keys[i] = key
	t.n++
	return int(i)
}

// occupied appends the indexes of the occupied slots to dst.
func (t *table[V]) occupied(dst []int) []int {
	for i := range t.slots {
		if t.slots[i].hash != 0 {
			dst = append(dst, i)
		}
	}
	return dst
}

func (t *table[V]) grow() { t.resize(max(2*len(t.slots), minTableSize)) }

// reserve sizes an empty table to hold n keys without growing.
func (t *table[V]) reserve(n int) {
	size := minTableSize
	for size < 2*n {
		size *= 2
	}
	if size > len(t.slots) {
		t.resize(size)
	}
}

// resize moves the table's keys into size slots, a power of two.
func (t *table[V]) resize(size int) {
	old, oldKeys := t.slots, t.keys
	t.slots, t.keys, t.mask = make([]entry[V], size), make([]string, size), uint64(size-1)
	t.shift = uint(64 - bits.TrailingZeros(uint(size)))
	for j := range old {
		if h := old[j].hash; h != 0 {
			i := h >> t.shift
			for t.slots[i].hash != 0 {
				i = (i + 1) & t.mask
			}
			t.slots[i], t.keys[i] = old[j], oldKeys[j]
		}
	}
}

// window is one window's table. count is free for the owner to count with
// (Counters counts its (key, replica) slots there), and nodes holds
// Counters' counts of further replicas, dropped with the window.
type window[V any] struct {
	start int64
	count int
	nodes []repNode
	table[V]
}

// windows is an owner's tables sorted by window start. There are usually two
// or three (the current and previous window, perhaps the next), so finding
// one costs a few comparisons in memory that stays in cache.
type windows[V any] []*window[V]

// get returns the table of window w, or nil.
func (ws windows[V]) get(w int64) *window[V] {
	lo, hi := 0, len(ws)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		switch s := ws[m].start; {
		case s == w:
			return ws[m]
		case s < w:
			lo = m + 1
		default:
			hi = m
		}
	}
	return nil
}

// open returns the table of window w, creating it if needed. A new window
// is sized for as many keys as the largest window held: the keys counted in
// one window are mostly those of the next, and a table grown from empty by
// doubling would move every key about twice, each move a cache miss.
func (ws *windows[V]) open(w int64) *window[V] {
	if t := ws.get(w); t != nil {
		return t
	}
	t := &window[V]{start: w}
	hint := 0
	for _, o := range *ws {
		hint = max(hint, o.n)
	}
	t.reserve(hint)
	i := len(*ws)
	for i > 0 && (*ws)[i-1].start > w {
		i--
	}
	*ws = append(*ws, nil)
	copy((*ws)[i+1:], (*ws)[i:])
	(*ws)[i] = t
	return t
}

// dropBefore removes the tables of windows before floor and returns the
// removed tables' slot counts and entry counts.
func (ws *windows[V]) dropBefore(floor int64) (slots, entries int) {
	i := 0
	for i < len(*ws) && (*ws)[i].start < floor {
		slots += (*ws)[i].count
		entries += (*ws)[i].n
		i++
	}
	if i > 0 {
		n := copy(*ws, (*ws)[i:])
		clear((*ws)[n:]) // let the dropped tables be collected
		*ws = (*ws)[:n]
	}
	return slots, entries
}

// hasher hashes keys with a seed made on first use, so that the zero value
// of its owner works. maphash.String and maphash.Bytes agree for equal
// content, so a key held in bytes hashes without being converted.
type hasher struct{ seed maphash.Seed }

func (h *hasher) init() {
	if h.seed == (maphash.Seed{}) {
		h.seed = maphash.MakeSeed()
	}
}

// string returns the non-zero hash of key.
func (h *hasher) string(key string) uint64 {
	h.init()
	return nonZero(maphash.String(h.seed, key))
}

// bytes returns the non-zero hash of key, equal to string's for equal content.
func (h *hasher) bytes(key []byte) uint64 {
	h.init()
	return nonZero(maphash.Bytes(h.seed, key))
}

// nonZero maps the hash 0, which marks an empty slot, to 1. It makes 1 twice
// as likely as any other hash, which does not matter.
func nonZero(h uint64) uint64 {
	if h == 0 {
		return 1
	}
	return h
}
