package store

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/limit/limittest"
	"github.com/edgelimit/edgelimit/pop/store/redistest"
)

// TestRedisEstimateParity runs one timeline on the embedded store and on the
// Redis store, both replica "a" with the guess of unheard hits on: replica b's
// news arrives stamped and late, a admits the key near its limit, and a check
// every 5 ms asks for one hit of a sliding and of a fixed window limit. Every
// decision — allowed, remaining, reset, retry-after — must be the same in
// both: the server's guess goes to the script, which adds it as limit.Decide
// does. The timeline must include denials made on the guess alone (retry at
// once), and a Redis store without the guess must decide otherwise there, or
// the test would not test the guess.
func TestRedisEstimateParity(t *testing.T) {
	srv := redistest.Start(t)
	ms := int64(time.Millisecond)
	items := []limit.Item{perSecond(limit.SlidingWindow, 120, "s"), perSecond(limit.FixedWindow, 120, "f")}
	t0 := limittest.T0.Add(10 * time.Second).UnixNano() // a window starts here

	type store interface {
		CheckAt(ctx context.Context, now, hits int64, items []limit.Item, out []limit.Decision) error
	}
	clock := new(replClock)
	var memMiss, redMiss []float64 // edgelimit_estimate_error_hits, as each store reports it
	mem := NewMemory(MemoryConfig{Replica: "a", Extrapolate: true,
		EstimateMiss: func(_ limit.Scope, hits float64) { memMiss = append(memMiss, hits) }})
	red := openTestRedis(t, dbURL(srv, 1), RedisConfig{ClockSource: ClockLocal, Clock: clock.Load, Replica: "a", Extrapolate: true,
		EstimateMiss: func(_ limit.Scope, hits float64) { redMiss = append(redMiss, hits) }})
	plain := openTestRedis(t, dbURL(srv, 2), RedisConfig{ClockSource: ClockLocal, Clock: clock.Load, Replica: "a"})
	apply := func(now, sent int64, count uint64) {
		clock.at(now)
		var slots []crdt.Slot
		for _, it := range items {
			slots = append(slots, crdt.Slot{Key: string(it.Key), Window: t0, Replica: "b", Count: count})
		}
		mem.ApplyAt(now, sent, slots)
		red.Apply(sent, slots)
		plain.Apply(sent, slots)
	}
	ctx := context.Background()
	check := func(s store, now int64, it limit.Item) limit.Decision {
		t.Helper()
		out := make([]limit.Decision, 1)
		if err := s.CheckAt(ctx, now, 1, []limit.Item{it}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	// b's news: 20 hits 100 ms in, then 60 at 200 ms (400 a second), each
	// 50 ms on the way; then, at 600 ms, 90.
	apply(t0+150*ms, t0+100*ms, 20)
	apply(t0+250*ms, t0+200*ms, 60)
	var onGuess, differs int
	for now := t0 + 250*ms; now < t0+900*ms; now += 5 * ms {
		clock.at(now)
		if now == t0+600*ms {
			apply(now, now-50*ms, 90)
		}
		for _, it := range items {
			m, r := check(mem, now, it), check(red, now, it)
			if m != r {
				t.Fatalf("%v at +%v: embedded %+v, Redis %+v", it.Spec.Algorithm, time.Duration(now-t0), m, r)
			}
			if !r.Allowed && r.RetryAfter == 1 {
				onGuess++
			}
			if p := check(plain, now, it); p != r {
				differs++
			}
		}
	}
	if onGuess == 0 {
		t.Fatal("no check was denied on the guess alone: the timeline does not reach it")
	}
	if differs == 0 {
		t.Fatal("a Redis store without the guess decided every check alike")
	}
	if len(redMiss) == 0 || !slices.Equal(memMiss, redMiss) {
		t.Fatalf("estimate misses: embedded %v, Redis %v: want the same, and some", memMiss, redMiss)
	}
	t.Logf("%d denials on the guess alone; %d decisions differ from a store without it; misses %v", onGuess, differs, redMiss)
}

// checkBoth checks one hit of it at now on the embedded store and on the
// Redis store, fails t unless both decide alike, and returns the decision.
func checkBoth(t *testing.T, mem *Memory, red *Redis, now int64, it limit.Item) limit.Decision {
	t.Helper()
	var m, r [1]limit.Decision
	if err := mem.CheckAt(context.Background(), now, 1, []limit.Item{it}, m[:]); err != nil {
		t.Fatal(err)
	}
	if err := red.CheckAt(context.Background(), now, 1, []limit.Item{it}, r[:]); err != nil {
		t.Fatal(err)
	}
	if m != r {
		t.Fatalf("at %v: embedded %+v, Redis %+v", time.Unix(0, now).UTC().Format("15:04:05.000"), m[0], r[0])
	}
	return r[0]
}

// TestRedisClockStepParity: the PoPs' clock agreement steps the clock a PoP
// decides on by 150 ms (pop.Engine.SetClockOffset and the store's) while b's
// news of a key near its limit keeps coming, stamped on the agreed clock.
// The Redis store, told of the step by SetClockOffset, must decide every
// check as the embedded store told of it at the same instant does: it
// applies news at the agreed clock, as the checks are made, and moves its
// estimate's clock by the step. Left on the wall clock it would take b's
// news for 150 ms older than it is, or with its step untold keep a's own
// admissions on the old clock: it guesses otherwise (Unheard compared).
func TestRedisClockStepParity(t *testing.T) {
	srv := redistest.Start(t)
	ms := int64(time.Millisecond)
	it := perSecond(limit.SlidingWindow, 120, "step")
	t0 := limittest.T0.Add(10 * time.Second).UnixNano() // a window starts here
	const step = 150 * time.Millisecond
	wall := new(replClock)
	mem := NewMemory(MemoryConfig{Replica: "a", Extrapolate: true})
	red := openTestRedis(t, dbURL(srv, 1), RedisConfig{ClockSource: ClockLocal, Clock: wall.Load, Replica: "a", Extrapolate: true})
	var offset int64
	var onGuess, guessed int
	for w := t0; w < t0+900*ms; w += 5 * ms {
		wall.at(w)
		if w == t0+300*ms {
			offset = int64(step)
			mem.MoveClock(w+offset, offset)
			red.SetClockOffset(step)
		}
		now := w + offset // the clock checks are made on
		if (w-t0)%(20*ms) == 0 {
			// b's news, 50 ms on the way: 300 hits a second.
			sent := now - 50*ms
			slot := []crdt.Slot{{Key: string(it.Key), Window: limit.WindowStart(sent, it.Spec.Window), Replica: "b",
				Count: uint64(max(sent-t0, 0) * 80 / int64(time.Second))}}
			mem.ApplyAt(now, sent, slot)
			red.Apply(sent, slot)
		}
		mem.rep.mu.Lock()
		mu := mem.rep.stateOf(&it, now).Unheard
		mem.rep.mu.Unlock()
		if ru := red.estimates(red.DecisionTime(now), []limit.Item{it}, nil)[0].Unheard; math.Abs(mu-ru) > 1e-9 {
			t.Fatalf("at +%v (wall): Unheard %v embedded, %v Redis", time.Duration(w-t0), mu, ru)
		} else if w > t0+300*ms && mu > 0 {
			guessed++
		}
		if r := checkBoth(t, mem, red, now, it); !r.Allowed && r.RetryAfter == 1 {
			onGuess++
		}
	}
	if onGuess == 0 || guessed == 0 {
		t.Fatalf("%d checks after the step guessed, %d denied on the guess alone: the timeline does not reach the guess", guessed, onGuess)
	}
}

// TestShrunkParity: a global limit cut to its share (limit.Item.Shrunk)
// counts at most the limit of its previous window, in the embedded store
// and in the Redis script alike. The previous window holds 100 hits heard
// from b, the share is 50: unshrunk, the window would open only half way
// through; shrunk, it opens at the share's pace from the start.
func TestShrunkParity(t *testing.T) {
	srv := redistest.Start(t)
	clock := new(replClock)
	t0 := limittest.T0.Add(10 * time.Second).UnixNano() // a window starts here
	it := perSecond(limit.SlidingWindow, 50, "shrunk")
	whole := it
	it.Shrunk = true
	mem := NewMemory(MemoryConfig{Replica: "a"})
	red := openTestRedis(t, dbURL(srv, 1), RedisConfig{ClockSource: ClockLocal, Clock: clock.Load, Replica: "a"})
	prev := []crdt.Slot{{Key: string(it.Key), Window: t0 - int64(time.Second), Replica: "b", Count: 100}}
	clock.at(t0)
	mem.ApplyAt(t0, t0, prev)
	red.Apply(t0, prev)
	admitted := map[bool]int{}
	for ms := int64(0); ms < 1000; ms += 10 {
		now := clock.at(t0 + ms*int64(time.Millisecond))
		if checkBoth(t, mem, red, now, it).Allowed {
			admitted[ms < 500]++
		}
	}
	// At the share's pace, 50 a second from the start: about 25 in each
	// half. Counting the previous window whole would admit none in the
	// first half (100 × (1 − e) ≥ 50 until e = 0.5).
	if admitted[true] < 20 || admitted[false] < 20 {
		t.Fatalf("admitted %d in the first half, %d in the second: want about 25 each", admitted[true], admitted[false])
	}
	mem.rep.mu.Lock()
	st := mem.rep.state(&whole, t0+100*int64(time.Millisecond))
	mem.rep.mu.Unlock()
	if st.Prev != 100 {
		t.Fatalf("unshrunk, the previous window counts %d, want its 100", st.Prev)
	}
}

// TestRedisLostCounts: Redis restarts empty under a replicating PoP. The
// PoP must not publish less than it did (receivers keep the most they heard,
// and would not see its new hits until they passed the old count), must put
// its count back into Redis so that new hits add to it, and must put back
// the other PoPs' counts its estimate holds: an emptied Redis must not
// re-grant a global limit.
func TestRedisLostCounts(t *testing.T) {
	srv := redistest.Start(t)
	clock := new(replClock)
	t0 := limittest.T0.Add(10 * time.Second).UnixNano()
	it := perSecond(limit.FixedWindow, 100, "lost")
	red := openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal, Clock: clock.Load, Replica: "a", Extrapolate: true})
	ctx := context.Background()
	published := func() uint64 {
		t.Helper()
		d, err := red.DeltaCtx(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, sl := range d {
			if sl.Key == string(it.Key) && sl.Window == t0 {
				return sl.Count
			}
		}
		return 0
	}
	now := clock.at(t0 + int64(100*time.Millisecond))
	red.Apply(now, []crdt.Slot{{Key: string(it.Key), Window: t0, Replica: "b", Count: 40}})
	if got := admit(t, red, now, it, 30); got != 30 {
		t.Fatalf("admitted %d of the first 30", got)
	}
	if got := published(); got != 30 {
		t.Fatalf("published %d, want 30", got)
	}
	srv.Restart() // empty
	now = clock.at(t0 + int64(200*time.Millisecond))
	if got := admit(t, red, now, it, 5); got != 5 {
		t.Fatalf("admitted %d of 5 after the restart", got)
	}
	// Not less than it published, and not less than its estimate counted:
	// the 30 before the loss and the 5 since, which the emptied Redis
	// counted from zero.
	if got := published(); got != 35 {
		t.Fatalf("after Redis restarted empty the PoP published %d, want the 30 it published before and the 5 since", got)
	}
	if red.LostRestores() == 0 {
		t.Fatal("the loss was not noticed")
	}
	// Redis holds a's 35 and b's 40 again: 25 more fit, not 95.
	now = clock.at(t0 + int64(300*time.Millisecond))
	if got := admit(t, red, now, it, 100); got != 25 {
		t.Fatalf("after the restore %d more were admitted, want 25 (100 − a's 35 − b's 40)", got)
	}
}

// TestRedisSettledPoPCount: PoP a runs two servers on one Redis. Server 2
// admits 40 hits of a key of 100 a second, server 1 admits until the
// script denies it (Redis holds server 2's hits, server 1's estimate does
// not: it must take the denial for the limit reached), and then replica b
// tells of 40 more. After the window, server 1 reports the window as
// settled at what both servers and b admitted — the PoP's count as it read
// it from Redis for publishing — not at its own hits and b's.
func TestRedisSettledPoPCount(t *testing.T) {
	srv := redistest.Start(t)
	ms := int64(time.Millisecond)
	it := perSecond(limit.SlidingWindow, 100, "pop")
	t0 := limittest.T0.Add(10 * time.Second).UnixNano() // a window starts here
	clock := new(replClock)
	var seen []float64
	s1 := openTestRedis(t, dbURL(srv, 1), RedisConfig{ClockSource: ClockLocal, Clock: clock.Load, Replica: "a", Extrapolate: true,
		SettledExcess: func(_ limit.Scope, pct float64) { seen = append(seen, pct) }})
	s2 := openTestRedis(t, dbURL(srv, 1), RedisConfig{ClockSource: ClockLocal, Clock: clock.Load, Replica: "a", Extrapolate: true})
	bTells := func(now int64, n uint64) {
		clock.at(now)
		for _, s := range []*Redis{s1, s2} {
			s.Apply(now-50*ms, []crdt.Slot{{Key: string(it.Key), Window: t0, Replica: "b", Count: n}})
		}
	}
	clock.at(t0 + 200*ms)
	if n := admit(t, s2, t0+200*ms, it, 40); n != 40 {
		t.Fatalf("server 2 admitted %d of 40", n)
	}
	clock.at(t0 + 300*ms)
	own := admit(t, s1, t0+300*ms, it, 80) // until the script denies
	if own == 80 || own == 0 {
		t.Fatalf("server 1 admitted %d of 80: the script should have denied it at the limit", own)
	}
	for now := t0 + 400*ms; now <= t0+900*ms; now += 100 * ms {
		bTells(now, 40)
	}
	clock.at(t0 + 950*ms)
	if _, err := s1.DeltaCtx(context.Background()); err != nil { // publishing reads the PoP's count
		t.Fatal(err)
	}
	t1 := t0 + time.Second.Nanoseconds()
	for now := t1; now <= t1+300*ms; now += 100 * ms {
		bTells(now, 40)
	}
	clock.at(t1 + 360*ms)
	admit(t, s1, t1+360*ms, it, 1) // the check that judges the window
	bTells(t1+400*ms, 40)          // news applied: the judged window is reported
	settled := float64(40+own+40) - 100
	if len(seen) != 1 || math.Abs(seen[0]-settled) > 1e-9 {
		t.Fatalf("SettledExcess reported %v, want once %v%% (the PoP admitted %d, b 40); server 1's own count alone gives %v%%",
			seen, settled, 40+own, float64(own+40)-100)
	}
}
