package store

import (
	"slices"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/pop/limit"
)

// The guess of unheard hits in the Redis store (RedisConfig.Extrapolate).
//
// A check of a region or global window limit decides, in the embedded store,
// on what it heard plus a guess of what the other PoPs admitted since their
// last news (limit.State.Unheard, estimate.Unheard). The Redis store makes
// the same guess with the same code: each server keeps a replicated of its
// own — the other PoPs' counts and the age of their news, as it applies them
// (Apply), and its own admissions (estimated) — computes each item's Unheard
// before the check and hands it to the script with the item, where the
// peek adds it exactly as limit.Decide does (check.lua). Redis stays the
// truth of the counts: the guess only adds to them.
//
// Each server of a PoP sees only its own admissions, so its guess of what
// another PoP did mirrors what this server did, scaled by that PoP's part of
// the key's traffic against this server's (estimate.Unheard): the ratio a
// server of a PoP that shares the load evenly sees is the PoP's. (Once
// Redis has been away, the own counts of the keys checked meanwhile are the
// PoP's as last read, redis_offline.go, and the mirror reads those.) The
// cost is memory: each server holds the other PoPs' counts of the current
// and previous windows in process, as an embedded PoP does. The same counts
// decide region and global limits while Redis is away, so a replicated
// store keeps them even without Extrapolate.

// newRedisEstimate returns the estimate of a store with cfg, or nil without
// a replica name. A replicated store keeps one even without Extrapolate
// (then it guesses nothing, Unheard stays 0): the other PoPs' counts and
// this server's own are what its Fallback decides region and global limits
// on while Redis is away (redis_offline.go).
func newRedisEstimate(cfg RedisConfig) *replicated {
	if cfg.Replica == "" {
		return nil
	}
	r := newReplicated(cfg.Replica, cfg.RegionPeers, cfg.Replicas, cfg.Extrapolate)
	r.keepSettled = cfg.Extrapolate && cfg.SettledExcess != nil
	return r
}

// estimates appends to sts, for each item of a check at now, the state the
// estimate decides it on (the zero State for an item not counted across
// PoPs): the script needs its Unheard, and estimated its counts. A check
// of no such item gets nil, without taking the estimate's lock.
func (s *Redis) estimates(now int64, items []limit.Item, sts []limit.State) []limit.State {
	if !slices.ContainsFunc(items, func(it limit.Item) bool { return s.replicates(&it) }) {
		return nil
	}
	e := s.est
	e.mu.Lock()
	for i := range items {
		var st limit.State
		if s.replicates(&items[i]) {
			st = e.stateOf(&items[i], now)
		}
		sts = append(sts, st)
	}
	e.mu.Unlock()
	return sts
}

// unheardOf is item i's Unheard in sts, 0 without an estimate.
func unheardOf(sts []limit.State, i int) float64 {
	if sts == nil {
		return 0
	}
	return sts[i].Unheard
}

// estimated counts, after a check at now answered without error, the hits
// of the replicated items it admitted as this server's own in the estimate,
// and sweeps the estimate now and then. It returns err unchanged. A request
// denied as a whole counted nothing (limit.Admit).
func (s *Redis) estimated(now, hits int64, items []limit.Item, out []limit.Decision, sts []limit.State, err error) error {
	e := s.est
	if sts == nil || err != nil { // no estimate, or no item it counts
		return err
	}
	for i := range items {
		if !out[i].Allowed && !items[i].Shadow {
			s.deniedEstimate(items, out, sts)
			return nil
		}
	}
	e.mu.Lock()
	for i := range items {
		if out[i].Allowed && !items[i].Shadow && s.replicates(&items[i]) {
			// The state as the embedded store's decision leaves it, the
			// hits counted (limit.Decide): add goes by it.
			st := sts[i]
			items[i].Spec.Advance(&st, now)
			items[i].Spec.Add(&st, now, hits)
			e.add(&items[i], &st, now, hits)
		}
	}
	e.mu.Unlock()
	s.sweepEstimate(now)
	return nil
}

// deniedEstimate notes, for each replicated item the script denied, that
// this PoP found its key at its limit in the window (replicated.atLimit):
// the script decides on what Redis holds, which for a PoP of several
// servers is more than this server's estimate counts, so the estimate
// alone would not see the limit reached.
func (s *Redis) deniedEstimate(items []limit.Item, out []limit.Decision, sts []limit.State) {
	e := s.est
	e.mu.Lock()
	for i := range items {
		if !out[i].Allowed && !items[i].Shadow && s.replicates(&items[i]) {
			e.atLimit(&items[i], sts[i].Start)
		}
	}
	e.mu.Unlock()
}

// sweepEstimate drops the estimate's windows before the previous one, at
// most once per pruneEvery: after checks (estimated) and applies
// (estimateApply) alike, so that remote counts of keys this server never
// checks do not pile up.
func (s *Redis) sweepEstimate(now int64) {
	if last := s.estSwept.Load(); now-last >= pruneEvery && s.estSwept.CompareAndSwap(last, now) {
		s.est.sweep(now)
	}
}

// estimateApply joins remote, stamped by their sender at sent, into the
// estimate as applied now.
// With RedisConfig.EstimateMiss, it first reports how far the estimate of
// each replicated key this server admits near its limit was from remote.
func (s *Redis) estimateApply(now, sent int64, remote []crdt.Slot) {
	e := s.est
	var misses []estimateMiss
	var settled []settledWindow
	e.mu.Lock()
	if s.cfg.EstimateMiss != nil {
		misses = e.misses(remote, now, sent)
	}
	e.applyLocked(now, sent, remote)
	if s.cfg.SettledExcess != nil {
		settled = e.takeSettled()
	}
	e.mu.Unlock()
	for _, m := range misses {
		s.cfg.EstimateMiss(m.scope, m.hits)
	}
	for _, w := range settled {
		s.cfg.SettledExcess(w.scope, w.pct)
	}
	s.sweepEstimate(now)
}

// Beacon tells the estimate that a presence beacon of PoP pop arrived
// (replication.BeaconCounts, Memory.Beacon).
func (s *Redis) Beacon(pop string) {
	if s.est != nil {
		s.est.beaconAt(s.now(), pop)
	}
}

// Hot is Memory.Hot for a PoP on Redis: the keys its estimate remembers
// admitting near their limit; nil without an estimate.
func (s *Redis) Hot(slots []crdt.Slot) []crdt.Slot {
	if s.est == nil {
		return nil
	}
	return s.est.hot(slots)
}
