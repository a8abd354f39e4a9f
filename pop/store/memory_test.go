package store

import (
	"context"
	"fmt"
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
		if sh := s.shardOf([]byte(k)); perShard[sh] < 4 {
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
