package store

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/deploy/lab/faultnet"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/store/redistest"
)

// The last hit of a fixed window of 5 on a real redis-server behind a slow
// link, checked twice at once: check a is answered by Redis (admitted, the
// window full), check b gives up first (its context's deadline) and the
// embedded store answers it on what it mirrored, which does not yet know of
// a. Only one of them may be admitted. Before, reconcile let Redis's
// answer to a stand when Redis reported one hit more room than the embedded
// store knew of, so both were: 6 of 5 — the soak's Redis PoPs admitted 51 of
// 50 on pop-scope fixed windows that way, with checks timing out into the
// fallback under load.
func TestFallbackTimeoutsKeepFixedWindows(t *testing.T) {
	srv := redistest.Start(t)
	link, err := faultnet.NewProxy(strings.TrimPrefix(srv.URL(), "redis://"))
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	for _, clock := range []ClockSource{ClockRedis, ClockLocal} {
		t.Run(clock.String(), func(t *testing.T) {
			link.Delay(0)
			rs := openTestRedis(t, "redis://"+link.Addr(), RedisConfig{Timeout: 2 * time.Second, ClockSource: clock})
			f := NewFallback(rs, NewMemory(MemoryConfig{}), FallbackConfig{})
			items := []limit.Item{{Key: []byte("fw:" + clock.String()), Spec: limit.Spec{Algorithm: limit.FixedWindow, Limit: 5, Window: int64(time.Hour)}}}
			check := func(ctx context.Context) bool {
				out := make([]limit.Decision, 1)
				if err := f.CheckAt(ctx, time.Now().UnixNano(), 1, items, out); err != nil {
					t.Error(err)
				}
				return out[0].Allowed
			}
			admitted := 0
			for range 4 {
				if check(context.Background()) {
					admitted++
				}
			}
			link.Delay(100 * time.Millisecond)
			a := make(chan bool)
			go func() { a <- check(context.Background()) }()
			time.Sleep(20 * time.Millisecond) // a is on its way to Redis
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
			if check(ctx) {
				admitted++
			}
			cancel()
			if <-a {
				admitted++
			}
			if st := f.Stats(); st.PrimaryErrors != 1 {
				t.Fatalf("%d primary errors, want 1: check b did not time out into the embedded store as the test means", st.PrimaryErrors)
			}
			link.Delay(0)
			if admitted != 5 {
				t.Errorf("admitted %d of a fixed window of 5", admitted)
			}
			if check(context.Background()) {
				t.Errorf("a 7th check was admitted")
			}
		})
	}
}

// With ClockRedis the Redis server's clock sets window boundaries; the
// embedded store must count in the same windows, both when it mirrors
// Redis's answers and when it decides without Redis. Here Redis's clock is
// 100 ms ahead of the PoP's: a fixed window of 5 per second is spent through
// Redis 50 ms before a boundary of the PoP's clock (50 ms after one of
// Redis's), then Redis goes away and, 100 ms later, the embedded store
// decides — still inside the same window of Redis's clock, so nothing more
// may be admitted.
func TestFallbackCountsInRedisWindows(t *testing.T) {
	srv := redistest.Start(t)
	rs := openTestRedis(t, srv.URL(), RedisConfig{Timeout: 50 * time.Millisecond, ClockSource: ClockRedis, ClockInterval: time.Hour})
	rs.offset.Store(int64(100 * time.Millisecond)) // as if measured: Redis is 100 ms ahead
	f := NewFallback(rs, NewMemory(MemoryConfig{}), FallbackConfig{Failures: 1, Cooldown: time.Hour})
	items := []limit.Item{{Key: []byte("fw"), Spec: limit.Spec{Algorithm: limit.FixedWindow, Limit: 5, Window: int64(time.Second)}}}
	out := make([]limit.Decision, 1)
	boundary := (time.Now().UnixNano()/int64(time.Second) + 1) * int64(time.Second) // of the PoP's clock
	admitted := 0
	at := boundary - int64(50*time.Millisecond)
	for range 5 {
		if err := f.CheckAt(context.Background(), at, 1, items, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Allowed {
			admitted++
		}
	}
	if admitted != 5 || f.Stats().PrimaryDecisions != 5 {
		t.Fatalf("Redis admitted %d of 5 (stats %+v)", admitted, f.Stats())
	}
	srv.Kill()
	at += int64(100 * time.Millisecond) // the PoP's next window, Redis's same one
	for range 5 {
		if err := f.CheckAt(context.Background(), at, 1, items, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Allowed {
			admitted++
		}
	}
	if f.Stats().FallbackDecisions == 0 {
		t.Fatalf("no check was decided by the embedded store: %+v", f.Stats())
	}
	if admitted != 5 {
		t.Errorf("admitted %d in one window of 5 of Redis's clock: the embedded store counted in its own windows", admitted)
	}
}
