package quota

import (
	"hash/maphash"
	"sync/atomic"
)

// Index holds every API key's quota in memory for the check path: a
// versioned, immutable snapshot swapped atomically. A snapshot is a large
// base table plus a small delta of the keys changed since the base was built
// (the tombstone marks a deleted key), so that a change copies the delta, not a
// million keys; once the delta grows past an eighth of the base it is folded
// into a new base. Both are open-addressed tables (table.go) under one hash
// seed, so a lookup hashes the key once however many tables it probes.
//
// The zero Index is empty and ready. Lookups are safe for concurrent use
// with each other and with one writer (Replace, Apply, Compact); writers
// must not race each other (the Syncer is the one writer).
type Index struct {
	cur atomic.Pointer[snapshot]
}

type snapshot struct {
	seed    maphash.Seed
	base    table // no tombstones
	delta   table // changes since base; a tombstone is a deleted key
	version int64
}

// QuotaAt returns key's quota when it is in force at now (Unix ns), else
// nil. It does not allocate.
func (x *Index) QuotaAt(now int64, key string) *Quota {
	s := x.cur.Load()
	if s == nil {
		return nil
	}
	h := hashKey(s.seed, key)
	q, ok := s.delta.find(h, key)
	if !ok {
		q, _ = s.base.find(h, key)
	}
	if q == nil || q == tombstone || !q.InForceAt(now) {
		return nil
	}
	return q
}

// Get returns key's quota whether or not it is in force, or nil.
func (x *Index) Get(key string) *Quota {
	s := x.cur.Load()
	if s == nil {
		return nil
	}
	h := hashKey(s.seed, key)
	q, ok := s.delta.find(h, key)
	if !ok {
		q, _ = s.base.find(h, key)
	}
	if q == nil || q == tombstone {
		return nil
	}
	return q
}

// Version is the version of the snapshot in force (0 when empty).
func (x *Index) Version() int64 {
	if s := x.cur.Load(); s != nil {
		return s.version
	}
	return 0
}

// Len is the number of keys with a quota.
func (x *Index) Len() int {
	s := x.cur.Load()
	if s == nil {
		return 0
	}
	n := s.base.n
	s.delta.each(func(h uint64, key string, q *Quota) {
		_, inBase := s.base.find(h, key)
		switch {
		case q == tombstone && inBase:
			n--
		case q != tombstone && !inBase:
			n++
		}
	})
	return n
}

// All returns every quota, in no particular order.
func (x *Index) All() []*Quota {
	s := x.cur.Load()
	if s == nil {
		return nil
	}
	out := make([]*Quota, 0, s.base.n+s.delta.n)
	s.base.each(func(h uint64, key string, q *Quota) {
		if _, changed := s.delta.find(h, key); !changed {
			out = append(out, q)
		}
	})
	s.delta.each(func(_ uint64, _ string, q *Quota) {
		if q != tombstone {
			out = append(out, q)
		}
	})
	return out
}

// Replace makes all, at version, the whole snapshot. The table is sized
// once, for len(all) keys; a key given twice keeps its last quota.
func (x *Index) Replace(all []*Quota, version int64) {
	s := &snapshot{seed: x.seed(), base: newTable(len(all)), version: version}
	for _, q := range all {
		s.base.put(hashKey(s.seed, q.APIKey), q.APIKey, q)
	}
	x.cur.Store(s)
}

// replaceTable makes t, built under seed (x.seed()), the whole snapshot at
// version.
func (x *Index) replaceTable(seed maphash.Seed, t table, version int64) {
	x.cur.Store(&snapshot{seed: seed, base: t, version: version})
}

// seed is the hash seed of x's tables: the one in force, or a new one for
// x's first snapshot.
func (x *Index) seed() maphash.Seed {
	if s := x.cur.Load(); s != nil {
		return s.seed
	}
	return maphash.MakeSeed()
}

// Apply makes changes, which bring the snapshot to version, visible.
func (x *Index) Apply(changes []Change, version int64) {
	old := x.cur.Load()
	if old == nil {
		old = &snapshot{seed: maphash.MakeSeed()}
	}
	delta := newTable(old.delta.n + len(changes))
	old.delta.each(delta.put)
	for _, c := range changes {
		q := c.Quota
		if q == nil {
			q = tombstone
		}
		delta.put(hashKey(old.seed, c.APIKey), c.APIKey, q)
	}
	next := &snapshot{seed: old.seed, base: old.base, delta: delta, version: max(version, old.version)}
	if delta.n > max(1024, old.base.n/8) {
		next.base, next.delta = folded(&old.base, &delta), table{}
	}
	x.cur.Store(next)
}

// folded returns a new base: base with delta's changes made.
func folded(base, delta *table) table {
	out := newTable(base.n + delta.n)
	base.each(func(h uint64, key string, q *Quota) {
		if _, changed := delta.find(h, key); !changed {
			out.put(h, key, q)
		}
	})
	delta.each(func(h uint64, key string, q *Quota) {
		if q != tombstone {
			out.put(h, key, q)
		}
	})
	return out
}

// Compact folds the delta into a new base, so that a lookup probes one table
// again. It copies the base (O(keys)): the Syncer calls it once changes have
// been quiet for a while, not on every change.
func (x *Index) Compact() {
	old := x.cur.Load()
	if old == nil || old.delta.n == 0 {
		return
	}
	x.cur.Store(&snapshot{seed: old.seed, base: folded(&old.base, &old.delta), version: old.version})
}

// Pending is the number of keys in the delta (changed since the base).
func (x *Index) Pending() int {
	if s := x.cur.Load(); s != nil {
		return s.delta.n
	}
	return 0
}
