package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/limit/limittest"
	"github.com/edgelimit/edgelimit/pop/store/redistest"
)

var errInjected = errors.New("injected primary failure")

// faultStore wraps a store and fails its checks on demand, the way
// pebble's errorfs wraps a filesystem.
type faultStore struct {
	inner Checker
	fail  atomic.Bool
	calls atomic.Int64
	gate  chan struct{} // when set, each call waits for a receive... or a close
}

func (f *faultStore) CheckAt(ctx context.Context, now, hits int64, items []limit.Item, out []limit.Decision) error {
	f.calls.Add(1)
	if f.gate != nil {
		<-f.gate
	}
	if f.fail.Load() {
		return errInjected
	}
	if err := ctx.Err(); err != nil { // as Redis does for a caller that left
		return err
	}
	return f.inner.CheckAt(ctx, now, hits, items, out)
}

// TestFallbackCallerGone: a check whose caller gave up while the primary had
// it is no store error and gets no fallback answer (nobody waits for it, and
// the secondary would count a request that is never served); the breaker
// stays closed however many callers leave.
func TestFallbackCallerGone(t *testing.T) {
	primary := &faultStore{inner: NewMemory(MemoryConfig{}), gate: make(chan struct{})}
	secondary := NewMemory(MemoryConfig{})
	f := NewFallback(primary, secondary, FallbackConfig{Failures: 1})
	items := []limit.Item{{Key: []byte("k"), Spec: limit.Spec{Algorithm: limit.FixedWindow, Limit: 10, Window: int64(time.Hour)}}}
	now := limittest.T0.UnixNano()
	for range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- f.CheckAt(ctx, now, 1, items, make([]limit.Decision, 1)) }()
		cancel()
		primary.gate <- struct{}{}
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("CheckAt of a caller that left returned %v, want context.Canceled", err)
		}
	}
	st := f.Stats()
	if st.PrimaryErrors != 0 || st.FallbackDecisions != 0 || st.State != BreakerClosed || secondary.Len() != 0 {
		t.Fatalf("after callers left: %+v, secondary holds %d keys; want no errors, no fallback, closed, empty", st, secondary.Len())
	}
}

// fakeClock is a settable breaker clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestFallbackTableOverMemory(t *testing.T) {
	limittest.Run(t, func(*testing.T) limittest.Store {
		return NewFallback(NewMemory(MemoryConfig{}), NewMemory(MemoryConfig{}), FallbackConfig{})
	})
}

// The breaker walks closed → open → half-open → open → half-open → closed.
func TestFallbackBreaker(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	primary := &faultStore{inner: NewMemory(MemoryConfig{})}
	f := NewFallback(primary, NewMemory(MemoryConfig{}), FallbackConfig{Failures: 3, Cooldown: time.Second, Now: clock.Now})
	items := []limit.Item{{Key: []byte("k"), Spec: limit.Spec{Algorithm: limit.FixedWindow, Limit: 1000, Window: int64(time.Hour)}}}
	out := make([]limit.Decision, 1)
	now := limittest.T0.UnixNano()
	check := func() {
		t.Helper()
		if err := f.CheckAt(context.Background(), now, 1, items, out); err != nil {
			t.Fatalf("CheckAt returned %v: a primary error must never reach the caller", err)
		}
		if !out[0].Allowed {
			t.Fatalf("denied: %+v", out[0])
		}
	}
	wantState := func(want BreakerState, primaryCalls int64) {
		t.Helper()
		f.seeds.Wait() // reconcile's seeds run in the background
		if got := f.BreakerState(); got != want {
			t.Fatalf("breaker %v, want %v", got, want)
		}
		if got := primary.calls.Load(); got != primaryCalls {
			t.Fatalf("primary called %d times, want %d", got, primaryCalls)
		}
	}

	check()
	wantState(BreakerClosed, 1)
	primary.fail.Store(true)
	check()
	check() // two failures: still closed
	wantState(BreakerClosed, 3)
	primary.fail.Store(false)
	check() // a success resets the count, and gives the primary the 2 hits it missed
	wantState(BreakerClosed, 5)
	primary.fail.Store(true)
	check()
	check()
	wantState(BreakerClosed, 7)
	check() // third in a row
	wantState(BreakerOpen, 8)
	for range 10 {
		check() // open: the primary is not asked
	}
	wantState(BreakerOpen, 8)

	clock.Advance(time.Second)
	check() // the probe fails: open again for a cooldown
	wantState(BreakerOpen, 9)
	clock.Advance(999 * time.Millisecond)
	check()
	wantState(BreakerOpen, 9)
	clock.Advance(time.Millisecond)
	primary.fail.Store(false)
	check() // the probe succeeds, and the primary gets the 15 hits it missed
	wantState(BreakerClosed, 11)
	check()
	wantState(BreakerClosed, 12)

	f.seeds.Wait()
	st := f.Stats()
	want := FallbackStats{PrimaryDecisions: 4, PrimaryErrors: 6, FallbackDecisions: 17, BreakerOpens: 1, State: BreakerClosed, ReconciledHits: 17}
	if st != want {
		t.Fatalf("stats %+v, want %+v", st, want)
	}
}

// While half-open, exactly one check probes the primary; the rest are
// answered by the secondary at once.
func TestFallbackOneProbe(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	primary := &faultStore{inner: NewMemory(MemoryConfig{})}
	f := NewFallback(primary, NewMemory(MemoryConfig{}), FallbackConfig{Failures: 1, Cooldown: time.Second, Now: clock.Now})
	items := []limit.Item{{Key: []byte("k"), Spec: limit.Spec{Algorithm: limit.FixedWindow, Limit: 1000, Window: int64(time.Hour)}}}
	now := limittest.T0.UnixNano()
	primary.fail.Store(true)
	_ = f.CheckAt(context.Background(), now, 1, items, make([]limit.Decision, 1))
	if f.BreakerState() != BreakerOpen {
		t.Fatalf("breaker %v, want open", f.BreakerState())
	}
	primary.fail.Store(false)
	primary.gate = make(chan struct{})
	clock.Advance(time.Second)
	probeDone := make(chan error)
	go func() { probeDone <- f.CheckAt(context.Background(), now, 1, items, make([]limit.Decision, 1)) }()
	for primary.calls.Load() != 2 {
		time.Sleep(time.Millisecond)
	}
	if f.BreakerState() != BreakerHalfOpen {
		t.Fatalf("breaker %v during the probe, want half_open", f.BreakerState())
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f.CheckAt(context.Background(), now, 1, items, make([]limit.Decision, 1)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait() // none of them waits on the blocked probe
	if got := primary.calls.Load(); got != 2 {
		t.Fatalf("primary called %d times while half-open, want 2 (one probe)", got)
	}
	close(primary.gate)
	if err := <-probeDone; err != nil {
		t.Fatal(err)
	}
	if f.BreakerState() != BreakerClosed {
		t.Fatalf("breaker %v after a good probe, want closed", f.BreakerState())
	}
}

// While the primary is unusable a request with a fail-closed item is denied,
// and spends nothing on the secondary; other requests keep being limited.
func TestFallbackFailClosed(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	primary := &faultStore{inner: NewMemory(MemoryConfig{})}
	secondary := NewMemory(MemoryConfig{})
	f := NewFallback(primary, secondary, FallbackConfig{Failures: 1, Cooldown: 2 * time.Second, Now: clock.Now})
	minute := int64(time.Minute)
	login := limit.Item{Key: []byte("login"), Spec: limit.Spec{Algorithm: limit.FixedWindow, Limit: 5, Window: minute}, FailClosed: true}
	user := limit.Item{Key: []byte("user"), Spec: limit.Spec{Algorithm: limit.FixedWindow, Limit: 3, Window: minute}}
	now := limittest.T0.UnixNano()
	out := make([]limit.Decision, 2)

	primary.fail.Store(true)
	// The failing call itself (breaker still closed) already fails closed.
	if err := f.CheckAt(context.Background(), now, 1, []limit.Item{login, user}, out); err != nil {
		t.Fatal(err)
	}
	wantLogin := limit.Decision{Allowed: false, Remaining: 0, Reset: int64(2 * time.Second), RetryAfter: int64(2 * time.Second)}
	wantUser := limit.Decision{Allowed: true, Remaining: 3, Reset: minute} // had room; nothing spent
	if out[0] != wantLogin || out[1] != wantUser {
		t.Fatalf("got %+v, want %+v and %+v", out, wantLogin, wantUser)
	}
	if f.BreakerState() != BreakerOpen {
		t.Fatalf("breaker %v, want open", f.BreakerState())
	}
	for range 3 { // open: still denied, still free
		_ = f.CheckAt(context.Background(), now, 1, []limit.Item{login, user}, out)
		if out[0] != wantLogin || out[1] != wantUser {
			t.Fatalf("open: got %+v", out)
		}
	}
	// The user limit alone is decided on local knowledge: exactly 3 pass.
	admitted := 0
	for range 5 {
		if err := f.CheckAt(context.Background(), now, 1, []limit.Item{user}, out[:1]); err != nil {
			t.Fatal(err)
		}
		if out[0].Allowed {
			admitted++
		}
	}
	if admitted != 3 {
		t.Fatalf("secondary admitted %d, want 3", admitted)
	}
	st := f.Stats()
	if st.FailClosedDenials != 4 || st.FallbackDecisions != 9 || st.PrimaryErrors != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// An invalid check is the caller's problem, not the primary's: it is
// returned, and does not open the breaker.
func TestFallbackInvalidCheckPassesThrough(t *testing.T) {
	srv := redistest.Start(t)
	rs := openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal})
	f := NewFallback(rs, NewMemory(MemoryConfig{}), FallbackConfig{Failures: 1})
	bad := []limit.Item{{Key: []byte("bad"), Spec: limit.Spec{Algorithm: limit.FixedWindow, Limit: 1, Window: 0}}}
	for range 3 {
		err := f.CheckAt(context.Background(), limittest.T0.UnixNano(), 1, bad, make([]limit.Decision, 1))
		if !errors.Is(err, ErrInvalidCheck) {
			t.Fatalf("err = %v, want ErrInvalidCheck", err)
		}
	}
	if f.BreakerState() != BreakerClosed || f.Stats().PrimaryErrors != 0 {
		t.Fatalf("an invalid check counted against the primary: %+v", f.Stats())
	}
}

func TestFallbackTableOverRedis(t *testing.T) {
	srv := redistest.Start(t)
	rs := openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal})
	f := NewFallback(rs, NewMemory(MemoryConfig{}), FallbackConfig{})
	limittest.Run(t, func(*testing.T) limittest.Store { return f })
	if st := f.Stats(); st.PrimaryErrors != 0 || st.FallbackDecisions != 0 {
		t.Fatalf("a healthy primary fell back: %+v", st)
	}
}

// The kill test: under concurrent load, the real redis-server is SIGKILLed.
// No check fails or overruns its deadline, limiting goes on from memory, the
// breaker opens, fail-closed items are denied; after a restart the breaker
// closes again.
func TestFallbackRedisKilled(t *testing.T) {
	const (
		deadline = 25 * time.Millisecond
		// slack covers scheduling on a shared 2-core machine under -race:
		// the fallback itself answers in microseconds. At most one check in
		// a thousand may exceed it, and none may exceed hardCap, which a
		// store that waited on the dead server (a dial, a retry) would.
		slack    = 20 * time.Millisecond
		hardCap  = 100 * time.Millisecond
		cooldown = 200 * time.Millisecond
	)
	srv := redistest.Start(t)
	rs := openTestRedis(t, srv.URL(), RedisConfig{Timeout: deadline})
	f := NewFallback(rs, NewMemory(MemoryConfig{}), FallbackConfig{Cooldown: cooldown})
	run := time.Now().UnixNano()
	minute := int64(time.Minute)
	hotSpec := limit.Spec{Algorithm: limit.SlidingWindow, Limit: 40, Window: minute}
	coldSpec := limit.Spec{Algorithm: limit.TokenBucket, Limit: 1 << 30, Window: minute}

	var (
		stop      atomic.Bool
		errs      atomic.Int64
		slow      atomic.Int64 // over deadline + slack
		tooSlow   atomic.Int64 // over hardCap
		worst     atomic.Int64
		checks    atomic.Int64
		wg        sync.WaitGroup
		firstErr  atomic.Value
		firstSlow atomic.Value
	)
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(run), uint64(g)))
			out := make([]limit.Decision, 2)
			for !stop.Load() {
				items := []limit.Item{
					{Key: fmt.Appendf(nil, "load:%d:%d", run, rng.IntN(1000)), Spec: coldSpec},
					{Key: fmt.Appendf(nil, "load:%d:user%d", run, rng.IntN(50)), Spec: coldSpec},
				}
				start := time.Now()
				err := f.CheckAt(context.Background(), time.Now().UnixNano(), 1, items, out)
				took := time.Since(start)
				checks.Add(1)
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
				if took > deadline+slack {
					slow.Add(1)
					firstSlow.CompareAndSwap(nil, took.String())
				}
				if took > hardCap {
					tooSlow.Add(1)
				}
				for {
					w := worst.Load()
					if int64(took) <= w || worst.CompareAndSwap(w, int64(took)) {
						break
					}
				}
				time.Sleep(200 * time.Microsecond)
			}
		}()
	}
	defer func() { stop.Store(true); wg.Wait() }()

	// hammer checks a fresh key 3× its limit and fails the test unless
	// exactly the limit is admitted — give or take the checks answered by
	// the fallback, which has not seen the key, while the primary, which
	// has, could not answer in time (this machine is shared and slow).
	hammer := func(phase string) {
		t.Helper()
		items := []limit.Item{{Key: fmt.Appendf(nil, "hot:%s:%d", phase, run), Spec: hotSpec}}
		out := make([]limit.Decision, 1)
		admitted := 0
		before := f.Stats()
		for range 3 * hotSpec.Limit {
			if err := f.CheckAt(context.Background(), time.Now().UnixNano(), 1, items, out); err != nil {
				t.Fatalf("%s: CheckAt: %v", phase, err)
			}
			if out[0].Allowed {
				admitted++
			}
		}
		after := f.Stats()
		mixed := 0 // checks answered by the store that did not count the others
		if after.PrimaryDecisions > before.PrimaryDecisions && after.FallbackDecisions > before.FallbackDecisions {
			mixed = int(min(after.PrimaryDecisions-before.PrimaryDecisions, after.FallbackDecisions-before.FallbackDecisions))
		}
		if admitted < int(hotSpec.Limit) || admitted > int(hotSpec.Limit)+mixed {
			t.Fatalf("%s: admitted %d of %d, want %d (+ up to %d answered by the other store)",
				phase, admitted, 3*hotSpec.Limit, hotSpec.Limit, mixed)
		}
	}
	waitState := func(want BreakerState, within time.Duration) {
		t.Helper()
		end := time.Now().Add(within)
		for f.BreakerState() != want {
			if time.Now().After(end) {
				t.Fatalf("breaker %v after %v, want %v (stats %+v)", f.BreakerState(), within, want, f.Stats())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	time.Sleep(200 * time.Millisecond)
	hammer("healthy")

	srv.Kill()
	waitState(BreakerOpen, 2*time.Second)
	// Limiting continues on local knowledge: a key pushed over its limit is
	// denied by the memory store.
	hammer("outage")
	// Fail-closed items are denied while the primary is away.
	out := make([]limit.Decision, 1)
	login := []limit.Item{{Key: []byte("login"), Spec: hotSpec, FailClosed: true}}
	if err := f.CheckAt(context.Background(), time.Now().UnixNano(), 1, login, out); err != nil {
		t.Fatal(err)
	}
	if out[0].Allowed || out[0].RetryAfter != int64(cooldown) {
		t.Fatalf("fail-closed item during outage: %+v", out[0])
	}
	time.Sleep(3 * cooldown) // several failed probes

	srv.Restart()
	waitState(BreakerClosed, 5*time.Second)
	time.Sleep(100 * time.Millisecond)
	hammer("restarted")
	stop.Store(true)
	wg.Wait()

	st := f.Stats()
	t.Logf("%d checks; worst latency %v (deadline %v), %d over deadline+%v; stats %+v",
		checks.Load(), time.Duration(worst.Load()), deadline, slow.Load(), slack, st)
	if n := errs.Load(); n > 0 {
		t.Errorf("%d checks returned an error, first: %v", n, firstErr.Load())
	}
	if n := slow.Load(); n > checks.Load()/1000 || tooSlow.Load() > 0 {
		t.Errorf("%d of %d checks took longer than deadline %v + %v (first: %v), %d longer than %v",
			n, checks.Load(), deadline, slack, firstSlow.Load(), tooSlow.Load(), hardCap)
	}
	if st.BreakerOpens == 0 || st.PrimaryErrors == 0 || st.FallbackDecisions == 0 {
		t.Errorf("the outage left no trace in the stats: %+v", st)
	}
}

// A hung server (SIGSTOP: connections open, no answers) costs each check at
// most its deadline until the breaker opens; then checks stop waiting on it.
func TestFallbackRedisHung(t *testing.T) {
	const (
		deadline = 25 * time.Millisecond
		slack    = 40 * time.Millisecond
	)
	srv := redistest.Start(t)
	rs := openTestRedis(t, srv.URL(), RedisConfig{Timeout: deadline})
	f := NewFallback(rs, NewMemory(MemoryConfig{}), FallbackConfig{Cooldown: 100 * time.Millisecond})
	items := []limit.Item{{Key: []byte("hung"), Spec: limit.Spec{Algorithm: limit.FixedWindow, Limit: 1 << 30, Window: int64(time.Minute)}}}
	check := func() time.Duration {
		t.Helper()
		start := time.Now()
		if err := f.CheckAt(context.Background(), time.Now().UnixNano(), 1, items, make([]limit.Decision, 1)); err != nil {
			t.Fatalf("CheckAt: %v", err)
		}
		return time.Since(start)
	}
	check()
	srv.Pause()
	defer srv.Resume()
	var worst time.Duration
	for f.BreakerState() == BreakerClosed {
		worst = max(worst, check())
	}
	// Open: answered without waiting on Redis, apart from one probe per cooldown.
	fast := 0
	for range 50 {
		if d := check(); d < deadline {
			fast++
		} else {
			worst = max(worst, d)
		}
	}
	if worst > deadline+slack || fast < 45 {
		t.Fatalf("worst check %v (deadline %v), %d of 50 fast while open", worst, deadline, fast)
	}
	srv.Resume()
	end := time.Now().Add(5 * time.Second)
	for f.BreakerState() != BreakerClosed {
		if time.Now().After(end) {
			t.Fatalf("breaker still %v 5 s after the server resumed: %+v", f.BreakerState(), f.Stats())
		}
		check()
		time.Sleep(10 * time.Millisecond)
	}
}

// Servers sharing a Redis each fall back on their own embedded store when it
// cannot answer; each then takes its part of every limit, so that together
// they admit no more than the limit — and without the split, each would
// admit all of it. The count of servers is what Redis said at their last
// Ping.
func TestFallbackServersShareTheLimit(t *testing.T) {
	srv := redistest.Start(t)
	a := openTestRedis(t, srv.URL(), RedisConfig{Timeout: 50 * time.Millisecond})
	b := openTestRedis(t, srv.URL(), RedisConfig{Timeout: 50 * time.Millisecond})
	for _, s := range []*Redis{a, b, a} {
		if err := s.Ping(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if a.Servers() != 2 || b.Servers() != 2 {
		t.Fatalf("servers: a counts %d, b %d; want 2 each", a.Servers(), b.Servers())
	}
	srv.Kill()
	now := time.Now().UnixNano()
	for _, spec := range []limit.Spec{
		{Algorithm: limit.SlidingWindow, Limit: 100, Window: int64(time.Hour)},
		{Algorithm: limit.FixedWindow, Limit: 101, Window: int64(time.Hour)},
		{Algorithm: limit.TokenBucket, Limit: 100, Window: int64(time.Hour)},
		{Algorithm: limit.GCRA, Limit: 100, Window: int64(time.Hour), Burst: 40},
		{Algorithm: limit.TokenBucket, Limit: 100, Window: int64(time.Hour), Burst: 1}, // halves to nothing
	} {
		fa := NewFallback(a, NewMemory(MemoryConfig{}), FallbackConfig{Cooldown: time.Hour})
		fb := NewFallback(b, NewMemory(MemoryConfig{}), FallbackConfig{Cooldown: time.Hour})
		items := []limit.Item{{Key: fmt.Appendf(nil, "shared:%d", spec.Algorithm), Spec: spec}}
		out := make([]limit.Decision, 1)
		admitted := 0
		for i := range 300 {
			f := []*Fallback{fa, fb}[i%2]
			if err := f.CheckAt(context.Background(), now, 1, items, out); err != nil {
				t.Fatal(err)
			}
			if out[0].Allowed {
				admitted++
			}
		}
		want := int(spec.Capacity())
		if admitted > want || admitted < want-2 {
			t.Errorf("%v: two servers falling back admitted %d of 300 on a limit of %d, want %d (−2 for rounding)",
				spec.Algorithm, admitted, want, want)
		}
	}
}
