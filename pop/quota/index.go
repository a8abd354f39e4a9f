package quota

import (
	"hash/maphash"
	"iter"
	"strings"
	"sync/atomic"
	"unsafe"
)

// Index holds every API key's quota in memory for the check path: a
// versioned, immutable snapshot swapped atomically. A snapshot is a large
// base table plus a small delta of the keys changed since the base was built
// (a tombstone marks a deleted key), so that a change copies the delta, not a
// million keys; once the delta grows past an eighth of the base it is folded
// into a new base. Both are open-addressed tables (table.go) under one hash
// seed, so a lookup hashes the key once however many tables it probes.
//
// The tables hold no pointers; a key's tier and overrides are a Plan shared
// by every key with the same ones (plans), so that the garbage collector
// marks a few objects per distinct plan, not several per key. A workload
// where every key has overrides of its own has as many plans as keys, and
// costs the collector about what it did before plans were shared.
//
// The zero Index is empty and ready. Lookups are safe for concurrent use
// with each other and with one writer (Replace, Apply, Compact); writers
// must not race each other (the Syncer is the one writer).
type Index struct {
	cur atomic.Pointer[snapshot]
	// plans is the writer's: those of cur and any added since, of which
	// cur.plans is a prefix (an append never writes where a reader of an
	// older snapshot looks).
	plans plans
}

type snapshot struct {
	seed    maphash.Seed
	base    table // no tombstones
	delta   table // changes since base; tombstonePlan marks a deleted key
	plans   []*Plan
	version int64
}

// QuotaAt returns the plan of key's quota when it is in force at now (Unix
// ns), else nil. It does not allocate.
func (x *Index) QuotaAt(now int64, key string) *Plan {
	s := x.cur.Load()
	if s == nil {
		return nil
	}
	t, sl := s.lookup(key)
	if sl == nil || sl.plan == tombstonePlan {
		return nil
	}
	if !t.inForce(sl, now) {
		return nil
	}
	return s.plans[sl.plan]
}

// lookup returns the slot of key and its table (nil when there is none).
func (s *snapshot) lookup(key string) (*table, *slot) {
	h := hashKey(s.seed, key)
	if sl := s.delta.find(h, key); sl != nil {
		return &s.delta, sl
	}
	return &s.base, s.base.find(h, key)
}

// Get returns a copy of key's quota whether or not it is in force, or nil.
func (x *Index) Get(key string) *Quota {
	s := x.cur.Load()
	if s == nil {
		return nil
	}
	t, sl := s.lookup(key)
	if sl == nil || sl.plan == tombstonePlan {
		return nil
	}
	var q Quota
	s.fill(&q, t, sl)
	return copyOf(&q)
}

// fill sets q to the quota of slot sl of t, sharing what s holds: q.APIKey
// is the record's bytes (a published table's records are never written
// again, so the string is as immutable as any) and q.Overrides the plan's
// own (read-only, capped so that an append copies). Writing a snapshot file
// of a million keys so makes no garbage; copyOf makes a quota to hand out.
func (s *snapshot) fill(q *Quota, t *table, sl *slot) {
	p := s.plans[sl.plan]
	key := t.key(sl.rec)
	q.APIKey, q.Tier, q.Overrides = unsafe.String(unsafe.SliceData(key), len(key)), p.Tier, p.Overrides[:len(p.Overrides):len(p.Overrides)]
	q.EffectiveAt, q.ExpiresAt = t.times(sl.rec)
	q.UpdatedAt = t.updated(sl.rec)
}

// each calls fn with the slot of every key with a quota, and its table.
func (s *snapshot) each(fn func(t *table, sl *slot)) {
	s.base.each(func(sl *slot) {
		if s.delta.findBytes(sl.hash, s.base.key(sl.rec)) == nil {
			fn(&s.base, sl)
		}
	})
	s.delta.each(func(sl *slot) {
		if sl.plan != tombstonePlan {
			fn(&s.delta, sl)
		}
	})
}

// quotas yields every quota of s into one Quota value, overwritten by the
// next: for a reader that copies what it keeps (the snapshot file's
// encoder), a million keys are read without a million allocations.
func (s *snapshot) quotas() iter.Seq[*Quota] {
	return func(yield func(*Quota) bool) {
		var q Quota
		stop := false
		s.each(func(t *table, sl *slot) {
			if !stop {
				s.fill(&q, t, sl)
				stop = !yield(&q)
			}
		})
	}
}

// len is the number of keys with a quota.
func (s *snapshot) len() int {
	n := s.base.n
	s.delta.each(func(sl *slot) {
		inBase := s.base.findBytes(sl.hash, s.delta.key(sl.rec)) != nil
		switch {
		case sl.plan == tombstonePlan && inBase:
			n--
		case sl.plan != tombstonePlan && !inBase:
			n++
		}
	})
	return n
}

// all returns a copy of every quota, in no particular order.
func (s *snapshot) all() []*Quota {
	out := make([]*Quota, 0, s.base.n+s.delta.n)
	for q := range s.quotas() {
		out = append(out, copyOf(q))
	}
	return out
}

// copyOf returns a copy of q, filled from a snapshot, that shares nothing
// with it.
func copyOf(q *Quota) *Quota {
	c := q.Clone()
	c.APIKey = strings.Clone(q.APIKey)
	return c
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
	if s := x.cur.Load(); s != nil {
		return s.len()
	}
	return 0
}

// All returns a copy of every quota, in no particular order.
func (x *Index) All() []*Quota {
	if s := x.cur.Load(); s != nil {
		return s.all()
	}
	return nil
}

// view returns the snapshot in force, immutable (nil when empty).
func (x *Index) view() *snapshot { return x.cur.Load() }

// Replace makes all, at version, the whole snapshot. The table is sized
// once, for len(all) keys; a key given twice keeps its last quota.
func (x *Index) Replace(all []*Quota, version int64) {
	keyBytes := 0
	for _, q := range all {
		keyBytes += len(q.APIKey)
	}
	b := x.builder(len(all), keyBytes)
	for _, q := range all {
		b.add(q)
	}
	x.replaceTable(b.seed, b.t, b.ps, version)
}

// builder builds a table and its plans for x, under x's seed.
type builder struct {
	seed maphash.Seed
	t    table
	ps   plans
}

// builder returns a builder sized for n keys of keyBytes bytes in all.
func (x *Index) builder(n, keyBytes int) *builder {
	return &builder{seed: x.seed(), t: newTable(n, keyBytes)}
}

// add puts a copy of q in b; a key added twice keeps its last quota.
func (b *builder) add(q *Quota) {
	set(&b.t, hashKey(b.seed, q.APIKey), q.APIKey, q, b.ps.id(q.Tier, q.Overrides))
}

// replaceTable makes t, built under seed (x.seed()) with the plans ps, the
// whole snapshot at version.
func (x *Index) replaceTable(seed maphash.Seed, t table, ps plans, version int64) {
	x.plans = ps
	x.cur.Store(&snapshot{seed: seed, base: t, plans: ps.list, version: version})
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
	keyBytes := len(old.delta.recs)
	for _, c := range changes {
		keyBytes += len(c.APIKey)
	}
	delta := newTable(old.delta.n+len(changes), keyBytes)
	old.delta.each(func(sl *slot) { delta.copyFrom(&old.delta, sl, sl.plan) })
	for _, c := range changes {
		plan := tombstonePlan
		if c.Quota != nil {
			plan = x.plans.id(c.Quota.Tier, c.Quota.Overrides)
		}
		set(&delta, hashKey(old.seed, c.APIKey), c.APIKey, c.Quota, plan)
	}
	next := &snapshot{seed: old.seed, base: old.base, delta: delta, plans: x.plans.list, version: max(version, old.version)}
	if delta.n > max(1024, old.base.n/8) {
		next = x.folded(next)
	}
	x.cur.Store(next)
}

// folded returns s with its delta folded into a new base, and x's plans
// made anew from the plans the keys still have: plans no key has any more
// are dropped (each keeps its memo).
func (x *Index) folded(s *snapshot) *snapshot {
	var ps plans
	remap := make([]uint32, len(s.plans)) // an old plan's new id, plus 1
	out := newTable(s.base.n+s.delta.n, len(s.base.recs)+len(s.delta.recs))
	s.each(func(t *table, sl *slot) {
		if remap[sl.plan] == 0 {
			remap[sl.plan] = ps.adopt(s.plans[sl.plan]) + 1
		}
		out.copyFrom(t, sl, remap[sl.plan]-1)
	})
	x.plans = ps
	return &snapshot{seed: s.seed, base: out, plans: ps.list, version: s.version}
}

// Compact folds the delta into a new base, so that a lookup probes one table
// again. It copies the base (O(keys)): the Syncer calls it once changes have
// been quiet for a while, not on every change.
func (x *Index) Compact() {
	old := x.cur.Load()
	if old == nil || old.delta.n == 0 {
		return
	}
	x.cur.Store(x.folded(old))
}

// Pending is the number of keys in the delta (changed since the base).
func (x *Index) Pending() int {
	if s := x.cur.Load(); s != nil {
		return s.delta.n
	}
	return 0
}

// plans interns Plans: one for each distinct tier and overrides (in their
// order), numbered from 0 in the order they were added.
type plans struct {
	list []*Plan
	ids  map[string]uint32
	buf  []byte // the key being looked up
}

// id returns the number of the plan of tier and os, adding one (with a
// copy of os) when there is none.
func (ps *plans) id(tier string, os []Override) uint32 {
	if id, ok := ps.lookup(tier, os); ok {
		return id
	}
	return ps.add(&Plan{Tier: tier, Overrides: append(make([]Override, 0, len(os)), os...)})
}

// adopt returns the number of p's plan, adding p itself when there is none.
func (ps *plans) adopt(p *Plan) uint32 {
	if id, ok := ps.lookup(p.Tier, p.Overrides); ok {
		return id
	}
	return ps.add(p)
}

// lookup leaves the plan's key in ps.buf.
func (ps *plans) lookup(tier string, os []Override) (uint32, bool) {
	b := appendName(ps.buf[:0], tier)
	for _, o := range os {
		b = appendName(b, o.Descriptor)
		b = append(b, byte(o.Unit), byte(o.RequestsPerUnit), byte(o.RequestsPerUnit>>8), byte(o.RequestsPerUnit>>16), byte(o.RequestsPerUnit>>24))
	}
	ps.buf = b
	id, ok := ps.ids[string(b)] // no allocation
	return id, ok
}

// appendName appends s and its length (MaxDescriptorBytes fits two bytes).
func appendName(b []byte, s string) []byte {
	return append(append(b, byte(len(s)), byte(len(s)>>8)), s...)
}

func (ps *plans) add(p *Plan) uint32 {
	if ps.ids == nil {
		ps.ids = make(map[string]uint32)
	}
	id := uint32(len(ps.list))
	if id == tombstonePlan {
		panic("quota: more than 2^32-1 plans")
	}
	ps.list = append(ps.list, p)
	ps.ids[string(ps.buf)] = id
	return id
}
