package store

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/limit/limittest"
)

func TestMemoryTable(t *testing.T) {
	limittest.Run(t, func(*testing.T) limittest.Store { return NewMemory(MemoryConfig{}) })
}

// Many goroutines hammering one key admit exactly the limit.
func TestMemoryConcurrentExact(t *testing.T) {
	s := NewMemory(MemoryConfig{})
	now := limittest.T0.UnixNano()
	for _, alg := range []limit.Algorithm{limit.SlidingWindow, limit.FixedWindow, limit.TokenBucket, limit.GCRA, limit.SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			items := []limit.Item{
				{Key: []byte("hot:" + alg.String()), Spec: limit.Spec{Algorithm: alg, Limit: 1000, Window: int64(time.Hour)}},
				{Key: []byte("wide:" + alg.String()), Spec: limit.Spec{Algorithm: alg, Limit: 1000, Window: int64(time.Hour)}},
			}
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					out := make([]limit.Decision, 2)
					its := items[:1+g%2] // half the goroutines also match the second limit
					for range 400 {
						if err := s.CheckAt(context.Background(), now, 1, its, out); err != nil {
							t.Error(err)
							return
						}
						if limit.Admit(its, out) {
							admitted.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			if got := admitted.Load(); got != 1000 {
				t.Fatalf("admitted %d of 3200 against a limit of 1000", got)
			}
		})
	}
}

// The store stays bounded under a flood of distinct keys, reclaims idle keys
// first, and counts every live key it had to evict.
func TestMemoryBoundedEviction(t *testing.T) {
	s := NewMemory(MemoryConfig{MaxKeys: 4 * shardCount})
	spec := limit.Spec{Algorithm: limit.FixedWindow, Limit: 10, Window: int64(time.Second)}
	out := make([]limit.Decision, 1)
	check := func(now int64, key string) {
		if err := s.CheckAt(context.Background(), now, 1, []limit.Item{{Key: []byte(key), Spec: spec}}, out); err != nil {
			t.Fatal(err)
		}
	}
	t0 := limittest.T0.UnixNano()
	for i := range 10000 {
		check(t0, fmt.Sprint("flood-", i))
	}
	st := s.Stats()
	if st.Keys > 4*shardCount {
		t.Fatalf("store holds %d keys, bound is %d", st.Keys, 4*shardCount)
	}
	if st.EvictedLive == 0 || st.EvictedIdle != 0 {
		t.Fatalf("flood within one window must evict live keys only, got %+v", st)
	}
	// One window later every key is idle: new keys reclaim them without a live eviction.
	live := st.EvictedLive
	t1 := t0 + int64(2*time.Second)
	// Up to 4 new keys per shard: each shard's flood keys are all idle now.
	perShard := map[int]int{}
	later := 0
	for i := 0; later < 3*shardCount; i++ {
		k := fmt.Sprint("later-", i)
		if sh := int(s.hash([]byte(k)) >> 56); perShard[sh] < 4 {
			perShard[sh]++
			later++
			check(t1, k)
		}
	}
	st = s.Stats()
	if st.EvictedLive != live || st.EvictedIdle != uint64(later) {
		t.Fatalf("idle keys must be reclaimed first, got %+v (live before %d)", st, live)
	}
	if n := s.SweepAt(t1 + int64(2*time.Second)); n == 0 || s.Len() != 0 {
		t.Fatalf("sweep removed %d, %d keys left", n, s.Len())
	}
}

// A key still counting survives while the store has room, however many
// other keys come and go.
func TestMemoryKeepsCountingKeys(t *testing.T) {
	s := NewMemory(MemoryConfig{MaxKeys: 64 * shardCount})
	spec := limit.Spec{Algorithm: limit.FixedWindow, Limit: 3, Window: int64(time.Minute)}
	out := make([]limit.Decision, 1)
	hot := []limit.Item{{Key: []byte("hot"), Spec: spec}}
	t0 := limittest.T0.UnixNano()
	for i := range 3 {
		_ = s.CheckAt(context.Background(), t0+int64(i), 1, hot, out)
	}
	for i := range 5000 { // short-lived keys on a one-second window churn past
		now := t0 + int64(i)*int64(time.Millisecond)
		_ = s.CheckAt(context.Background(), now, 1, []limit.Item{{Key: fmt.Append(nil, "churn-", i),
			Spec: limit.Spec{Algorithm: limit.FixedWindow, Limit: 3, Window: int64(time.Second)}}}, out)
		if i%1000 == 0 {
			s.SweepAt(now)
		}
	}
	_ = s.CheckAt(context.Background(), t0+int64(10*time.Second), 1, hot, out)
	if out[0].Allowed {
		t.Fatal("hot key was reset: a 4th hit within its minute was allowed")
	}
}

// BenchmarkMemoryCheck is one decision on the embedded store: one limit, a hot
// key or 1M keys in a fixed pseudo-random order (as real traffic defeats the
// cache), serial and parallel. The key is built in a reused buffer, as the
// engine builds it, so the benchmark measures the store and not a key array.
func BenchmarkMemoryCheck(b *testing.B) {
	spec := limit.Spec{Algorithm: limit.SlidingWindow, Limit: 1 << 40, Window: int64(time.Minute)}
	key := func(dst []byte, i uint32) []byte {
		return strconv.AppendUint(append(dst[:0], "bench:"...), uint64(i), 10)
	}
	for _, c := range []struct {
		keys    uint32
		durable bool // with a driver taking the changes every 100ms, as a PoP does
	}{{1, false}, {1, true}, {1 << 20, false}, {1 << 20, true}} {
		keys := c.keys
		s := NewMemory(MemoryConfig{MaxKeys: 2 << 20, Durable: c.durable})
		now := limittest.T0.UnixNano()
		out := make([]limit.Decision, 1)
		var buf []byte
		for i := range keys {
			buf = key(buf, i)
			_ = s.CheckAt(context.Background(), now, 1, []limit.Item{{Key: buf, Spec: spec}}, out)
		}
		s.TakeStates()
		runtime.GC() // the million inserts' garbage is not the checks' cost
		name := fmt.Sprintf("keys=%d", keys)
		if c.durable {
			name += "/durable"
			stop := make(chan struct{})
			go func() {
				for {
					select {
					case <-stop:
						return
					case <-time.After(100 * time.Millisecond):
						s.TakeStates()
					}
				}
			}()
			defer close(stop)
		}
		run := func(pb interface{ Next() bool }, seed uint32) {
			items := []limit.Item{{Spec: spec}}
			out := make([]limit.Decision, 1)
			var buf []byte
			x := seed
			for pb.Next() {
				x ^= x << 13
				x ^= x >> 17
				x ^= x << 5
				buf = key(buf, x%keys)
				items[0].Key = buf
				_ = s.CheckAt(context.Background(), now, 1, items, out)
			}
		}
		b.Run(name+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			run(loop{b}, 1)
		})
		b.Run(name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			var seed atomic.Uint32
			b.RunParallel(func(pb *testing.PB) { run(pb, seed.Add(0x9E3779B9)|1) })
		})
	}
}

type loop struct{ b *testing.B }

func (l loop) Next() bool { return l.b.Loop() }

// BenchmarkMemoryLatencyFloor is the baseline for BenchmarkMemoryCheck with 1M
// keys: a read-modify-write of one random slot in an array the size of the
// store's tables at that load (2²¹ slots of the same size), with nothing else.
// Each check can be no faster than this on the same machine; report the ratio.
func BenchmarkMemoryLatencyFloor(b *testing.B) {
	slots := make([]slot, 1<<21)
	run := func(pb interface{ Next() bool }, x uint32) {
		for pb.Next() {
			x ^= x << 13
			x ^= x >> 17
			x ^= x << 5
			slots[x&(1<<21-1)].st.Cur++
		}
	}
	b.Run("independent", func(b *testing.B) { run(loop{b}, 1) })
	// Each address depends on the last load, as a check's access cannot
	// overlap the next across its lock: this is the memory latency itself.
	b.Run("dependent", func(b *testing.B) {
		x := uint32(1)
		for b.Loop() {
			x ^= x << 13
			x ^= x >> 17
			x ^= x << 5
			sl := &slots[(x+uint32(slots[x&(1<<21-1)].st.Cur&1))&(1<<21-1)]
			sl.st.Cur++
			x += uint32(sl.st.Cur & 1)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		var seed atomic.Uint32
		b.RunParallel(func(pb *testing.PB) { run(pb, seed.Add(0x9E3779B9)|1) })
	})
}

// A key at its limit survives a flood of new keys past MaxKeys (the probe of
// issue 12: 2M distinct keys past --max-keys 100000 evicted live keys 10.4M
// times, and a key at its 50/hour limit was admitted 324 more times).
// Checked every thousand flood keys, the hot key is looked up more often than
// any flood key, so no flood key takes its place.
func TestMemoryFloodKeepsHotKey(t *testing.T) {
	s := NewMemory(MemoryConfig{MaxKeys: 100000})
	hour := limit.Spec{Algorithm: limit.SlidingWindow, Limit: 50, Window: int64(time.Hour)}
	hot := []limit.Item{{Key: []byte("hot"), Spec: hour}}
	out := make([]limit.Decision, 1)
	now := limittest.T0.UnixNano()
	check := func(items []limit.Item) bool {
		now++
		if err := s.CheckAt(context.Background(), now, 1, items, out); err != nil {
			t.Fatal(err)
		}
		return out[0].Allowed
	}
	for range 50 {
		if !check(hot) {
			t.Fatal("the hot key was denied within its limit")
		}
	}
	flood := []limit.Item{{Spec: hour}}
	admittedHot := 0
	for i := range 2_000_000 {
		flood[0].Key = strconv.AppendInt(flood[0].Key[:0], int64(i), 10)
		check(flood)
		if i%1000 == 0 && check(hot) {
			admittedHot++
		}
	}
	st := s.Stats()
	t.Logf("after the flood: %+v", st)
	if admittedHot != 0 {
		t.Fatalf("the hot key at its limit was admitted %d more times during the flood", admittedHot)
	}
	if st.Keys > 100000+shardCount {
		t.Fatalf("store holds %d keys, bound is about 100000", st.Keys)
	}
	if st.Untracked == 0 {
		t.Fatal("a flood past MaxKeys decided no key untracked")
	}
}
