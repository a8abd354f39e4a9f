package store

import "github.com/edgelimit/edgelimit/pop/limit"

// table is one shard's keys: an open-addressing hash table with linear probing
// and backward-shift deletion (no tombstones), whose slots hold the state
// inline. A lookup touches one slot, usually one cache line, where Go's map
// would also chase the key's bytes and a pointer to the state: with a million
// keys that is the difference between one cache miss per check and three.
//
// Slots are found by the key's 64-bit hash alone; the key's bytes are kept
// beside the slots only to name the key (they are never compared on the hot
// path). Two keys whose hashes collide would share one state: with the
// store's seeded 64-bit hash and a million active keys, the chance that any
// two collide is about n²/2⁶⁵ ≈ 3·10⁻⁸.
//
// A table is not safe for concurrent use; its shard's mutex guards it.
type table struct {
	slots []slot
	keys  []string // keys[i] names slots[i]
	n     int
	mask  uint64
	rng   uint64 // xorshift state for eviction samples
}

type slot struct {
	hash   uint64 // 0 marks an empty slot; real hashes are never 0
	idleAt int64
	st     limit.State
}

const minTableSize = 16

// find returns the index of the slot holding h, or -1. h must not be 0.
func (t *table) find(h uint64) int {
	if t.slots == nil {
		return -1
	}
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		switch t.slots[i].hash {
		case h:
			return int(i)
		case 0:
			return -1
		}
	}
}

// insert adds h (absent) with a fresh state, growing the table to keep it at
// most three quarters full, and returns its slot.
func (t *table) insert(h uint64, key []byte) int {
	if 4*(t.n+1) > 3*len(t.slots) {
		t.grow()
	}
	i := h & t.mask
	for t.slots[i].hash != 0 {
		i = (i + 1) & t.mask
	}
	t.slots[i] = slot{hash: h}
	t.keys[i] = string(key)
	t.n++
	return int(i)
}

func (t *table) grow() {
	old, oldKeys := t.slots, t.keys
	size := max(2*len(old), minTableSize)
	t.slots, t.keys, t.mask = make([]slot, size), make([]string, size), uint64(size-1)
	for j := range old {
		if h := old[j].hash; h != 0 {
			i := h & t.mask
			for t.slots[i].hash != 0 {
				i = (i + 1) & t.mask
			}
			t.slots[i], t.keys[i] = old[j], oldKeys[j]
		}
	}
}

// remove deletes the slot at i and shifts later members of its probe run
// back, so that every lookup still finds them.
func (t *table) remove(i uint64) {
	for {
		t.slots[i], t.keys[i] = slot{}, ""
		j := i
		for {
			j = (j + 1) & t.mask
			h := t.slots[j].hash
			if h == 0 {
				t.n--
				return
			}
			// Move j into the hole at i unless j's home lies cyclically in (i, j].
			home := h & t.mask
			if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
				t.slots[i], t.keys[i] = t.slots[j], t.keys[j]
				i = j
				break
			}
		}
	}
}

// sample returns up to k occupied slot indexes starting at a random slot.
func (t *table) sample(k int, dst []int) []int {
	t.rng ^= t.rng << 13
	t.rng ^= t.rng >> 7
	t.rng ^= t.rng << 17
	start := t.rng & t.mask
	for n := uint64(0); n <= t.mask && len(dst) < k; n++ {
		i := (start + n) & t.mask
		if t.slots[i].hash != 0 {
			dst = append(dst, int(i))
		}
	}
	return dst
}
