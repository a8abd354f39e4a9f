package quota

import "hash/maphash"

// table is an immutable-once-built, open-addressed hash table from API key to
// quota: a power-of-two array of slots probed linearly. It exists so that the
// check path's lookup hashes the key once (the caller passes the hash, shared
// by every table of one Index) and touches one slot per probe — the full
// 64-bit hash is compared before the key, so a probe past another key almost
// never reads that key's bytes. A slot with a nil quota is empty; nothing is
// ever removed (a deletion is a new table, or a tombstone in a delta).
//
// The zero table is empty. Lookups are safe for concurrent use once the
// table is published; put must not race anything.
type table struct {
	slots []slot
	mask  uint64
	n     int
}

type slot struct {
	hash uint64
	q    *Quota
}

// newTable returns an empty table sized for n keys: at most three quarters
// full, so that a probe sequence stays short.
func newTable(n int) table {
	size := 8
	for size*3 < n*4 {
		size *= 2
	}
	return table{slots: make([]slot, size), mask: uint64(size - 1)}
}

// find returns the quota held for key, whose hash is h, and whether there is
// one.
func (t *table) find(h uint64, key string) (*Quota, bool) {
	if t.n == 0 {
		return nil, false
	}
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.q == nil {
			return nil, false
		}
		if s.hash == h && s.q.APIKey == key {
			return s.q, true
		}
	}
}

// findBytes is find of a key held as bytes; it does not allocate.
func (t *table) findBytes(h uint64, key []byte) (*Quota, bool) {
	if t.n == 0 {
		return nil, false
	}
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.q == nil {
			return nil, false
		}
		if s.hash == h && s.q.APIKey == string(key) {
			return s.q, true
		}
	}
}

// add is put of a key not in t, doubling t first when it would be more
// than three quarters full.
func (t *table) add(h uint64, q *Quota) {
	if (t.n+1)*4 > len(t.slots)*3 {
		bigger := table{slots: make([]slot, 2*len(t.slots)), mask: uint64(2*len(t.slots) - 1)}
		t.each(bigger.put)
		*t = bigger
	}
	t.put(h, q)
}

// put inserts q under its key, whose hash is h, replacing the quota of the
// same key. It requires a table made by newTable for at least t.n+1 keys.
func (t *table) put(h uint64, q *Quota) {
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.q == nil {
			s.hash, s.q = h, q
			t.n++
			return
		}
		if s.hash == h && s.q.APIKey == q.APIKey {
			s.q = q
			return
		}
	}
}

// each calls fn with every quota held, in slot order.
func (t *table) each(fn func(h uint64, q *Quota)) {
	for i := range t.slots {
		if s := &t.slots[i]; s.q != nil {
			fn(s.hash, s.q)
		}
	}
}

// hashKey is the hash of key under seed; one Index uses one seed for all its
// tables. maphash.Bytes of the same bytes gives the same hash.
func hashKey(seed maphash.Seed, key string) uint64 { return maphash.String(seed, key) }
