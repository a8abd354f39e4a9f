package quota

import (
	"hash/maphash"
	"math/bits"
)

// table is an immutable-once-built, open-addressed hash table from API key to
// quota, probed linearly. It exists so that the check path's lookup hashes
// the key once (the caller passes the hash, shared by every table of one
// Index) and costs as few cache misses as it can: a slot holds the full
// 64-bit hash, compared first, and the key's string header, so that the key
// bytes and the quota are both addressed from the slot and their loads
// overlap, rather than the key being reached through the quota (three misses
// in a row for a key that is not in the caches). A slot with a nil quota is
// empty; nothing is ever removed (a deletion is a new table, or a tombstone
// in a delta). Its size is not a power of two — a hash picks its slot by
// multiplication (Lemire's fast range) — so that it takes about 4/3 of a slot
// per key, not up to 8/3.
//
// The zero table is empty. Lookups are safe for concurrent use once the
// table is published; put and add must not race anything.
type table struct {
	slots []slot
	n     int
}

type slot struct {
	hash uint64
	key  string // q.APIKey, the same bytes (a tombstone has none)
	q    *Quota
}

// newTable returns an empty table sized for n keys: at most three quarters
// full, so that a probe sequence stays short.
func newTable(n int) table {
	return table{slots: make([]slot, max(8, n+n/3+1))}
}

// home is the first slot probed for hash h.
func (t *table) home(h uint64) int {
	hi, _ := bits.Mul64(h, uint64(len(t.slots)))
	return int(hi)
}

// find returns the quota held for key, whose hash is h, and whether there is
// one.
func (t *table) find(h uint64, key string) (*Quota, bool) { return findIn(t, h, key) }

// findBytes is find of a key held as bytes; it does not allocate.
func (t *table) findBytes(h uint64, key []byte) (*Quota, bool) { return findIn(t, h, key) }

// findIn is find for a key held as a string or as bytes: comparing
// string(key) with a string does not allocate.
func findIn[K string | []byte](t *table, h uint64, key K) (*Quota, bool) {
	if t.n == 0 {
		return nil, false
	}
	for i := t.home(h); ; {
		s := &t.slots[i]
		if s.q == nil {
			return nil, false
		}
		if s.hash == h && s.key == string(key) {
			return s.q, true
		}
		if i++; i == len(t.slots) {
			i = 0
		}
	}
}

// add is put of a key not in t, making t bigger first when it would be more
// than three quarters full.
func (t *table) add(h uint64, q *Quota) {
	if (t.n+1)*4 > len(t.slots)*3 {
		bigger := newTable(2 * (t.n + 1))
		t.each(bigger.put)
		*t = bigger
	}
	t.put(h, q.APIKey, q)
}

// put inserts q (q.APIKey, or the tombstone) under key, whose hash is h,
// replacing the quota of the same key. It requires a table made by newTable
// for at least t.n+1 keys.
func (t *table) put(h uint64, key string, q *Quota) {
	for i := t.home(h); ; {
		s := &t.slots[i]
		if s.q == nil {
			s.hash, s.key, s.q = h, key, q
			t.n++
			return
		}
		if s.hash == h && s.key == key {
			s.key, s.q = key, q
			return
		}
		if i++; i == len(t.slots) {
			i = 0
		}
	}
}

// each calls fn with every key held and its quota, in slot order.
func (t *table) each(fn func(h uint64, key string, q *Quota)) {
	for i := range t.slots {
		if s := &t.slots[i]; s.q != nil {
			fn(s.hash, s.key, s.q)
		}
	}
}

// tombstone is the quota of a key deleted, in an Index's delta.
var tombstone = &Quota{}

// hashKey is the hash of key under seed; one Index uses one seed for all its
// tables. maphash.Bytes of the same bytes gives the same hash.
func hashKey(seed maphash.Seed, key string) uint64 { return maphash.String(seed, key) }
