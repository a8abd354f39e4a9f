package store

import (
	"context"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/store/redistest"
)

// A 1000/hour key on a real redis-server, spent, then Redis killed (the
// breaker opens, the embedded store decides), then Redis restarted empty:
// the key is admitted 1000 times in all. Before, each phase re-granted the
// whole limit (1000, then 1000, then 1000): the embedded store had never seen
// the key, and the empty Redis had forgotten it.
func TestFallbackReconcilesWithRedis(t *testing.T) {
	srv := redistest.Start(t)
	rs := openTestRedis(t, srv.URL(), RedisConfig{Timeout: 50 * time.Millisecond, ClockSource: ClockLocal})
	mem := NewMemory(MemoryConfig{})
	f := NewFallback(rs, mem, FallbackConfig{Failures: 3, Cooldown: 100 * time.Millisecond})
	for _, alg := range []limit.Algorithm{limit.SlidingWindow, limit.FixedWindow, limit.TokenBucket, limit.GCRA} {
		t.Run(alg.String(), func(t *testing.T) {
			items := []limit.Item{{Key: []byte("reconcile:" + alg.String()), Spec: limit.Spec{Algorithm: alg, Limit: 1000, Window: int64(time.Hour)}}}
			out := make([]limit.Decision, 1)
			phase := func(name string) int {
				admitted := 0
				for range 1500 {
					if err := f.CheckAt(context.Background(), time.Now().UnixNano(), 1, items, out); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					if out[0].Allowed {
						admitted++
					}
				}
				return admitted
			}
			first := phase("redis up")
			srv.Kill()
			outage := phase("redis down")
			srv.Restart()
			time.Sleep(150 * time.Millisecond) // the breaker's cooldown: the probe reaches the new Redis
			empty := phase("redis restarted empty")
			t.Logf("admitted %d with Redis up, %d while it was down, %d after it restarted empty", first, outage, empty)
			if first != 1000 || outage > 1 || empty > 1 {
				t.Fatalf("admitted %d, then %d while Redis was down, then %d once it restarted empty; want 1000, 0, 0", first, outage, empty)
			}
			// Redis itself was given the count back: a server without local
			// knowledge (a fresh embedded store) is denied too.
			f.seeds.Wait() // the seeds run in the background
			other := NewFallback(rs, NewMemory(MemoryConfig{}), FallbackConfig{})
			if err := other.CheckAt(context.Background(), time.Now().UnixNano(), 1, items, out); err != nil || out[0].Allowed {
				t.Fatalf("another server was allowed after the reconcile (%v): Redis was not given the count back", err)
			}
		})
	}
}
