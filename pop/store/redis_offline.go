package store

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/pop/limit"
)

// Region and global limits while Redis is away.
//
// A replicated Redis store's Fallback answers from an embedded store when
// Redis fails. For a pop-scope limit that store is enough: it was seeded
// with Redis' last word (reconcile.go) and nothing else counts the key. For a
// region or global limit it is not: it knows none of the other PoPs' counts,
// and the hits it admits are published to nobody — a PoP whose Redis was
// shut down admitted 68 of a region limit of 50 in the soak. So that store
// decides those limits on the Redis store's estimate instead (the other
// PoPs' counts as applied, and this PoP's own; MemoryConfig.Primary), and
// the store keeps the estimate's own counts the PoP's:
//
//  1. Before an offline check, the estimate's own count of each replicated
//     item (current and previous window) is raised to the most this server
//     published of it (offlineBefore): a count read from Redis, which other
//     servers of the PoP or a restart may have put there without this
//     server's estimate seeing them.
//  2. The check decides and counts in the estimate, as the embedded store
//     does for a replicated PoP (replicated.go); its pairs are tracked as
//     counted offline (offlineAfter).
//  3. Delta publishes, for a pair Redis cannot be read for, the estimate's
//     count when it is above what was published (ownSlots): the other PoPs
//     hear of the offline admissions within a flush interval, as of any
//     others, and a replica never publishes less than before.
//  4. When Redis answers again, the first check first puts the offline
//     counts back into Redis (restoreOffline) — max-merged (merge.lua "o"),
//     so a retried or repeated restore never counts a hit twice — and Delta
//     does so too for any pair whose Redis count is below the estimate's.
//
// The estimate's own count is this server's admissions plus, after step 1,
// the PoP's count as last read; so it never exceeds what the PoP admitted,
// and restoring it never adds hits nobody admitted. What the max cannot
// hold: when several servers of one PoP admit offline at once, the PoP's
// count after the restore is the largest server's, not the sum (each
// server's offline hits were decided on its own estimate anyway).

// offliner is a primary whose Fallback tells it of the checks it answers
// without it (Redis with a replica name; the others do nothing).
type offliner interface {
	offlineBefore(now int64, items []limit.Item)
	offlineAfter(now int64, items []limit.Item)
}

// offlineBefore raises, before a check at now answered without Redis, the
// estimate's own counts of the replicated items to what this server last
// published of them (step 1 above).
func (s *Redis) offlineBefore(now int64, items []limit.Item) {
	if s.rep == nil {
		return
	}
	var buf [2 * maxInline]crdt.Slot
	raise := buf[:0]
	r := s.rep
	r.mu.Lock()
	for i := range items {
		it := &items[i]
		if !s.replicates(it) {
			continue
		}
		w := it.Spec.Window
		start := limit.WindowStart(now, w)
		key := unsafe.String(unsafe.SliceData(it.Key), len(it.Key))
		for _, win := range [2]int64{start, start - w} {
			if t := r.own[trackKey{key, win}]; t != nil && t.published > 0 {
				raise = append(raise, crdt.Slot{Key: key, Window: win, Replica: r.self, Count: t.published})
			}
		}
	}
	r.mu.Unlock()
	if len(raise) == 0 {
		return
	}
	e := s.est
	e.mu.Lock()
	for _, sl := range raise {
		w, _, _ := slotWindow(sl.Key)
		e.unit(w).own.Restore(sl) // copies the key only when it inserts
	}
	e.mu.Unlock()
}

// offlineAfter tracks the replicated items of a check at now answered
// without Redis as counted offline: Delta publishes their estimate's counts,
// and restoreOffline puts them into Redis (steps 2–4 above). A denied item
// is tracked too; restoring its unchanged count changes nothing.
func (s *Redis) offlineAfter(now int64, items []limit.Item) {
	if s.rep != nil && s.markOwn(now, items, nil, true) {
		s.offlinePending.Store(true)
	}
}

// restoreOffline puts the estimate's own counts of the pairs counted
// offline into Redis (step 4 above), before a check decides there: a check
// decided on a Redis that lacks them could admit them again. One restore
// runs at a time; the checks that arrive meanwhile wait for it, up to ctx's
// deadline, and then find nothing left to do. It fails, and the check with
// it (the Fallback answers that check), when Redis does not take them.
func (s *Redis) restoreOffline(ctx context.Context) error {
	select {
	case s.offlineSem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("store: redis: restoring offline counts: %w", ctx.Err())
	}
	defer func() { <-s.offlineSem }()
	if !s.offlinePending.Load() {
		return nil // restored while this check waited
	}
	type pending struct {
		tk      trackKey
		w       int64
		offline uint32 // offline checks of the pair when its counts were taken
	}
	var todo []pending
	var own, remote []crdt.Slot
	r := s.rep
	r.mu.Lock()
	for tk, t := range r.own {
		if t.offline > 0 {
			todo = append(todo, pending{tk, t.w, t.offline})
		}
	}
	// Each key's current and previous windows (a sliding window decides
	// on both): own counts at least as published, and, for a Redis that
	// came back empty, the other PoPs' counts as the estimate holds them.
	for _, p := range todo {
		for _, win := range [2]int64{p.tk.window, p.tk.window - p.w} {
			var n uint64
			if t := r.own[trackKey{p.tk.key, win}]; t != nil {
				n = t.published
			}
			own = append(own, crdt.Slot{Key: p.tk.key, Window: win, Replica: r.self, Count: n})
		}
	}
	r.mu.Unlock()
	e := s.est
	e.mu.Lock()
	for i := range own {
		sl := &own[i]
		if u := e.units[todo[i/2].w]; u != nil {
			sl.Count = max(sl.Count, u.own.Count(sl.Key, sl.Window))
			u.remote.Each(sl.Key, sl.Window, nil, func(replica string, n uint64) {
				remote = append(remote, crdt.Slot{Key: sl.Key, Window: sl.Window, Replica: replica, Count: n})
			})
		}
	}
	e.mu.Unlock()
	if err := errors.Join(s.RestoreCtx(ctx, own), s.ApplyCtx(ctx, remote)); err != nil {
		return err
	}
	// A pair counted offline again since its count was taken (a slow Redis
	// may still time a check out into the Fallback) keeps its mark.
	pendingLeft := false
	r.mu.Lock()
	for _, p := range todo {
		if t := r.own[p.tk]; t != nil {
			t.offline -= min(t.offline, p.offline)
		}
	}
	for _, t := range r.own {
		if t.offline > 0 {
			pendingLeft = true
			break
		}
	}
	s.offlinePending.Store(pendingLeft)
	r.mu.Unlock()
	return nil
}

// recheckOffline denies, after Redis admitted a check at now, a request
// that the estimate has no room for, when one of its replicated items has
// hits counted offline that Redis does not hold yet. It returns err
// unchanged. That happens when a check that ran out of time was answered by
// the Fallback while another check of the key, already in Redis, took the
// last room there: each saw a count without the other's hit, and both were
// admitted (what reconcile.go's slack guards against for the other
// limits). The denied request's hits stay counted in Redis, as a denied
// request's never are elsewhere: the restore's max-merge keeps one count
// of the two, so the window counts one hit more than it admitted, never
// less.
func (s *Redis) recheckOffline(now, hits int64, items []limit.Item, out []limit.Decision, err error) error {
	if err != nil || !s.offlinePending.Load() || !limit.Admit(items, out) {
		return err
	}
	var buf [maxInline]int
	suspect := buf[:0]
	r := s.rep
	r.mu.Lock()
	for i := range items {
		it := &items[i]
		if !s.replicates(it) || it.Shadow {
			continue
		}
		key := unsafe.String(unsafe.SliceData(it.Key), len(it.Key))
		if t := r.own[trackKey{key, limit.WindowStart(now, it.Spec.Window)}]; t != nil && t.offline > 0 {
			suspect = append(suspect, i)
		}
	}
	r.mu.Unlock()
	if len(suspect) == 0 {
		return nil
	}
	deny := false
	e := s.est
	e.mu.Lock()
	for _, i := range suspect {
		st := e.stateOf(&items[i], now)
		items[i].Spec.Advance(&st, now)
		if !items[i].Spec.Peek(&st, now, hits).Allowed {
			deny = true
			break
		}
	}
	e.mu.Unlock()
	if deny {
		s.offlineDenials.Add(1)
		for i := range items {
			if !items[i].Shadow && out[i].Allowed {
				out[i].Allowed = false
				out[i].RetryAfter = max(out[i].Reset, 1)
			}
		}
	}
	return nil
}

// OfflineDenials is how many checks Redis admitted that recheckOffline
// denied: their key's hits counted while Redis was away were not in Redis
// yet, and without Redis' room the estimate had none.
func (s *Redis) OfflineDenials() uint64 { return s.offlineDenials.Load() }
