package quota

import "sync/atomic"

// Index holds every API key's quota in memory for the check path: a
// versioned, immutable snapshot swapped atomically. A snapshot is a large
// base map plus a small delta of the keys changed since the base was built
// (a nil quota marks a deleted key), so that a change copies the delta, not a
// million keys; once the delta grows past an eighth of the base it is folded
// into a new base.
//
// The zero Index is empty and ready. Lookups are safe for concurrent use
// with each other and with one writer (Replace, Apply); writers must not
// race each other (the Syncer is the one writer).
type Index struct {
	cur atomic.Pointer[snapshot]
}

type snapshot struct {
	base    map[string]*Quota
	delta   map[string]*Quota
	version int64
}

// QuotaAt returns key's quota when it is in force at now (Unix ns), else
// nil. It does not allocate.
func (x *Index) QuotaAt(now int64, key string) *Quota {
	s := x.cur.Load()
	if s == nil {
		return nil
	}
	var q *Quota
	ok := false
	if len(s.delta) > 0 {
		q, ok = s.delta[key]
	}
	if !ok {
		q = s.base[key]
	}
	if q == nil || !q.InForceAt(now) {
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
	if q, ok := s.delta[key]; ok {
		return q
	}
	return s.base[key]
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
	n := len(s.base)
	for k, q := range s.delta {
		_, inBase := s.base[k]
		switch {
		case q == nil && inBase:
			n--
		case q != nil && !inBase:
			n++
		}
	}
	return n
}

// All returns every quota, in no particular order.
func (x *Index) All() []*Quota {
	s := x.cur.Load()
	if s == nil {
		return nil
	}
	out := make([]*Quota, 0, len(s.base)+len(s.delta))
	for k, q := range s.base {
		if _, changed := s.delta[k]; !changed {
			out = append(out, q)
		}
	}
	for _, q := range s.delta {
		if q != nil {
			out = append(out, q)
		}
	}
	return out
}

// Replace makes all, at version, the whole snapshot.
func (x *Index) Replace(all []*Quota, version int64) {
	base := make(map[string]*Quota, len(all))
	for _, q := range all {
		base[q.APIKey] = q.Prepare()
	}
	x.cur.Store(&snapshot{base: base, version: version})
}

// Apply makes changes, which bring the snapshot to version, visible.
func (x *Index) Apply(changes []Change, version int64) {
	old := x.cur.Load()
	if old == nil {
		old = &snapshot{}
	}
	next := &snapshot{base: old.base, version: max(version, old.version)}
	if len(old.delta)+len(changes) > max(1024, len(old.base)/8) {
		base := make(map[string]*Quota, len(old.base)+len(old.delta)+len(changes))
		for k, q := range old.base {
			base[k] = q
		}
		fold(base, old.delta)
		for _, c := range changes {
			fold(base, map[string]*Quota{c.APIKey: prepared(c.Quota)})
		}
		next.base = base
	} else {
		delta := make(map[string]*Quota, len(old.delta)+len(changes))
		for k, q := range old.delta {
			delta[k] = q
		}
		for _, c := range changes {
			delta[c.APIKey] = prepared(c.Quota)
		}
		next.delta = delta
	}
	x.cur.Store(next)
}

func prepared(q *Quota) *Quota {
	if q == nil {
		return nil
	}
	return q.Prepare()
}

// fold writes delta into base: a nil quota deletes.
func fold(base, delta map[string]*Quota) {
	for k, q := range delta {
		if q == nil {
			delete(base, k)
		} else {
			base[k] = q
		}
	}
}

// Compact folds the delta into a new base, so that a lookup is one map
// probe again. It copies the base (O(keys)): the Syncer calls it once
// changes have been quiet for a while, not on every change.
func (x *Index) Compact() {
	old := x.cur.Load()
	if old == nil || len(old.delta) == 0 {
		return
	}
	base := make(map[string]*Quota, len(old.base)+len(old.delta))
	for k, q := range old.base {
		base[k] = q
	}
	fold(base, old.delta)
	x.cur.Store(&snapshot{base: base, version: old.version})
}

// Pending is the number of keys in the delta (changed since the base).
func (x *Index) Pending() int {
	if s := x.cur.Load(); s != nil {
		return len(s.delta)
	}
	return 0
}
