// Package store holds the PoP's counter stores: Memory, the embedded in-process
// store, and (in redis.go) the Redis-compatible store shared by the servers of a
// PoP. Both implement the contract of limit.Decide: a check of every limit a
// request matched is one atomic step, and a denied request spends no quota.
package store

import (
	"context"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"

	"github.com/edgelimit/edgelimit/pop/limit"
)

const (
	shardCount = 256 // the top 8 bits of a key's hash; far more shards than cores keeps locks uncontended
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
	// Replica names this PoP as a CRDT replica. When set, limits with scope
	// region or global count their hits across PoPs (see Delta and Apply);
	// when empty, every limit counts this PoP's hits only.
	Replica string
	// RegionPeers are the other PoPs of this PoP's region, whose counts a
	// region-scoped limit adds to its own.
	RegionPeers []string
	// Replicas are the other PoPs of the topology, every region's. A
	// replica not heard from yet is taken, from the store's first check
	// on, for one whose news is held up (region/estimate, Clock.held).
	Replicas []string
	// Extrapolate makes a check of a region or global limit count, beside
	// what it has heard, the hits other replicas have probably admitted
	// since (limit.State.Unheard): each replica's recent rate times the age
	// of its last message. Without it a check counts only what it heard.
	Extrapolate bool
	// EstimateMiss, when set with Extrapolate, is called (outside the
	// store's locks) each time another PoP reports its count of a key this
	// PoP is admitting near its limit: with the key's scope and how far
	// this PoP's estimate of that count (what it had heard plus what it
	// guessed since) was from the report, in hits; positive when it
	// overestimated. It shows the estimator working in production.
	EstimateMiss func(scope limit.Scope, hits float64)
	// SettledExcess, when set with Extrapolate, is called (outside the
	// store's locks, as news is applied) once for each window of a
	// sliding-window key in which this PoP found the key at its limit,
	// once the window has settled (every replica's news of it arrived):
	// with the key's scope and how far over the limit all PoPs together
	// admitted in it, in percent of the limit; negative when under. It is
	// the overshoot of a global or region limit measured in production.
	SettledExcess func(scope limit.Scope, pct float64)
	// Primary, when set, is the replicated Redis store this store is the
	// Fallback secondary of: limits with scope region or global are then
	// decided and counted on the Redis store's in-process counts — the
	// other PoPs' counts it applied and its own — which it publishes and
	// puts back into Redis when Redis returns (redis_offline.go). Replica,
	// RegionPeers, Extrapolate and EstimateMiss are then ignored. A Primary
	// without a replica name changes nothing.
	Primary *Redis
	// Incarnation, with Replica, is when this process started (unix ns, on
	// the clock checks decide on): a bounded limit's windows that began
	// before it start with no allowance here, since what the process before
	// admitted after its last save is unknown (region/escrow, "Crash"). 0
	// means the epoch: no window began before it (tests, the simulator).
	Incarnation int64
	// Durable makes the store note which of its own keys (those not counted
	// across PoPs) admitted hits or went away, for TakeStates: a driver
	// saves them every flush interval and restores them after a restart
	// (durable.go). Without it the store keeps no such log.
	Durable bool
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
	rep      *replicated // nil without a replica name
	urgent   chan struct{}
	onMiss   func(limit.Scope, float64)
	// onSettled is MemoryConfig.SettledExcess (or RedisConfig's, for a
	// Redis store's estimate).
	onSettled func(limit.Scope, float64)
	durable   bool
	changes   [shardCount]changeLog // see durable.go; changes[i] requires shards[i].mu
	leases    *Leases               // the concurrency leases a PoP on this store holds (Leases)

	clock atomic.Int64 // correction of the wall clock for Apply, ns

	evictedIdle atomic.Uint64
	evictedLive atomic.Uint64
	untracked   atomic.Uint64
}

type shard struct {
	mu   sync.Mutex
	t    table
	freq sketch
	// 128 bytes, two cache lines: no false sharing between cores
	// (TestShardSize; a trailing pad of zero bytes would add 8).
}

// inUse marks a slot taken by the check under way, so that making room for
// another key of the same check never evicts it.
const inUse = math.MaxInt64

// NewMemory returns an empty store.
func NewMemory(cfg MemoryConfig) *Memory {
	maxKeys := cfg.MaxKeys
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	s := &Memory{seed: maphash.MakeSeed(), perShard: max(maxKeys/shardCount, 1), urgent: make(chan struct{}, 1), durable: cfg.Durable, leases: NewLeases()}
	switch {
	case cfg.Primary != nil:
		s.rep = cfg.Primary.est
	case cfg.Replica != "":
		s.rep = newReplicated(cfg.Replica, cfg.RegionPeers, cfg.Replicas, cfg.Extrapolate)
		// A bad name (escrow.Config's rules) leaves esc nil: bounded items
		// then have no room (bounded.go), never an estimate's.
		s.rep.esc, _ = newBounded(cfg.Replica, cfg.RegionPeers, cfg.Replicas, cfg.Incarnation)
		if cfg.Extrapolate {
			s.onMiss = cfg.EstimateMiss
			s.onSettled = cfg.SettledExcess
			s.rep.keepSettled = cfg.SettledExcess != nil
		}
	}
	for i := range s.shards {
		s.shards[i].t.rng = uint64(i)*0x9E3779B97F4A7C15 | 1
		s.shards[i].freq = newSketch(s.perShard)
	}
	return s
}

// CheckAt evaluates items at now (nanoseconds since the epoch) as one atomic
// step with the semantics of limit.Decide, writing one decision per item to
// out, which must be at least as long as items. It never fails; ctx is unused.
func (s *Memory) CheckAt(_ context.Context, now, hits int64, items []limit.Item, out []limit.Decision) error {
	if len(items) == 1 && !s.replicates(&items[0]) { // the common case, without the ordering work
		h := s.hash(items[0].Key)
		sh := &s.shards[h>>56]
		sh.mu.Lock()
		if i := sh.get(s, h, items[0].Key, now); i >= 0 {
			sl := &sh.t.slots[i]
			out[0] = items[0].Take(&sl.st, now, hits) // a shadow limit adds past its limit only with CountDenied, as Decide does
			sl.idleAt = items[0].Spec.IdleAt(&sl.st)
			if s.durable && out[0].Allowed && hits > 0 {
				s.noteChanged(int(h>>56), h)
			}
		} else {
			var fresh limit.State // untracked: see shard.get
			out[0] = items[0].Take(&fresh, now, hits)
		}
		sh.mu.Unlock()
		return nil
	}
	s.checkMany(now, hits, items, out)
	return nil
}

// Len reports the number of keys held.
func (s *Memory) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.t.n
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
	// was full and a key looked up more often lately needed the room: each
	// restarted from zero.
	EvictedLive uint64
	// Untracked counts checks of new keys decided on a fresh state and not
	// kept, because their shard was full of keys still counting that are
	// looked up at least as often.
	Untracked uint64
}

// Stats reports the store's size and evictions so far.
func (s *Memory) Stats() MemoryStats {
	return MemoryStats{Keys: s.Len(), EvictedIdle: s.evictedIdle.Load(), EvictedLive: s.evictedLive.Load(), Untracked: s.untracked.Load()}
}

// SweepAt removes every key that is idle at now and returns how many it
// removed, and drops replicated windows older than the previous one. It locks
// one shard at a time; call it periodically.
func (s *Memory) SweepAt(now int64) int {
	if s.rep != nil {
		s.rep.sweep(now)
	}
	removed := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		t := &sh.t
		for j := uint64(0); j < uint64(len(t.slots)); {
			if sl := &t.slots[j]; sl.hash != 0 && sl.idleAt <= now {
				s.noteGone(i, t.keys[j])
				t.remove(j) // a later slot may shift into j: look at j again
				removed++
				continue
			}
			j++
		}
		sh.mu.Unlock()
	}
	return removed
}

func (s *Memory) hash(key []byte) uint64 {
	h := maphash.Bytes(s.seed, key)
	if h == 0 {
		h = 1 // 0 marks an empty slot
	}
	return h
}

// get returns the slot index of the key with hash h, creating the slot (and
// making room) when absent. Requires sh.mu held.
// It returns -1 when the shard is full of keys still counting that are all
// looked up at least as often as this one: the key is then decided on a
// fresh state and not kept (Stats().Untracked).
func (sh *shard) get(s *Memory, h uint64, key []byte, now int64) int {
	if 2*sh.t.n >= s.perShard {
		// Only a shard that could fill up needs to know which keys are
		// looked up often; below half full the sketch costs nothing.
		sh.freq.add(h)
	}
	if i := sh.t.find(h); i >= 0 {
		return i
	}
	if sh.t.n >= s.perShard && !sh.evict(s, h, now) {
		s.untracked.Add(1)
		return -1
	}
	return sh.t.insert(h, key)
}

// evict makes room for the key with hash h: among a sample, it removes the
// key that turns idle first if it is idle, or if it is still counting but
// looked up less often lately than h (sketch), and reports whether h may be
// inserted. Requires sh.mu held.
func (sh *shard) evict(s *Memory, h uint64, now int64) bool {
	var buf [evictSample]int
	victim := -1
	for _, i := range sh.t.sample(evictSample, buf[:0]) {
		if victim < 0 || sh.t.slots[i].idleAt < sh.t.slots[victim].idleAt {
			victim = i
		}
	}
	if victim < 0 || sh.t.slots[victim].idleAt == inUse {
		return true // every sampled key belongs to the check under way: grow past the bound a little
	}
	v := &sh.t.slots[victim]
	switch {
	case v.idleAt <= now:
		s.evictedIdle.Add(1)
	case sh.freq.estimate(h) > sh.freq.estimate(v.hash):
		s.evictedLive.Add(1)
	default:
		return false
	}
	s.noteGone(int(v.hash>>56), sh.t.keys[victim])
	sh.t.remove(uint64(victim))
	return true
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

// Leases returns the store's concurrency leases: where a PoP on the embedded
// store holds them, and where its durable state restores them after a
// restart (LeaseJournal). A PoP on Redis holds its leases in Redis instead.
func (s *Memory) Leases() *Leases { return s.leases }
