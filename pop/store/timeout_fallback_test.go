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
