package store

import (
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
)

// The local cache of keys over their limit (RedisConfig.DenyCacheKeys).
//
// A PoP on Redis pays a round trip for every check, also for a key that is
// over its limit and will be for a while: the client that keeps sending
// after its 429. Envoy's ratelimit keeps such keys in a local cache
// (LOCAL_CACHE_SIZE_IN_BYTES) and answers them without Redis; so does this
// store. When Redis denies a single hit of a limit, the decision's
// RetryAfter says when one hit would fit again if nothing else were
// counted. Counts only grow between now and then — a key's counts are
// G-counters: admissions add to them, a denial adds nothing (or, with
// CountDenied, more hits), and nothing takes away — so the key stays over
// its limit at least until then: the cache answers a check of the key
// before that instant with a denial, as Redis would, and the check costs no
// round trip.
//
// Why "counts only grow" makes the instant a lower bound, per algorithm
// (one hit, a limit of at least one; a limit of 0 denies every hit anyway):
//
//   - fixed_window: denied while cur + 1 > limit; cur only grows within its
//     window, so the denial holds until the window ends, which RetryAfter is.
//   - sliding_window: denied while prev·(1 − elapsed/w) + cur + 1 > limit.
//     With the counts fixed the estimate falls continuously with time (also
//     across the window boundary, where cur becomes prev at weight 1), so
//     the first instant one hit fits is unique, and larger counts only move
//     it later. RetryAfter solves for it in real numbers, but the store
//     compares in floats with a tolerance of 10⁻⁹ of a hit, so it may admit a
//     little earlier: the count that decays is at least one hit, so the
//     estimate falls by at least 1/w hits per nanosecond, and the tolerance
//     with the rounding of estimates up to 2³² hits (about 2⁻¹⁹ of a hit)
//     is crossed in less than w/2¹⁶: the cache ends that much earlier
//     (denyMargin).
//   - token_bucket: denied while tokens + 10⁻⁹ < 1; tokens refill linearly
//     at limit/w per nanosecond and only spending (or, with CountDenied,
//     a denial) lowers them. As for the sliding window, the float tolerance
//     is crossed in less than w/2¹⁶.
//   - gcra: denied while max(tat, now) + I(1) − now > τ; tat only grows
//     (an admission moves it on), so the denial holds until tat + I(1) − τ,
//     in integers, which is RetryAfter.
//   - sliding_log: denied while more than limit − 1 logged hits are younger
//     than w; entries are only added, and leave when they age past w, so
//     the denial holds until the oldest entry that must leave has left,
//     which is RetryAfter.
//
// Only limits the store counts for this PoP alone are cached (pop scope,
// or any limit of a store without a replica name). A region or global
// limit decides on the other PoPs' counts and on a guess of what they
// admitted since their last news, which news may replace by less; and a
// key over such a limit is already answered without the store, across
// PoPs, by its mitigation bit (pop.Engine.UseMitigations). The key's
// identity in the cache includes its spec (algorithm, limit, window,
// burst), scope and Shrunk: a rule reload changes the limit, and the cache
// then misses.
//
// What the cache assumes: that Redis does not lose counts. A Redis that
// restarts empty admits again at once; the cache denies those keys until
// their RetryAfter, as the counts it saw said — as the Fallback decides on
// what it saw while Redis is away.
//
// A cached answer is the one Redis would give if nothing had been counted
// since the denial it remembers: Allowed false, Remaining 0 (no room for
// one hit), RetryAfter and Reset from the same instants; when more was
// counted since, Redis would give a later RetryAfter. (A token bucket's
// tokens are floats that Redis refills at each check it sees; with fewer
// checks it refills in fewer steps, which can round a nanosecond or a
// token's floor apart from refilling at every check.) With CountDenied a
// cached denial still counts its hit: the store queues the count to Redis
// (mode 'c' of check.lua) without waiting for it; when the queue is full
// the check goes to Redis as usual.
//
// The cache is a fixed array of sets of denyWays entries, each set under
// its own mutex; an entry is 24 bytes, found by a seeded 64-bit hash of the
// key and its limit (a collision would deny one key for the other's time:
// about n²/2⁶⁵ for n keys cached, as Memory's table accepts). A full set
// replaces the entry that ends first. Lookups and inserts allocate nothing.

// DefaultDenyCacheKeys is how many over-limit keys the Redis store
// remembers unless configured (RedisConfig.DenyCacheKeys): 24 bytes each,
// 1.5 MiB in all.
const DefaultDenyCacheKeys = 1 << 16

// denyWays is how many entries a set holds.
const denyWays = 4

// denyCache is the cache of keys over their limit. It is safe for
// concurrent use; nil is a cache that holds nothing.
type denyCache struct {
	seed    maphash.Seed
	mask    uint64 // len(sets) − 1
	sets    []denySet
	answers atomic.Uint64 // checks answered from the cache
}

// denySet is one set of the cache: 8 + 4·24 bytes, padded to two cache
// lines so that sets under different locks share none.
type denySet struct {
	mu      sync.Mutex
	entries [denyWays]denyEntry
	_       [24]byte
}

// denyEntry says that the limit whose hash is id denies one hit until
// retryAt, as Redis's RetryAfter said (on the store's decision clock); the
// cache answers until denyMargin before it. resetAt is when the key's
// window ends (window algorithms; the window of the denial) or its bucket
// is full (the others), for the answer's Reset.
type denyEntry struct {
	id      uint64 // 0: empty
	retryAt int64
	resetAt int64
}

// newDenyCache returns a cache of about keys entries (rounded up to a
// power of two sets), or nil for keys < 0.
func newDenyCache(keys int) *denyCache {
	if keys < 0 {
		return nil
	}
	if keys == 0 {
		keys = DefaultDenyCacheKeys
	}
	sets := uint64(1) << bits.Len64(uint64(max((keys+denyWays-1)/denyWays, 1)-1))
	return &denyCache{seed: maphash.MakeSeed(), mask: sets - 1, sets: make([]denySet, sets)}
}

// denyMargin is how much earlier than RetryAfter the cache lets an
// entry of sp end: w/2¹⁶ + 1 ns for the algorithms that compare in floats
// (see above), none for the others.
func denyMargin(sp *limit.Spec) int64 {
	if sp.Algorithm == limit.SlidingWindow || sp.Algorithm == limit.TokenBucket {
		return sp.Window>>16 + 1
	}
	return 0
}

// id is it's identity in the cache: its key, spec, scope and Shrunk.
func (c *denyCache) id(it *limit.Item) uint64 {
	h := maphash.Bytes(c.seed, it.Key)
	sp := &it.Spec
	h = mix(h ^ uint64(sp.Algorithm) ^ uint64(it.Scope)<<8 ^ uint64(it.Consistency)<<16 ^ b2u(it.Shrunk)<<24)
	h = mix(h ^ uint64(sp.Limit))
	h = mix(h ^ uint64(sp.Window))
	h = mix(h ^ uint64(sp.Burst))
	if h == 0 {
		h = 1 // 0 marks an empty entry
	}
	return h
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// mix is splitmix64's finalizer: every input bit moves every output bit.
func mix(h uint64) uint64 {
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	return h ^ h>>31
}

// lookup writes to d the cached answer for a check of one hit of it at
// now, and reports whether the cache holds one.
func (c *denyCache) lookup(now int64, it *limit.Item, d *limit.Decision) bool {
	id := c.id(it)
	set := &c.sets[id&c.mask]
	set.mu.Lock()
	for i := range set.entries {
		e := &set.entries[i]
		if e.id != id {
			continue
		}
		if now >= e.retryAt-denyMargin(&it.Spec) {
			break
		}
		retryAt, resetAt := e.retryAt, e.resetAt
		set.mu.Unlock()
		*d = limit.Decision{RetryAfter: retryAt - now, Reset: resetOf(&it.Spec, resetAt, now)}
		return true
	}
	set.mu.Unlock()
	return false
}

// resetOf is the Reset of a check at now of a key of sp whose window ends,
// or whose bucket fills, at resetAt as last seen: a window algorithm's key
// checked in a later window is in that window, which ends on its boundary.
func resetOf(sp *limit.Spec, resetAt, now int64) int64 {
	if sp.Algorithm == limit.SlidingWindow || sp.Algorithm == limit.FixedWindow {
		resetAt = max(resetAt, limit.WindowStart(now, sp.Window)+sp.Window)
	}
	return max(resetAt-now, 0)
}

// note caches d, Redis's decision for one hit of it at now, when it is a
// denial that lasts (see above).
func (c *denyCache) note(now int64, it *limit.Item, d *limit.Decision) {
	if d.Allowed {
		return
	}
	retryAt := now + d.RetryAfter
	if d.RetryAfter <= 1 || retryAt-denyMargin(&it.Spec) <= now {
		return // denied on a guess, or for no longer than the margin
	}
	id := c.id(it)
	set := &c.sets[id&c.mask]
	set.mu.Lock()
	victim := 0
	for i := range set.entries {
		e := &set.entries[i]
		if e.id == id {
			if e.retryAt < retryAt { // a later look at grown counts
				e.retryAt, e.resetAt = retryAt, now+d.Reset
			}
			set.mu.Unlock()
			return
		}
		if e.retryAt < set.entries[victim].retryAt {
			victim = i // empty entries end at 0, first of all
		}
	}
	set.entries[victim] = denyEntry{id: id, retryAt: retryAt, resetAt: now + d.Reset}
	set.mu.Unlock()
}

// denyLocally answers a check of one hit of items at now from the cache,
// when every item is cached over its limit there: it writes the answers to
// out and reports true. Items that count denied hits get their hit counted
// in Redis by a queued call the check does not wait for; when the queue is
// full it reports false, and the check goes to Redis.
func (s *Redis) denyLocally(now int64, items []limit.Item, out []limit.Decision) bool {
	c := s.deny
	counts := false
	for i := range items {
		if s.replicates(&items[i]) || !c.lookup(now, &items[i], &out[i]) {
			return false
		}
		counts = counts || items[i].CountsDenied()
	}
	if counts && !s.countDenied(now, items) {
		return false
	}
	c.answers.Add(1)
	return true
}

// countDenied queues, without waiting, a call of check.lua in mode 'c' that
// counts one hit at now on each of items that counts denied hits, as the
// denial Redis would have made does. It reports false when the queue is
// full.
func (s *Redis) countDenied(now int64, items []limit.Item) bool {
	r := s.reqs.Get().(*request)
	r.prepare(s, now, 1, items, nil, time.Now().Add(s.cfg.Timeout))
	r.multi = false // each call is one slot's items, counted on its own
	for i := range r.calls {
		r.calls[i].blob[callModeAt] = 'c'
	}
	r.state.Store(reqDetached)
	select {
	case s.queue <- r:
		return true
	default:
		s.reqs.Put(r)
		return false
	}
}

// noteDenials caches the denials among out, Redis's answers to a check of
// hits at now.
func (s *Redis) noteDenials(now, hits int64, items []limit.Item, out []limit.Decision) {
	if s.deny == nil || hits != 1 {
		return
	}
	for i := range items {
		if !s.replicates(&items[i]) {
			s.deny.note(now, &items[i], &out[i])
		}
	}
}

// LocalDenials is how many checks the store answered from its cache of
// keys over their limit, without Redis.
func (s *Redis) LocalDenials() uint64 {
	if s.deny == nil {
		return 0
	}
	return s.deny.answers.Load()
}
