// Package store holds the PoP's counter stores: Memory, the embedded in-process
// store, and (in redis.go) the Redis-compatible store shared by the servers of a
// PoP. Both implement the contract of limit.Decide: a check of every limit a
// request matched is one atomic step, and a denied request spends no quota.
package store

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/edgelimit/edgelimit/pop/limit"
)

const (
	shardCount = 256 // a power of two; far more shards than cores keeps locks uncontended
	// evictSample is how many keys a full shard looks at to choose one to evict.
	evictSample = 8
	// maxInline is how many items a check handles without allocating.
	maxInline = 8
)

// DefaultMaxKeys bounds the embedded store's active keys unless configured.
// At roughly 150 bytes per key (entry, map slot, key bytes) it caps the store
// near 150 MiB.
const DefaultMaxKeys = 1 << 20

// MemoryConfig configures a Memory store.
type MemoryConfig struct {
	// MaxKeys bounds the number of keys held; 0 means DefaultMaxKeys.
	MaxKeys int
}

// Memory is the embedded in-process counter store. It keeps one limit.State per
// key in a sharded map guarded by one mutex per shard, and is safe for
// concurrent use. A check that matched several limits locks their shards in
// order, so it is atomic with respect to every other check.
//
// Memory stays bounded: it holds at most MaxKeys keys. A key stops costing
// memory once it is idle (its state decides exactly as a fresh one would,
// limit.Spec.IdleAt); Sweep removes idle keys, and a full shard reclaims an
// idle key first. Only when a shard is full of keys that are all still
// counting does it evict a live one — the sampled key that would turn idle
// soonest, so the least counting is lost — and it counts that in
// Stats().EvictedLive: such a key restarts from zero, which can admit up to
// one more limit's worth for it. Size MaxKeys so that this stays zero.
type Memory struct {
	seed     maphash.Seed
	perShard int
	shards   [shardCount]shard

	evictedIdle atomic.Uint64
	evictedLive atomic.Uint64
}

type shard struct {
	mu   sync.Mutex
	m    map[string]*entry
	free []*entry // entries of evicted keys, reused for new keys
	_    [64 - 40]byte
}

type entry struct {
	st     limit.State
	idleAt int64 // when st stops mattering; see limit.Spec.IdleAt
}

// NewMemory returns an empty store.
func NewMemory(cfg MemoryConfig) *Memory {
	maxKeys := cfg.MaxKeys
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	s := &Memory{seed: maphash.MakeSeed(), perShard: max(maxKeys/shardCount, 1)}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*entry)
	}
	return s
}

// CheckAt evaluates items at now (nanoseconds since the epoch) as one atomic
// step with the semantics of limit.Decide, writing one decision per item to
// out, which must be at least as long as items. It never fails; ctx is unused.
func (s *Memory) CheckAt(_ context.Context, now, hits int64, items []limit.Item, out []limit.Decision) error {
	if len(items) == 1 { // the common case, without the ordering work
		sh := &s.shards[s.shardOf(items[0].Key)]
		sh.mu.Lock()
		e := sh.get(s, items[0].Key, now)
		d := items[0].Spec.Take(&e.st, now, hits) // a shadow limit adds only what it allowed, as Decide does
		e.idleAt = items[0].Spec.IdleAt(&e.st)
		sh.mu.Unlock()
		out[0] = d
		return nil
	}

	var (
		shardBuf [maxInline]int
		orderBuf [maxInline]int
		stateBuf [maxInline]*limit.State
		entryBuf [maxInline]*entry
	)
	idx, states, entries := shardBuf[:0], stateBuf[:0], entryBuf[:0]
	for i := range items {
		idx = append(idx, s.shardOf(items[i].Key))
	}
	order := sortedUnique(append(orderBuf[:0], idx...))
	for _, si := range order {
		s.shards[si].mu.Lock()
	}
	for i := range items {
		e := s.shards[idx[i]].get(s, items[i].Key, now)
		entries = append(entries, e)
		states = append(states, &e.st)
	}
	limit.Decide(now, hits, items, states, out)
	for i, e := range entries {
		e.idleAt = items[i].Spec.IdleAt(&e.st)
	}
	for i := len(order) - 1; i >= 0; i-- {
		s.shards[order[i]].mu.Unlock()
	}
	return nil
}

// Len reports the number of keys held.
func (s *Memory) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// MemoryStats counts what the store reclaimed.
type MemoryStats struct {
	Keys int
	// EvictedIdle counts idle keys reclaimed to make room: no accuracy lost.
	EvictedIdle uint64
	// EvictedLive counts keys evicted while still counting because their shard
	// was full: each restarted from zero.
	EvictedLive uint64
}

// Stats reports the store's size and evictions so far.
func (s *Memory) Stats() MemoryStats {
	return MemoryStats{Keys: s.Len(), EvictedIdle: s.evictedIdle.Load(), EvictedLive: s.evictedLive.Load()}
}

// SweepAt removes every key that is idle at now and returns how many it
// removed. It locks one shard at a time; call it periodically.
func (s *Memory) SweepAt(now int64) int {
	removed := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if e.idleAt <= now {
				delete(sh.m, k)
				sh.recycle(e)
				removed++
			}
		}
		sh.mu.Unlock()
	}
	return removed
}

func (s *Memory) shardOf(key []byte) int {
	return int(maphash.Bytes(s.seed, key) & (shardCount - 1))
}

// get returns key's entry, creating it (and making room) when absent.
// Requires sh.mu held.
func (sh *shard) get(s *Memory, key []byte, now int64) *entry {
	if e, ok := sh.m[string(key)]; ok {
		return e
	}
	if len(sh.m) >= s.perShard {
		sh.evict(s, now)
	}
	var e *entry
	if n := len(sh.free); n > 0 {
		e, sh.free = sh.free[n-1], sh.free[:n-1]
	} else {
		e = new(entry)
	}
	sh.m[string(key)] = e
	return e
}

// evict removes one key: among a sample, the one that turns idle first.
// Requires sh.mu held.
func (sh *shard) evict(s *Memory, now int64) {
	var (
		victim string
		ve     *entry
		n      int
	)
	for k, e := range sh.m { // map iteration starts at a random slot
		if ve == nil || e.idleAt < ve.idleAt {
			victim, ve = k, e
		}
		if n++; n == evictSample || ve.idleAt <= now {
			break
		}
	}
	if ve == nil {
		return
	}
	if ve.idleAt <= now {
		s.evictedIdle.Add(1)
	} else {
		s.evictedLive.Add(1)
	}
	delete(sh.m, victim)
	sh.recycle(ve)
}

// recycle keeps e for reuse. Requires sh.mu held.
func (sh *shard) recycle(e *entry) {
	if len(sh.free) < 64 {
		*e = entry{}
		sh.free = append(sh.free, e)
	}
}

// sortedUnique sorts out in place and drops repeats; out is short.
func sortedUnique(out []int) []int {
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	u := out[:0]
	for i, v := range out {
		if i == 0 || v != out[i-1] {
			u = append(u, v)
		}
	}
	return u
}
