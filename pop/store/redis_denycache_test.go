package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/store/redistest"
)

// denyCacheSpecs are small limits, so that a run spends much of its time
// over them, one per algorithm.
var denyCacheSpecs = []limit.Spec{
	{Algorithm: limit.SlidingWindow, Limit: 5, Window: int64(time.Second)},
	{Algorithm: limit.FixedWindow, Limit: 5, Window: int64(time.Second)},
	{Algorithm: limit.TokenBucket, Limit: 5, Window: int64(time.Second), Burst: 3},
	{Algorithm: limit.GCRA, Limit: 5, Window: int64(time.Second), Burst: 3},
	{Algorithm: limit.SlidingLog, Limit: 5, Window: int64(time.Second)},
}

// The cache never denies a check Redis would have allowed: two stores on
// one redis-server, one with the cache and one without, get the same
// checks at the same instants (on keys of their own), and must answer the
// same. With CountDenied, a denied hit counted moves Redis's RetryAfter
// on, and the cache, which saw the count before, may give a shorter one,
// never a longer one.
// The instants are drawn so that many fall just before, at and just after
// the RetryAfter Redis gave, where a cache that ends too late would deny
// what Redis allows. With CountDenied the cached denials count their hits
// through the queue, and the counts, hence the answers, must still agree.
func TestRedisDenyCacheAgreesWithRedis(t *testing.T) {
	srv := redistest.Start(t)
	for _, countDenied := range []bool{false, true} {
		// One pipeline: a cached denial's queued count reaches Redis
		// before the next check, as it does for the store without cache.
		cached := openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal, Pipelines: 1})
		plain := openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal, Pipelines: 1, DenyCacheKeys: -1})
		for _, sp := range denyCacheSpecs {
			t.Run(fmt.Sprintf("%s/countDenied=%v", sp.Algorithm, countDenied), func(t *testing.T) {
				seed := uint64(time.Now().UnixNano())
				t.Logf("seed %d", seed)
				rng := rand.New(rand.NewPCG(seed, 1))
				before := cached.LocalDenials()
				key := fmt.Sprintf("agree:%s:%v", sp.Algorithm, countDenied)
				itC := limit.Item{Key: []byte("cached:" + key), Spec: sp, CountDenied: countDenied}
				itP := limit.Item{Key: []byte("plain:" + key), Spec: sp, CountDenied: countDenied}
				ctx := context.Background()
				now := int64(1_700_000_000_000_000_000)
				var last limit.Decision
				// A bucket's tokens are floats, refilled at each check
				// Redis sees: the two keys, refilled at different
				// instants, round apart, and their answers may differ
				// by a nanosecond or a token with or without the cache.
				slack := int64(0)
				if sp.Algorithm == limit.TokenBucket {
					slack = 1
				}
				for i := range 600 {
					switch r := rng.IntN(6); {
					case !last.Allowed && last.RetryAfter > 0 && r < 3:
						now += last.RetryAfter + int64(r) - 1 // just before, at, just after
					case r == 3:
						now += rng.Int64N(sp.Window / 2)
					default:
						now += rng.Int64N(sp.Window / 20)
					}
					hits := int64(1)
					if rng.IntN(10) == 0 {
						hits = 2
					}
					var dc, dp [1]limit.Decision
					if err := cached.CheckAt(ctx, now, hits, []limit.Item{itC}, dc[:]); err != nil {
						t.Fatal(err)
					}
					if err := plain.CheckAt(ctx, now, hits, []limit.Item{itP}, dp[:]); err != nil {
						t.Fatal(err)
					}
					c, p := dc[0], dp[0]
					if c.Allowed != p.Allowed || abs64(c.Remaining-p.Remaining) > slack || c.RetryAfter > p.RetryAfter+slack || (c.RetryAfter == 0) != (p.RetryAfter == 0) ||
						!countDenied && abs64(c.RetryAfter-p.RetryAfter) > slack {
						t.Fatalf("check %d at +%dns, %d hits: with the cache %+v, Redis alone %+v", i, now-1_700_000_000_000_000_000, hits, c, p)
					}
					// Reset: a count-denied hit empties a bucket, which
					// then fills later than the cached Reset says.
					if d := c.Reset - p.Reset; d > slack || d < -slack && !countDenied {
						t.Fatalf("check %d, %d hits: Reset with the cache %d, Redis alone %d", i, hits, c.Reset, p.Reset)
					}
					last = p
				}
				if n := cached.LocalDenials() - before; n < 50 {
					t.Fatalf("the cache answered %d of 600 checks: the run did not test it", n)
				} else {
					t.Logf("the cache answered %d of 600 checks", n)
				}
			})
		}
	}
}

// A key over its limit costs no round trip while it stays over: checks of a
// hot key from many goroutines reach Redis about once with the cache, once
// per check without. Redis counts what it ran in INFO commandstats: each
// check's script reads its key once (GET), however many checks a script
// run carries (EVALSHA).
func TestRedisDenyCacheSavesRoundTrips(t *testing.T) {
	for _, off := range []bool{false, true} {
		t.Run(fmt.Sprintf("cacheOff=%v", off), func(t *testing.T) {
			srv := redistest.Start(t)
			cfg := RedisConfig{ClockSource: ClockLocal}
			if off {
				cfg.DenyCacheKeys = -1
			}
			s := openTestRedis(t, srv.URL(), cfg)
			it := limit.Item{Key: []byte("hot"), Spec: limit.Spec{Algorithm: limit.SlidingWindow, Limit: 10, Window: int64(time.Minute)}}
			now := int64(1_700_000_000_000_000_000) // one instant: the key stays over
			const workers, each = 8, 200
			var wg sync.WaitGroup
			var mu sync.Mutex
			allowed := 0
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					items, out := []limit.Item{it}, make([]limit.Decision, 1)
					for range each {
						if err := s.CheckAt(context.Background(), now, 1, items, out); err != nil {
							t.Error(err)
							return
						}
						if out[0].Allowed {
							mu.Lock()
							allowed++
							mu.Unlock()
						}
					}
				}()
			}
			wg.Wait()
			if allowed != 10 {
				t.Fatalf("%d of %d checks allowed, want the limit, 10", allowed, workers*each)
			}
			calls, runs := commandCalls(t, srv, "get"), commandCalls(t, srv, "evalsha")
			t.Logf("%d checks, %d keys read in %d script runs, %d answered from the cache", workers*each, calls, runs, s.LocalDenials())
			if off {
				if s.LocalDenials() != 0 || calls < workers*each {
					t.Fatalf("without the cache: %d local answers, %d keys read for %d checks", s.LocalDenials(), calls, workers*each)
				}
				return
			}
			// Checks already queued when the first denial came back still
			// go to Redis; after that, none.
			if got := s.LocalDenials(); got < workers*each-200 {
				t.Fatalf("%d of %d checks answered from the cache", got, workers*each)
			}
			if calls > 200 {
				t.Fatalf("%d keys read by Redis for %d checks of a key over its limit", calls, workers*each)
			}
		})
	}
}

// commandCalls is how many times srv ran command cmd (lower case), from
// INFO commandstats; a script's calls count too.
func commandCalls(t *testing.T, srv *redistest.Server, cmd string) int {
	t.Helper()
	info, err := srv.Do("INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls=")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
		if err != nil {
			t.Fatalf("commandstats line %q: %v", line, err)
		}
		return n
	}
	return 0
}

// A cached denial is for its limit only: the same key under a larger limit
// (a rule reload, a partition's share lifted) goes to Redis.
func TestRedisDenyCacheKeyedByLimit(t *testing.T) {
	srv := redistest.Start(t)
	s := openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal})
	now := int64(1_700_000_000_000_000_000)
	it := limit.Item{Key: []byte("reload"), Spec: limit.Spec{Algorithm: limit.FixedWindow, Limit: 1, Window: int64(time.Minute)}}
	out := make([]limit.Decision, 1)
	for i, want := range []bool{true, false, false} {
		if err := s.CheckAt(context.Background(), now, 1, []limit.Item{it}, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Allowed != want {
			t.Fatalf("check %d: allowed %v, want %v", i, out[0].Allowed, want)
		}
	}
	if s.LocalDenials() != 1 {
		t.Fatalf("%d local denials, want 1 (the third check)", s.LocalDenials())
	}
	it.Spec.Limit = 2
	if err := s.CheckAt(context.Background(), now, 1, []limit.Item{it}, out); err != nil {
		t.Fatal(err)
	}
	if !out[0].Allowed {
		t.Fatalf("a limit raised to 2 denied its second hit: %+v", out[0])
	}
}

// The cache holds at most its size, and replaces the entry that ends first.
func TestDenyCacheBounded(t *testing.T) {
	c := newDenyCache(16)
	if got := len(c.sets) * denyWays; got != 16 {
		t.Fatalf("%d entries for a size of 16", got)
	}
	sp := limit.Spec{Algorithm: limit.GCRA, Limit: 1, Window: int64(time.Second)}
	for i := range 1000 {
		it := limit.Item{Key: fmt.Appendf(nil, "k%d", i), Spec: sp}
		c.note(0, &it, &limit.Decision{RetryAfter: int64(1000 + i), Reset: 5})
	}
	held := 0
	for i := range 1000 {
		it := limit.Item{Key: fmt.Appendf(nil, "k%d", i), Spec: sp}
		var d limit.Decision
		if c.lookup(1, &it, &d) {
			held++
			if d.RetryAfter != int64(1000+i)-1 || d.Reset != 4 || d.Allowed || d.Remaining != 0 {
				t.Fatalf("key %d: %+v", i, d)
			}
		}
	}
	if held == 0 || held > 16 {
		t.Fatalf("%d keys held by a cache of 16", held)
	}
}

// Lookups and inserts allocate nothing.
func TestDenyCacheAllocs(t *testing.T) {
	c := newDenyCache(0)
	it := limit.Item{Key: []byte("k"), Spec: limit.Spec{Algorithm: limit.SlidingWindow, Limit: 1, Window: int64(time.Second)}}
	d := limit.Decision{RetryAfter: int64(time.Second)}
	if n := testing.AllocsPerRun(100, func() {
		c.note(0, &it, &d)
		var got limit.Decision
		c.lookup(1, &it, &got)
	}); n != 0 {
		t.Fatalf("%v allocations a note and lookup", n)
	}
}

func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// Checks of a key over its limit, from many goroutines: answered from the
// cache (cache=on) or by Redis (cache=off).
func BenchmarkRedisDeniedHotKey(b *testing.B) {
	for _, on := range []bool{true, false} {
		b.Run(fmt.Sprintf("cache=%v", on), func(b *testing.B) {
			srv := redistest.Start(b)
			cfg := RedisConfig{ClockSource: ClockLocal}
			if !on {
				cfg.DenyCacheKeys = -1
			}
			s := openTestRedis(b, srv.URL(), cfg)
			it := limit.Item{Key: []byte("hot"), Spec: limit.Spec{Algorithm: limit.SlidingWindow, Limit: 1, Window: int64(time.Hour)}}
			now := time.Now().UnixNano()
			b.ReportAllocs()
			b.SetParallelism(benchParallelism)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				items, out := []limit.Item{it}, make([]limit.Decision, 1)
				for pb.Next() {
					if err := s.CheckAt(context.Background(), now, 1, items, out); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
}
