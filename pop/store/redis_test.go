package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/limit/limittest"
	"github.com/edgelimit/edgelimit/pop/store/redistest"
)

// testTimeout is generous: tests run under -race on a shared 2-core machine,
// and what they check is the answer, not the latency (the kill test checks that).
const testTimeout = 2 * time.Second

func openTestRedis(t testing.TB, url string, cfg RedisConfig) *Redis {
	t.Helper()
	cfg.URL = url
	if cfg.Timeout == 0 {
		cfg.Timeout = testTimeout
	}
	s, err := OpenRedis(cfg)
	if err != nil {
		t.Fatalf("OpenRedis(%q): %v", url, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func TestRedisTable(t *testing.T) {
	srv := redistest.Start(t)
	s := openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal})
	limittest.Run(t, func(*testing.T) limittest.Store { return s })
}

func TestRedisClusterTable(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	url := nodes[0].Addr + "," + nodes[1].Addr + "," + nodes[2].Addr
	s := openTestRedis(t, url, RedisConfig{ClockSource: ClockLocal})
	if !s.cluster {
		t.Fatal("a comma-separated URL must open a Cluster client")
	}
	limittest.Run(t, func(*testing.T) limittest.Store { return s })
}

// A request whose items span Cluster slots goes through peek then decide; it
// must still spend nothing when denied and count everything when admitted.
func TestRedisClusterMultiSlot(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	s := openTestRedis(t, nodes[0].Addr+","+nodes[1].Addr, RedisConfig{ClockSource: ClockLocal})
	// keySlot must agree with the server, or same-slot grouping breaks.
	for i := range 50 {
		it := limit.Item{Key: fmt.Appendf(nil, "slot-%d", i)}
		got, err := nodes[0].Do("CLUSTER", "KEYSLOT", string(appendRedisKey(nil, &it)))
		if err != nil {
			t.Fatal(err)
		}
		if want := strconv.Itoa(keySlot(it.Key)); got != want {
			t.Fatalf("key %q: server slot %s, keySlot %s", it.Key, got, want)
		}
	}
	run := time.Now().UnixNano()
	// Find two keys in different slots.
	a := fmt.Appendf(nil, "multi:%d:a", run)
	var b []byte
	for i := 0; ; i++ {
		b = fmt.Appendf(nil, "multi:%d:b%d", run, i)
		if keySlot(b) != keySlot(a) {
			break
		}
	}
	minute := int64(time.Minute)
	items := []limit.Item{
		{Key: a, Spec: limit.Spec{Algorithm: limit.FixedWindow, Limit: 100, Window: minute}},
		{Key: b, Spec: limit.Spec{Algorithm: limit.FixedWindow, Limit: 2, Window: minute}},
	}
	now := limittest.T0.UnixNano()
	out := make([]limit.Decision, 2)
	admitted := 0
	for range 5 {
		if err := s.CheckAt(context.Background(), now, 1, items, out); err != nil {
			t.Fatal(err)
		}
		if limit.Admit(items, out) {
			admitted++
		}
	}
	if admitted != 2 {
		t.Fatalf("admitted %d, want 2", admitted)
	}
	want := []limit.Decision{
		{Allowed: true, Remaining: 98, Reset: minute},
		{Allowed: false, Remaining: 0, RetryAfter: minute, Reset: minute},
	}
	for i := range want {
		if out[i] != want[i] {
			t.Errorf("item %d: got %+v, want %+v", i, out[i], want[i])
		}
	}
}

var allAlgorithms = []limit.Algorithm{limit.SlidingWindow, limit.FixedWindow, limit.TokenBucket, limit.GCRA, limit.SlidingLog}

// Goroutines spread over three separate store clients, all on one key, admit
// exactly the limit, for every algorithm; half of them also match a second
// limit in the same request.
func TestRedisConcurrentExact(t *testing.T) {
	srv := redistest.Start(t)
	stores := []*Redis{
		openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal}),
		openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal}),
		openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal}),
	}
	run := time.Now().UnixNano()
	now := limittest.T0.UnixNano()
	const limitN, goroutines, perG = 300, 12, 60
	for _, alg := range allAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			spec := limit.Spec{Algorithm: alg, Limit: limitN, Window: int64(time.Hour)}
			items := []limit.Item{
				{Key: fmt.Appendf(nil, "hot:%d:%s", run, alg), Spec: spec},
				{Key: fmt.Appendf(nil, "wide:%d:%s", run, alg), Spec: spec},
			}
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s := stores[g%len(stores)]
					out := make([]limit.Decision, 2)
					its := items[:1+g%2]
					for range perG {
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
			if got := admitted.Load(); got != limitN {
				t.Fatalf("admitted %d of %d against a limit of %d", got, goroutines*perG, limitN)
			}
		})
	}
}

// After SCRIPT FLUSH the store answers NOSCRIPT with EVAL and keeps working.
func TestRedisNoScriptRecovery(t *testing.T) {
	srv := redistest.Start(t)
	s := openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal})
	items := []limit.Item{{Key: []byte("noscript"), Spec: limit.Spec{Algorithm: limit.FixedWindow, Limit: 3, Window: int64(time.Minute)}}}
	out := make([]limit.Decision, 1)
	now := limittest.T0.UnixNano()
	check := func(wantAllowed bool) {
		t.Helper()
		if err := s.CheckAt(context.Background(), now, 1, items, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Allowed != wantAllowed {
			t.Fatalf("allowed = %v, want %v (%+v)", out[0].Allowed, wantAllowed, out[0])
		}
	}
	check(true)
	if _, err := srv.Do("SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	if r, _ := srv.Do("SCRIPT", "EXISTS", checkScript.Hash()); r != "0" {
		t.Fatalf("script still cached after SCRIPT FLUSH: %q", r)
	}
	check(true)
	check(true)
	check(false)
	if r, _ := srv.Do("SCRIPT", "EXISTS", checkScript.Hash()); r != "1" {
		t.Fatalf("script not cached again after recovery: %q", r)
	}
}

// Every key the store writes carries a TTL: limit.Spec.IdleAt plus a second.
func TestRedisKeysExpire(t *testing.T) {
	srv := redistest.Start(t)
	s := openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal})
	now := limittest.T0.UnixNano() + int64(15*time.Second) // 15 s into a minute
	minute := int64(time.Minute)
	cases := []struct {
		alg     limit.Algorithm
		wantTTL time.Duration // IdleAt − now after one hit
	}{
		{limit.SlidingWindow, 105 * time.Second}, // cur > 0: window end + one window
		{limit.FixedWindow, 45 * time.Second},    // window end
		{limit.TokenBucket, 6 * time.Second},     // one token back at 10/min
		{limit.GCRA, 6 * time.Second},            // one emission interval
		{limit.SlidingLog, 60 * time.Second},     // the hit leaves the log
	}
	for _, c := range cases {
		it := limit.Item{Key: []byte("ttl:" + c.alg.String()), Spec: limit.Spec{Algorithm: c.alg, Limit: 10, Window: minute}}
		out := make([]limit.Decision, 1)
		if err := s.CheckAt(context.Background(), now, 1, []limit.Item{it}, out); err != nil {
			t.Fatal(err)
		}
		key := string(appendRedisKey(nil, &it))
		r, err := srv.Do("PTTL", key)
		if err != nil {
			t.Fatal(err)
		}
		pttl, err := strconv.ParseInt(r, 10, 64)
		if err != nil {
			t.Fatalf("%s: PTTL %q: %v", c.alg, r, err)
		}
		want := (c.wantTTL + time.Second).Milliseconds()
		if pttl <= 0 || pttl > want || pttl < want-2000 {
			t.Errorf("%s: key %q PTTL = %dms, want about %dms", c.alg, key, pttl, want)
		}
	}
	// An idle key is gone once its TTL ends.
	it := limit.Item{Key: []byte("ttl:short"), Spec: limit.Spec{Algorithm: limit.FixedWindow, Limit: 10, Window: int64(50 * time.Millisecond)}}
	if err := s.CheckAt(context.Background(), limittest.T0.UnixNano(), 1, []limit.Item{it}, make([]limit.Decision, 1)); err != nil {
		t.Fatal(err)
	}
	key := string(appendRedisKey(nil, &it))
	deadline := time.Now().Add(5 * time.Second)
	for {
		r, err := srv.Do("EXISTS", key)
		if err != nil {
			t.Fatal(err)
		}
		if r == "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("key %q still present 5 s after its 50 ms window and 1 s grace", key)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A key outlives its idle time by a grace, so a server whose clock lags the
// Redis clock still finds a full window full after Redis's clock has passed
// the window's end.
func TestRedisExpiryGraceForLaggingClock(t *testing.T) {
	srv := redistest.Start(t)
	s := openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal})
	w := int64(100 * time.Millisecond)
	items := []limit.Item{{Key: fmt.Appendf(nil, "grace:%d", time.Now().UnixNano()), Spec: limit.Spec{Algorithm: limit.FixedWindow, Limit: 2, Window: w}}}
	out := make([]limit.Decision, 1)
	now := time.Now().UnixNano()
	end := limit.WindowStart(now, w) + w
	for range 2 {
		if err := s.CheckAt(context.Background(), now, 1, items, out); err != nil || !out[0].Allowed {
			t.Fatalf("filling the window: %v %+v", err, out[0])
		}
	}
	time.Sleep(time.Duration(end-now) + 100*time.Millisecond) // Redis's clock is well past the window's end
	if err := s.CheckAt(context.Background(), end-1, 1, items, out); err != nil {
		t.Fatal(err)
	}
	if out[0].Allowed {
		t.Fatal("a server lagging 100 ms found its full window empty: the key expired at the window's end")
	}
}

// Bad input gets a clear error, not a wrong answer.
func TestRedisRejectsBadInput(t *testing.T) {
	srv := redistest.Start(t)
	s := openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal})
	now := limittest.T0.UnixNano()
	ok := limit.Spec{Algorithm: limit.FixedWindow, Limit: 1, Window: int64(time.Second)}
	for name, c := range map[string]struct {
		now, hits int64
		spec      limit.Spec
		out       int
	}{
		"zero hits":      {now, 0, ok, 1},
		"short out":      {now, 1, ok, 0},
		"before epoch":   {-1, 1, ok, 1},
		"zero window":    {now, 1, limit.Spec{Algorithm: limit.FixedWindow, Limit: 1}, 1},
		"tiny window":    {now, 1, limit.Spec{Algorithm: limit.SlidingWindow, Limit: 1, Window: 100}, 1},
		"huge log limit": {now, 1, limit.Spec{Algorithm: limit.SlidingLog, Limit: limit.MaxLogLimit + 1, Window: 1e9}, 1},
	} {
		err := s.CheckAt(context.Background(), c.now, c.hits, []limit.Item{{Key: []byte("bad"), Spec: c.spec}}, make([]limit.Decision, c.out))
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// A check against a hung server fails by its deadline with ErrTimeout, and a
// closed store says so.
func TestRedisDeadlineAndClose(t *testing.T) {
	srv := redistest.Start(t)
	s := openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal, Timeout: 50 * time.Millisecond})
	items := []limit.Item{{Key: []byte("deadline"), Spec: limit.Spec{Algorithm: limit.FixedWindow, Limit: 1, Window: int64(time.Second)}}}
	out := make([]limit.Decision, 1)
	if err := s.CheckAt(context.Background(), limittest.T0.UnixNano(), 1, items, out); err != nil {
		t.Fatal(err) // warm: the connection is up
	}
	srv.Pause()
	defer srv.Resume()
	start := time.Now()
	err := s.CheckAt(context.Background(), limittest.T0.UnixNano(), 1, items, out)
	took := time.Since(start)
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	if took > 50*time.Millisecond+100*time.Millisecond {
		t.Fatalf("a 50ms deadline took %v", took)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckAt(context.Background(), limittest.T0.UnixNano(), 1, items, out); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: err = %v, want ErrClosed", err)
	}
}

// Two servers whose clocks are 300 ms ahead and 300 ms behind share one
// Redis with ClockRedis: hammering one fixed-window key across a window
// boundary, together they admit exactly the limit in each window. (Without
// the Redis clock the leading server would open the next window 300 ms early
// and the lagging one would count into it: one window's worth in total.)
func TestRedisClockSkew(t *testing.T) {
	srv := redistest.Start(t)
	skews := []time.Duration{300 * time.Millisecond, -300 * time.Millisecond}
	var stores []*Redis
	for _, skew := range skews {
		s := openTestRedis(t, srv.URL(), RedisConfig{
			Clock: func() int64 { return time.Now().Add(skew).UnixNano() },
		})
		off, ok := s.ClockOffset()
		if !ok {
			t.Fatal("clock offset not measured at open")
		}
		// redis-server runs on this machine: its clock is ours.
		if d := off + skew; d < -10*time.Millisecond || d > 10*time.Millisecond {
			t.Fatalf("skew %v: measured offset %v", skew, off)
		}
		stores = append(stores, s)
	}
	const limitN = 30
	window := time.Second
	key := fmt.Appendf(nil, "skew:%d", time.Now().UnixNano())
	items := []limit.Item{{Key: key, Spec: limit.Spec{Algorithm: limit.FixedWindow, Limit: limitN, Window: int64(window)}}}

	// The first window boundary at least 400 ms away; hammer from 250 ms
	// before it to 250 ms after.
	boundary := time.Now().Add(400 * time.Millisecond).Add(window).Truncate(window)
	time.Sleep(time.Until(boundary.Add(-250 * time.Millisecond)))
	const ambiguous = 2 * time.Millisecond // the offset estimate's error, generously
	var mu sync.Mutex
	var total, before, after int
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[g%2]
			out := make([]limit.Decision, 1)
			for time.Now().Before(boundary.Add(250 * time.Millisecond)) {
				called := time.Now()
				if err := s.Check(context.Background(), 1, items, out); err != nil {
					t.Error(err)
					return
				}
				returned := time.Now()
				if !out[0].Allowed {
					continue
				}
				mu.Lock()
				total++
				if returned.Before(boundary.Add(-ambiguous)) {
					before++
				}
				if called.After(boundary.Add(ambiguous)) {
					after++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	t.Logf("admitted %d: %d clearly before the boundary, %d clearly after", total, before, after)
	if total != 2*limitN || before > limitN || after > limitN {
		t.Fatalf("admitted %d (%d before, %d after the boundary), want %d per window", total, before, after, limitN)
	}
}
