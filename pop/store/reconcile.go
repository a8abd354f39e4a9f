package store

import (
	"context"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
)

// Reconciling a PoP's own counts with Redis. While Redis decides, the
// Fallback mirrors what it reports into the embedded store (RaiseAt): each
// key's local state is raised to the room Redis reported, so that when Redis
// goes away — a breaker trip, an outage — the embedded store goes on from
// Redis' last word instead of from zero. And when Redis reports more room
// than the embedded store knows of (RoomAt) — Redis restarted empty, or it
// never heard of the hits this server admitted on its own while Redis was
// away — the Fallback adds the difference to Redis (one more check of that
// key with the missing hits) and decides on the local knowledge.
//
// What it cannot know: hits other servers admitted on their own while Redis
// was away, and keys this server never checked. So a Redis outage re-grants
// at most, per key, what each server had left of it, not the whole limit
// each time; see docs/durability.md.

// reconciler is the embedded store as the Fallback reconciles it.
type reconciler interface {
	RoomAt(now int64, it *limit.Item) int64
	RaiseAt(now int64, it *limit.Item, room int64)
}

// RoomAt returns how many hits of it fit at now by this store's own state of
// its key (the capacity for a key it does not hold). It changes no count.
func (s *Memory) RoomAt(now int64, it *limit.Item) int64 {
	if s.replicates(it) {
		return it.Spec.Capacity()
	}
	h := s.hash(it.Key)
	sh := &s.shards[h>>56]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i := sh.t.find(h)
	if i < 0 {
		return roomOf(&it.Spec, &limit.State{}, now)
	}
	return roomOf(&it.Spec, &sh.t.slots[i].st, now)
}

// RaiseAt counts hits of it at now until no more than room hits fit by this
// store's state of its key: the state then knows at least what the reporter
// of room knew. It never lowers a count.
func (s *Memory) RaiseAt(now int64, it *limit.Item, room int64) {
	if s.replicates(it) {
		return
	}
	h := s.hash(it.Key)
	sh := &s.shards[h>>56]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i := sh.get(s, h, it.Key, now)
	if i < 0 {
		return // full of keys looked up more often
	}
	sl := &sh.t.slots[i]
	if local := roomOf(&it.Spec, &sl.st, now); local > room {
		it.Spec.Add(&sl.st, now, local-max(room, 0))
		sl.idleAt = it.Spec.IdleAt(&sl.st)
		if s.durable {
			s.noteChanged(int(h>>56), h)
		}
	}
}

// roomOf is how many hits fit in st at now; it advances st (which changes
// no meaning).
func roomOf(sp *limit.Spec, st *limit.State, now int64) int64 {
	sp.Advance(st, now)
	d := sp.Peek(st, now, 1)
	if d.Allowed {
		return d.Remaining + 1
	}
	return d.Remaining
}

// reconcile mirrors the primary's decisions out into the secondary and, for
// an item whose primary reported more room than the secondary knows of, adds
// the difference to the primary and decides on the secondary's knowledge.
// Requires the primary to have answered the check (hits >= 1).
func (f *Fallback) reconcile(r reconciler, now, hits int64, items []limit.Item, out []limit.Decision) {
	admitted := limit.Admit(items, out)
	deny := false
	for i := range items {
		it := &items[i]
		local := r.RoomAt(now, it)
		before := out[i].Remaining // room before this check, by the primary
		if admitted && out[i].Allowed {
			before += hits
		}
		if local+slack(it) < before { // the primary lost counts, or never had them
			target := local // the room the primary should report now
			if admitted && out[i].Allowed {
				target = max(local-hits, 0)
			}
			if missing := out[i].Remaining - target; missing > 0 {
				f.seed(now, it, missing)
			}
			if local < hits && !it.Shadow {
				deny = true
			}
			out[i].Remaining = target
		}
		r.RaiseAt(now, it, out[i].Remaining)
	}
	if deny && admitted {
		f.reconcileDenials.Add(1)
		for i := range items {
			if !items[i].Shadow && out[i].Allowed {
				out[i].Allowed = false
				out[i].RetryAfter = max(out[i].Reset, 1)
			}
		}
	}
}

// slack is how much more room the primary may report than the secondary
// knows of before reconcile takes the primary for having lost counts. A fixed
// window's counts are whole hits in both stores, so none: with one hit of
// slack, a check the secondary admitted when the primary timed out and, at
// the same time, a check the primary admitted up to the limit — its answer
// not yet mirrored — let a window admit one more than its limit (the soak:
// 51 of 50; TestFallbackTimeoutsKeepFixedWindows). The other algorithms keep
// one hit: the Lua scripts' and the embedded store's estimates may round a
// hit apart.
func slack(it *limit.Item) int64 {
	if it.Spec.Algorithm == limit.FixedWindow {
		return 0
	}
	return 1
}

// maxSeeds bounds the seeds in flight; past it a seed is skipped, and the
// key's next check, which finds the primary still short, tries again.
const maxSeeds = 64

// seedTimeout bounds one seed.
const seedTimeout = time.Second

// seed adds missing hits of it to the primary, in the background: the check
// that found them missing does not wait for another round trip. One seed per
// key at a time, so that checks of the key while it is in flight do not add
// the same hits twice.
func (f *Fallback) seed(now int64, it *limit.Item, missing int64) {
	key := string(it.Key)
	if _, busy := f.seeding.LoadOrStore(key, struct{}{}); busy {
		return
	}
	if f.inFlight.Add(1) > maxSeeds {
		f.inFlight.Add(-1)
		f.seeding.Delete(key)
		return
	}
	one := *it
	one.Key = []byte(key)
	f.seeds.Add(1)
	go func() {
		defer f.seeds.Done()
		defer f.inFlight.Add(-1)
		defer f.seeding.Delete(key)
		ctx, cancel := context.WithTimeout(context.Background(), seedTimeout)
		defer cancel()
		var d [1]limit.Decision
		if err := f.primary.CheckAt(ctx, now, missing, []limit.Item{one}, d[:]); err == nil && d[0].Allowed {
			f.reconciled.Add(uint64(missing))
		}
	}()
}
