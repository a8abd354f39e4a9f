package store

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/limit/limittest"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/region/estimate"
)

// TestExtrapolation drives a store that hears from replica "b" every 100 ms,
// each message 50 ms old on arrival, with b counting 10 hits a second of a
// 100-per-minute key, and checks what the store counts of b at fixed instants.
func TestExtrapolation(t *testing.T) {
	ms := int64(time.Millisecond)
	w := int64(time.Minute)
	t0 := limittest.T0.Add(30 * time.Second).UnixNano() // half way through a window
	it := replItem("x", 100, limit.ScopeGlobal)
	start := limit.WindowStart(t0, w)
	key := string(it.Key)

	newStore := func(extrapolate bool) *Memory {
		s := NewMemory(MemoryConfig{Replica: "a", Extrapolate: extrapolate})
		// b's count: 10 a second since the window began, stamped at t0−100ms
		// and t0 and applied 50 ms later.
		for _, sent := range []int64{t0 - 100*ms, t0} {
			n := uint64((sent - start) / int64(time.Second) * 10)
			s.ApplyAt(sent+50*ms, sent, []crdt.Slot{{Key: key, Window: start, Replica: "b", Count: n}})
		}
		return s
	}
	heard := float64((t0 - start) / int64(time.Second) * 10) // 300
	cases := []struct {
		name string
		now  int64
		want float64 // hits of b counted beyond what was heard
	}{
		// b had none of the key in the previous window, so its rate is
		// its count over this window up to its news, the hit that made
		// it send counted half: 299.5 in 30 s, times the age of what we
		// hold.
		{"on arrival: 50 ms old", t0 + 50*ms, 299.5 / 30 * 0.05},
		{"100 ms later: 150 ms old", t0 + 150*ms, 299.5 / 30 * 0.15},
		{"capped at one gap past the lag", t0 + 5*int64(time.Second), 299.5 / 30 * 0.15},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, on := range []bool{true, false} {
				s := newStore(on)
				s.rep.mu.Lock()
				st := s.rep.state(&it, c.now)
				s.rep.mu.Unlock()
				if st.Cur != int64(heard) {
					t.Fatalf("extrapolate=%v: Cur = %d, want the %v heard", on, st.Cur, heard)
				}
				want := c.want
				if !on {
					want = 0
				}
				if d := st.Unheard - want; d > 1e-6 || d < -1e-6 {
					t.Fatalf("extrapolate=%v: Unheard = %v, want %v", on, st.Unheard, want)
				}
			}
		})
	}
}

// TestExtrapolationDenies shows the point of it: a check that would fit on
// what was heard is denied once what the other replica probably admitted
// since is counted.
func TestExtrapolationDenies(t *testing.T) {
	ms := int64(time.Millisecond)
	w := int64(time.Second)
	it := perSecond(limit.SlidingWindow, 100, "y")
	t0 := limittest.T0.Add(10*time.Second + 900*time.Millisecond).UnixNano()
	start := limit.WindowStart(t0, w)
	for _, on := range []bool{false, true} {
		s := NewMemory(MemoryConfig{Replica: "a", Extrapolate: on})
		// b counted 80 in this window, as of 100 ms ago (it flushes every
		// 100 ms and its messages take 50 ms).
		s.ApplyAt(t0-200*ms+50*ms, t0-200*ms, []crdt.Slot{{Key: string(it.Key), Window: start, Replica: "b", Count: 70}})
		s.ApplyAt(t0-100*ms+50*ms, t0-100*ms, []crdt.Slot{{Key: string(it.Key), Window: start, Replica: "b", Count: 80}})
		got := admit(t, s, t0, it, 20)
		// Heard: 80, so 20 fit. Extrapolated: b's 80 hits in the 800 ms
		// of the window before its news (the 80th, which made it send,
		// counted half) are about 99 a second, times the 100 ms age of
		// what we hold (50 ms on the way, 50 ms since), is 9.9 more: 10
		// fit.
		want := 20
		if on {
			want = 10
		}
		if got != want {
			t.Errorf("extrapolate=%v: admitted %d of 20, want %d", on, got, want)
		}
	}
}

// TestUrgent checks that an admitted hit of a replicated limit signals
// Urgent, and that a denied one, or one of a pop-scope limit, does not.
func TestUrgent(t *testing.T) {
	now := limittest.T0.UnixNano()
	urgent := func(s *Memory) bool {
		select {
		case <-s.Urgent():
			return true
		default:
			return false
		}
	}
	s := NewMemory(MemoryConfig{Replica: "a"})
	it := replItem("u", 1, limit.ScopeGlobal)
	if admit(t, s, now, it, 1) != 1 || !urgent(s) {
		t.Fatal("an admitted global hit did not signal Urgent")
	}
	if admit(t, s, now, it, 1) != 0 || urgent(s) {
		t.Fatal("a denied hit signalled Urgent")
	}
	pop := NewMemory(MemoryConfig{Replica: "a"})
	admit(t, pop, now, replItem("p", 10, limit.ScopePOP), 10)
	if urgent(pop) {
		t.Fatal("a pop-scope limit signalled Urgent: it replicates nothing")
	}
}

// TestExtrapolationMirror checks the estimate of a PoP that admits the key
// itself: the other replica, seeing the same room, admitted what this PoP
// admitted in the time it has not heard from it, in proportion to their
// parts of the traffic.
func TestExtrapolationMirror(t *testing.T) {
	s, it, t0 := mirrored(t, MemoryConfig{Replica: "a", Extrapolate: true})
	s.rep.mu.Lock()
	st := s.rep.state(&it, t0)
	s.rep.mu.Unlock()
	// b's part equals a's (45 and a tenth of 10 against the same before
	// the last 100 ms), so b admitted as a did since: 10. Its rate over
	// the window would say about 4.6.
	if d := st.Unheard - 10; d > 1e-9 || d < -1e-9 {
		t.Fatalf("Unheard = %v, want 10", st.Unheard)
	}
}

// mirrored makes a store of replica a, per second limit 120, at t0 (900 ms
// into a window): b counted 40 then 45 of the key, stamped 200 and 100 ms
// before t0 and applied 50 ms later; a admitted 45 at t0−500 ms and 10 at
// t0−10 ms. Each admitted 10 in the previous window: the key is not new to
// a, which would not mirror in the key's first window (TestMirrorEvidence).
func mirrored(t *testing.T, cfg MemoryConfig) (*Memory, limit.Item, int64) {
	t.Helper()
	ms := int64(time.Millisecond)
	w := int64(time.Second)
	it := perSecond(limit.SlidingWindow, 120, "m")
	t0 := limittest.T0.Add(10*time.Second + 900*time.Millisecond).UnixNano()
	start := limit.WindowStart(t0, w)
	s := NewMemory(cfg)
	s.ApplyAt(start-500*ms, start-550*ms, []crdt.Slot{{Key: string(it.Key), Window: start - w, Replica: "b", Count: 10}})
	if n := admit(t, s, start-500*ms, it, 10); n != 10 {
		t.Fatalf("admitted %d of the previous window's 10", n)
	}
	s.ApplyAt(t0-150*ms, t0-200*ms, []crdt.Slot{{Key: string(it.Key), Window: start, Replica: "b", Count: 40}})
	s.ApplyAt(t0-50*ms, t0-100*ms, []crdt.Slot{{Key: string(it.Key), Window: start, Replica: "b", Count: 45}})
	if n := admit(t, s, t0-500*ms, it, 45); n != 45 {
		t.Fatalf("admitted %d of the first 45", n)
	}
	if n := admit(t, s, t0-10*ms, it, 10); n != 10 {
		t.Fatalf("admitted %d of the next 10", n)
	}
	return s, it, t0
}

// TestAheadClock checks that hits a replica with a fast clock counted in the
// next window already weigh in the current one.
func TestAheadClock(t *testing.T) {
	it := replItem("f", 100, limit.ScopeGlobal)
	now := limittest.T0.Add(30 * time.Second).UnixNano()
	start := limit.WindowStart(now, it.Spec.Window)
	for _, on := range []bool{false, true} {
		s := NewMemory(MemoryConfig{Replica: "a", Extrapolate: on})
		s.ApplyAt(now, 0, []crdt.Slot{{Key: string(it.Key), Window: start + it.Spec.Window, Replica: "b", Count: 30}})
		s.rep.mu.Lock()
		st := s.rep.state(&it, now)
		s.rep.mu.Unlock()
		want := int64(0)
		if on {
			want = 30
		}
		if st.Cur != want {
			t.Errorf("extrapolate=%v: Cur = %d, want %d", on, st.Cur, want)
		}
	}
}

// TestEstimateMiss checks what EstimateMiss reports: the estimate of the
// other replica's count (held plus guessed, up to the report's stamp)
// against its report; a second copy of the report is not graded again.
func TestEstimateMiss(t *testing.T) {
	for _, c := range []struct {
		reported uint64
		want     float64
	}{{50, 0}, {45, 5}, {55, -5}} {
		var got []float64
		var scopes []limit.Scope
		s, it, t0 := mirrored(t, MemoryConfig{Replica: "a", Extrapolate: true, EstimateMiss: func(sc limit.Scope, hits float64) {
			scopes, got = append(scopes, sc), append(got, hits)
		}})
		// b held at 45, stamped 100 ms ago; a guesses b admitted 10 more
		// over that age, as a did. The report is stamped 50 ms after the
		// held news: half of the guess's span, so 5 of the 10.
		got, scopes = nil, nil // misses of the setup's own applies
		start := limit.WindowStart(t0, it.Spec.Window)
		report := []crdt.Slot{{Key: string(it.Key), Window: start, Replica: "b", Count: c.reported}}
		s.ApplyAt(t0, t0-int64(50*time.Millisecond), report)
		if len(got) != 1 || scopes[0] != limit.ScopeGlobal {
			t.Fatalf("reported %d: misses %v scopes %v, want one global", c.reported, got, scopes)
		}
		if d := got[0] - c.want; d > 1e-9 || d < -1e-9 {
			t.Errorf("reported %d: miss %v, want %v", c.reported, got[0], c.want)
		}
		s.ApplyAt(t0+int64(time.Millisecond), t0-int64(50*time.Millisecond), report) // the direct path's copy
		if len(got) != 1 {
			t.Errorf("reported %d: the second copy was graded too: %v", c.reported, got)
		}
	}
}

// TestExtrapolationWindowRate: a replica that counted the key in the previous
// window too is taken at its rate over a whole window: its sliding count as
// it was when it sent its news, the previous window weighed as it was then,
// not as it is now (the previous window has faded since by the age of the
// news, and the hits that took its place are the ones not heard of yet).
func TestExtrapolationWindowRate(t *testing.T) {
	ms := int64(time.Millisecond)
	it := replItem("r", 1000, limit.ScopeGlobal) // a minute window
	w := it.Spec.Window
	t0 := limittest.T0.Add(30 * time.Second).UnixNano() // half way through
	start := limit.WindowStart(t0, w)
	s := NewMemory(MemoryConfig{Replica: "a", Extrapolate: true})
	for _, sent := range []int64{t0 - 100*ms, t0} {
		s.ApplyAt(sent+50*ms, sent, []crdt.Slot{
			{Key: string(it.Key), Window: start - w, Replica: "b", Count: 600},
			{Key: string(it.Key), Window: start, Replica: "b", Count: 300},
		})
	}
	s.rep.mu.Lock()
	st := s.rep.state(&it, t0+50*ms)
	s.rep.mu.Unlock()
	// Sliding count when b sent its news, at 30 s: 600 × (30/60) + 300 =
	// 600 over 60 s, 10 a second, times 50 ms. (Weighed at 30.05 s, as
	// before: 599.5, a rate short by the news's age.)
	weight := float64(w-(t0-start)) / float64(w)
	want := (600*weight + 300) / float64(w) * float64(50*ms)
	if d := st.Unheard - want; d > 1e-9 || d < -1e-9 {
		t.Fatalf("Unheard = %v, want %v", st.Unheard, want)
	}
}

// BenchmarkReplicatedCheck is one check of a global limit that three other
// replicas count too, with and without the estimate of their unheard hits,
// far from the limit and near it (where the estimate also remembers this
// PoP's recent admissions).
func BenchmarkReplicatedCheck(b *testing.B) {
	now := limittest.T0.Add(30 * time.Second).UnixNano()
	for _, extrapolate := range []bool{false, true} {
		for _, near := range []bool{false, true} {
			name := "plain"
			if extrapolate {
				name = "extrapolate"
			}
			if near {
				name += "/near"
			} else {
				name += "/far"
			}
			b.Run(name, func(b *testing.B) {
				limitN := int64(1 << 40)
				if near {
					limitN = 1 << 20 // the others' counts below make it near
				}
				it := replItem("bench", limitN, limit.ScopeGlobal)
				start := limit.WindowStart(now, it.Spec.Window)
				s := NewMemory(MemoryConfig{Replica: "a", Extrapolate: extrapolate})
				for i, r := range []string{"b", "c", "d"} {
					n := uint64(1<<18) + uint64(i)
					s.ApplyAt(now-int64(100*time.Millisecond), now-int64(150*time.Millisecond), []crdt.Slot{
						{Key: string(it.Key), Window: start, Replica: r, Count: n},
						{Key: string(it.Key), Window: start - it.Spec.Window, Replica: r, Count: n},
					})
				}
				items := []limit.Item{it}
				out := make([]limit.Decision, 1)
				ctx := context.Background()
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					_ = s.CheckAt(ctx, now+int64(i), 1, items, out)
				}
			})
		}
	}
}

// TestFirstNewsRate: a replica's first news of a key it began to admit with
// this window says n hits in a span that ends with the n-th (it sends news
// right after it admits), so its rate is n−½ over that span: the last hit
// ends the span rather than fills it.
func TestFirstNewsRate(t *testing.T) {
	ms := int64(time.Millisecond)
	it := replItem("first", 8, limit.ScopeGlobal) // a minute window; small, so one hit heard is near it
	t0 := limittest.T0.UnixNano()                 // a window starts here
	for _, n := range []uint64{1, 2, 5} {
		s := NewMemory(MemoryConfig{Replica: "a", Extrapolate: true})
		sent := t0 + 100*ms // 100 ms into the window, 50 ms on the way
		s.ApplyAt(sent+50*ms, sent, []crdt.Slot{{Key: string(it.Key), Window: t0, Replica: "b", Count: n}})
		s.rep.mu.Lock()
		st := s.rep.state(&it, sent+100*ms)
		s.rep.mu.Unlock()
		// n−½ hits in 100 ms, times the age: 50 ms on the way and 50 ms
		// since, but no more than the delay while no gap between b's
		// messages is known yet: 50 ms.
		want := (float64(n) - 0.5) / 100 * 50
		if d := st.Unheard - want; d > 1e-4 || d < -1e-4 { // ns stamps as float64 are off by ~256 ns
			t.Errorf("count %d: Unheard = %v, want %v", n, st.Unheard, want)
		}
	}
}

// TestFirstNewsPace: a replica that has told of one hit of a key new to
// this PoP too is guessed closer to the pace at which this PoP admits the
// key than to what that one hit says. a admits a key of 40 a second at 50
// a second, one hit each 20 ms from 10 ms into the window; b's first news,
// stamped 20 ms in, tells of one hit and takes 150 ms to arrive. By its one
// hit b runs at ½ hit in 20 ms, 25 a second: 3.75 hits over the 150 ms age.
// Taken with estimate.PaceHits hits at a's pace it runs at 20.5 hits in 420 ms, 49
// a second: 7.3 hits. Where a admitted the key in the previous window too,
// the key is not new to it, there is no such pace, and b's one hit stands.
func TestFirstNewsPace(t *testing.T) {
	ms := int64(time.Millisecond)
	it := perSecond(limit.SlidingWindow, 40, "pace")
	t0 := limit.WindowStart(limittest.T0.Add(10*time.Second).UnixNano(), it.Spec.Window)
	unheard := func(before bool) float64 {
		t.Helper()
		s := NewMemory(MemoryConfig{Replica: "a", Extrapolate: true})
		if before && admit(t, s, t0-500*ms, it, 1) != 1 {
			t.Fatal("a's hit in the previous window denied")
		}
		for at := t0 + 10*ms; at < t0+200*ms; at += 20 * ms {
			if at == t0+170*ms {
				s.ApplyAt(at, t0+20*ms, []crdt.Slot{{Key: string(it.Key), Window: t0, Replica: "b", Count: 1}})
			}
			if admit(t, s, at, it, 1) != 1 {
				t.Fatalf("a's hit at %v denied", time.Duration(at-t0))
			}
		}
		s.rep.mu.Lock()
		defer s.rep.mu.Unlock()
		return s.rep.state(&it, t0+200*ms).Unheard
	}
	own := 0.5 / 20 * 150 // b's one hit, over the 150 ms age
	if got := unheard(true); math.Abs(got-own) > 1e-4 {
		t.Errorf("key not new to a: Unheard = %v, want %v (b's one hit)", got, own)
	}
	// a began to remember the key at its second hit, 30 ms in: 8.5 hits
	// since in 170 ms, 50 a second.
	paced := (0.5 + estimate.PaceHits) / (20 + estimate.PaceHits/0.05) * 150
	if got := unheard(false); math.Abs(got-paced) > 1e-4 {
		t.Errorf("key new to a: Unheard = %v, want %v (b's one hit with %v at a's pace; by it alone %v)", got, paced, estimate.PaceHits, own)
	}
}

// TestMirrorNeedsMemory: when this PoP began to remember its admissions of a
// key (it came near the limit) less than one age of the other's news ago, it
// does not know what it admitted over that age, so the guess goes by the
// other replica's own rate instead of mirroring what it remembers — which
// took a sprayer's first 100 ms at world scale for nothing admitted.
func TestMirrorNeedsMemory(t *testing.T) {
	ms := int64(time.Millisecond)
	it := perSecond(limit.SlidingWindow, 100, "c")
	t0 := limittest.T0.UnixNano() // a window starts here; the key starts with it
	s := NewMemory(MemoryConfig{Replica: "a", Extrapolate: true})
	// a admits 10 in the first 100 ms (one each 10 ms): not near the limit
	// yet. It remembers them from the fourth, 30 ms in (a key new in its
	// window is remembered from a 32nd of its limit: newPace), but the
	// mirror goes by when the key came near.
	for i := range int64(10) {
		if admit(t, s, t0+i*10*ms, it, 1) != 1 {
			t.Fatal("denied far from the limit")
		}
	}
	// b's news: 15 hits as of 150 ms into the window, 100 ms on the way.
	s.ApplyAt(t0+250*ms, t0+150*ms, []crdt.Slot{{Key: string(it.Key), Window: t0, Replica: "b", Count: 15}})
	// a admits one more, now near the limit (10 + 15 + b's guess ≥ 25): it
	// begins to remember here.
	if admit(t, s, t0+255*ms, it, 1) != 1 {
		t.Fatal("denied the 11th hit")
	}
	s.rep.mu.Lock()
	st := s.rep.state(&it, t0+260*ms)
	s.rep.mu.Unlock()
	// b's news is 100 ms old (110 ms, capped at its delay while no gap
	// between its messages is known); a remembers only 5 ms of that as
	// near. By b's own rate, 14.5 hits in 150 ms, taken with estimate.PaceHits
	// hits at a's pace since it began to remember the key (7.5 hits in
	// 230 ms: the key is new to a, see TestFirstNewsPace), times 100 ms.
	want := (14.5 + estimate.PaceHits) / (150 + estimate.PaceHits*230/7.5) * 100
	if d := st.Unheard - want; d > 1e-4 || d < -1e-4 { // ns stamps as float64 are off by ~256 ns
		t.Fatalf("Unheard = %v, want %v (b's own rate with a's pace); mirroring a's one remembered hit says 1.5", st.Unheard, want)
	}
}

// TestMirrorFollowsStall: a replica whose news stops coming — its link stalled
// behind a lost message — while this PoP keeps admitting the key is guessed to
// have admitted alongside it for up to estimate.StallReach past its usual gap, not
// just one gap (where the guess by its rate stops: it cannot tell a stall from
// a replica gone quiet); and no further, where a silence is more likely a cut.
func TestMirrorFollowsStall(t *testing.T) {
	ms := int64(time.Millisecond)
	it := perSecond(limit.SlidingWindow, 400, "stall")
	t0 := limittest.T0.UnixNano() // a window starts here
	s := NewMemory(MemoryConfig{Replica: "a", Extrapolate: true})
	key := string(it.Key)
	// The mirror over an age: what a admitted within it, times b's count
	// against a's before it.
	var hits []int64 // a's admissions
	var bCount uint64
	mirror := func(now, age int64) float64 {
		since := 0
		for _, h := range hits {
			if h > now-age {
				since++
			}
		}
		return float64(since) * float64(bCount) / float64(len(hits)-since)
	}
	type check struct {
		name string
		age  int64 // the age the mirror follows
	}
	checks := map[int64]check{
		// 150 ms after b's last news (applied at 640 ms): 190 ms old,
		// within one gap (10 ms) past the delay (40 ms), plus estimate.StallReach.
		t0 + 790*ms: {"stalled 150 ms", 190 * ms},
		// Held to that: a silence longer is taken for a cut.
		t0 + 940*ms: {"silent 300 ms", 10*ms + 40*ms + int64(estimate.StallReach)},
	}
	// Both admit one hit each 5 ms; b's news comes every 10 ms, 40 ms on
	// the way, until its last, sent at 600 ms.
	for at := t0; at <= t0+940*ms; at += 5 * ms {
		if sent := at - 40*ms; sent > t0 && sent <= t0+600*ms && (sent-t0)%(10*ms) == 0 {
			bCount = uint64((sent - t0) / (5 * ms))
			s.ApplyAt(at, sent, []crdt.Slot{{Key: key, Window: t0, Replica: "b", Count: bCount}})
		}
		if admit(t, s, at, it, 1) != 1 {
			t.Fatalf("denied at %v, far below the limit", time.Duration(at-t0))
		}
		hits = append(hits, at)
		c, ok := checks[at]
		if !ok {
			continue
		}
		s.rep.mu.Lock()
		st := s.rep.state(&it, at)
		s.rep.mu.Unlock()
		if want := mirror(at, c.age); math.Abs(st.Unheard-want) > 1e-4 {
			t.Errorf("%s: Unheard = %v, want %v (the mirror over %v); over one gap past the delay it is %v",
				c.name, st.Unheard, want, time.Duration(c.age), mirror(at, 50*ms))
		}
	}
}

// TestStallReachQuietReplica: a replica that admitted a burst of an hourly
// limit long ago and nothing since is quiet, not stalled. Following its
// silence with the mirror, which scales this PoP's latest hit by the
// replica's part of the window (6 of 7), guessed 6 unheard hits and denied
// a global limit of 10 at 8 (TestPoPsOnRedisReplicate); past the usual gap
// the guess goes no higher than the replica's own rate over that age.
func TestStallReachQuietReplica(t *testing.T) {
	ms := int64(time.Millisecond)
	it := windowItem(rules.Hour, limit.SlidingWindow, limit.ScopeGlobal, 10, "quiet")
	t0 := limittest.T0.Add(20 * time.Minute).UnixNano() // 20 minutes into an hourly window
	start := limit.WindowStart(t0, int64(time.Hour))
	s := NewMemory(MemoryConfig{Replica: "a", Extrapolate: true})
	// b's burst of 6, then two messages 50 ms apart (its flushes), 10 ms on
	// the way.
	for i, n := range []uint64{6, 6, 6} {
		sent := t0 + int64(i)*50*ms
		s.ApplyAt(sent+10*ms, sent, []crdt.Slot{{Key: string(it.Key), Window: start, Replica: "b", Count: n}})
	}
	// a admits one hit each 150 ms, starting 300 ms after b's last news.
	for k := range int64(3) {
		at := t0 + 400*ms + k*150*ms
		if admit(t, s, at, it, 1) != 1 {
			t.Fatalf("hit %d of a denied: 6 + %d of a global 10", k+1, k+1)
		}
	}
	s.rep.mu.Lock()
	st := s.rep.state(&it, t0+400*ms+3*150*ms)
	s.rep.mu.Unlock()
	if st.Unheard > 0.1 {
		t.Fatalf("Unheard = %v for a replica quiet for half a second, want about none", st.Unheard)
	}
}

// perSecond is the item of a global limit of n a second with algorithm alg,
// for the request value v of descriptor key k.
func perSecond(alg limit.Algorithm, n int64, v string) limit.Item {
	return windowItem(rules.Second, alg, limit.ScopeGlobal, n, v)
}

// TestMirrorSteadyCap: a and b have admitted a key at the same pace, 100 a
// second, for a window and a half; b's news comes every 50 ms, 40 ms on the
// way. At the check, half into a window, when a's latest admissions ran a little faster than its pace (1.4×:
// the room frees as the window slides, and a happened to take more of it),
// the mirror would guess b at 1.4 times what b admitted; the guess stays
// within estimate.SteadyCap of b's own rate. When a admitted at three times its pace
// (the room opened), the guess follows the mirror.
func TestMirrorSteadyCap(t *testing.T) {
	ms := int64(time.Millisecond)
	t0 := limittest.T0.UnixNano() // a window starts here
	for _, c := range []struct {
		name   string
		burst  int64 // a's admissions in its last 100 ms, against 10 at its pace
		capped bool
	}{
		{"a little faster", 14, true},
		{"the room opened", 30, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Near the limit (a and b admit 200 a second): a remembers its
			// admissions and guesses b's.
			it := perSecond(limit.SlidingWindow, 250, "steady")
			key := string(it.Key)
			s := NewMemory(MemoryConfig{Replica: "a", Extrapolate: true})
			end := t0 + 500*ms // the check, half into the window
			var bAt []int64
			for at := t0 - 1000*ms; at < end; at += 10 * ms {
				bAt = append(bAt, at) // b: one hit each 10 ms
			}
			bCount := func(window, upTo int64) uint64 {
				n := uint64(0)
				for _, h := range bAt {
					if h >= window && h < window+1000*ms && h <= upTo {
						n++
					}
				}
				return n
			}
			// step applies b's news due by at: sent every 50 ms, 40 ms on
			// the way.
			lastNews := t0 - 1050*ms
			step := func(at int64) {
				for sent := lastNews + 50*ms; sent+40*ms <= at; sent += 50 * ms {
					s.ApplyAt(sent+40*ms, sent, []crdt.Slot{
						{Key: key, Window: t0 - 1000*ms, Replica: "b", Count: bCount(t0-1000*ms, sent)},
						{Key: key, Window: t0, Replica: "b", Count: bCount(t0, sent)},
					})
					lastNews = sent
				}
			}
			for at := t0 - 1000*ms; at < end-100*ms; at += 10 * ms {
				step(at)
				if admit(t, s, at, it, 1) != 1 {
					t.Fatal("denied far below the limit")
				}
			}
			for i := range c.burst { // a's last 100 ms
				at := end - 100*ms + i*100*ms/c.burst
				step(at)
				if admit(t, s, at, it, 1) != 1 {
					t.Fatal("denied far below the limit")
				}
			}
			step(end)
			s.rep.mu.Lock()
			st := s.rep.state(&it, end)
			s.rep.mu.Unlock()
			// What b admitted at its pace over the age of its news.
			truth := 100 * float64(end-lastNews) / float64(time.Second)
			t.Logf("b's news is %v old: %.1f hits at b's pace; guessed %.2f", time.Duration(end-lastNews), truth, st.Unheard)
			if c.capped && st.Unheard > estimate.SteadyCap*truth*1.01 {
				t.Errorf("guessed %.2f of b's %.1f unheard hits: over estimate.SteadyCap (%v) times b's rate", st.Unheard, truth, estimate.SteadyCap)
			}
			if !c.capped && st.Unheard < 2*truth {
				t.Errorf("guessed %.2f of b's %.1f unheard hits while a admitted at 3× its pace: the mirror was capped", st.Unheard, truth)
			}
		})
	}
}

// TestWindowStep: a PoP's clock steps across a window boundary after it
// admitted 60 of a key's 100 a second, within 50 ms (clock agreement moved
// it, MoveClock). Those 60 are less than a second old for the whole next
// window, so 800 ms into it the PoP has 40 left at most. Forward: the 60
// were counted in the window before and would weigh as the previous
// window's (12 of them left at 800 ms: 88 admitted by a store not told of
// the step). Back: the 60 are in what is now the next window, where a
// check counts them as current whether or not the store was told (before,
// they were not counted at all: 100 admitted).
func TestWindowStep(t *testing.T) {
	ms := int64(time.Millisecond)
	it, s0 := stepItem("step")
	for _, c := range []struct {
		name         string
		at, step     int64 // admissions from at, by the clock before the step
		told, untold int   // admitted 800 ms into the window after (forward) or 50 ms before the old one (back)
	}{
		{"forward", s0 - 100*ms, 150 * ms, 28, 88},
		{"back", s0 + 50*ms, -150 * ms, 40, 40},
	} {
		for _, tell := range []bool{true, false} {
			s := NewMemory(MemoryConfig{Replica: "a", Extrapolate: true})
			for i := range int64(60) {
				if admit(t, s, c.at+i*ms*50/60, it, 1) != 1 {
					t.Fatalf("%s: hit %d denied", c.name, i)
				}
			}
			now := c.at + 50*ms + c.step
			if tell {
				s.MoveClock(now, c.step)
			}
			check := s0 + 800*ms
			if c.step < 0 {
				check = s0 - 50*ms
			}
			want := c.untold
			if tell {
				want = c.told
			}
			if n := admit(t, s, check, it, 100); n != want {
				t.Errorf("%s, told of the step %v: admitted %d, want %d", c.name, tell, n, want)
			}
		}
	}
}

// unheardAfterHits admits 40 hits of it on s over the 400 ms before now, as
// a PoP near its limit does, and returns the Unheard a check at now gets.
func unheardAfterHits(t *testing.T, s *Memory, it limit.Item, now int64) float64 {
	t.Helper()
	ms := int64(time.Millisecond)
	for i := int64(0); i < 40; i++ {
		if admit(t, s, now-400*ms+i*10*ms, it, 1) != 1 {
			t.Fatalf("a's hit %d denied", i)
		}
	}
	s.rep.mu.Lock()
	defer s.rep.mu.Unlock()
	return s.rep.state(&it, now).Unheard
}

// TestHeldReplica: a admits a key near its limit that b tells it of; c's
// news (of another key) came 10 ms apart, and c has told nothing of the
// key. While c's news flows, c admitted none of it and is guessed at
// nothing; when c has been silent for 150 ms (its link stalled) it is
// guessed at what b is counted at — b's sliding count plus the guess of
// b; after 4 s of silence c is gone and guessed at nothing again. A key no
// replica told of gets nothing for a held c either. And a c whose presence
// beacons keep coming, every 500 ms, is quiet, not held; one whose beacons
// stopped 900 ms ago is held.
func TestHeldReplica(t *testing.T) {
	ms := int64(time.Millisecond)
	it := perSecond(limit.SlidingWindow, 200, "held")
	other := perSecond(limit.SlidingWindow, 200, "other")
	now := limit.WindowStart(limittest.T0.Add(30*time.Second).UnixNano(), it.Spec.Window) + 600*ms
	start := limit.WindowStart(now, it.Spec.Window)
	unheard := func(cLast int64, bTells bool, beaconsUntil int64) float64 {
		t.Helper()
		s := NewMemory(MemoryConfig{Replica: "a", Extrapolate: true})
		for at := now - 3000*ms; beaconsUntil != 0 && at <= beaconsUntil; at += 500 * ms {
			s.BeaconAt(at, "c")
		}
		for _, sent := range []int64{cLast - 10*ms, cLast} {
			s.ApplyAt(sent+5*ms, sent, []crdt.Slot{{Key: string(other.Key), Window: limit.WindowStart(sent, it.Spec.Window), Replica: "c", Count: 1}})
		}
		for i := int64(0); i < 50; i++ { // 500 ms of news, 10 ms apart, 5 ms on the way
			sent := now - 505*ms + i*10*ms
			if bTells {
				s.ApplyAt(sent+5*ms, sent, []crdt.Slot{{Key: string(it.Key), Window: start, Replica: "b", Count: uint64(10 + i/2)}})
			} else {
				s.ApplyAt(sent+5*ms, sent, []crdt.Slot{{Key: string(other.Key), Window: start, Replica: "b", Count: uint64(1 + i)}})
			}
		}
		return unheardAfterHits(t, s, it, now)
	}
	fresh := unheard(now-5*ms, true, 0)
	if fresh <= 0 {
		t.Fatalf("Unheard with c's news flowing = %v, want b's guess > 0", fresh)
	}
	bCount := 10 + 49/2 // what b last told, all in this window
	want := fresh + float64(bCount) + fresh
	if got := unheard(now-150*ms, true, 0); math.Abs(got-want) > 1e-9 {
		t.Errorf("c silent 150 ms: Unheard = %v, want %v (b's guess %v, plus b's %d and its guess for c)", got, want, fresh, bCount)
	}
	if got := unheard(now-4000*ms, true, 0); math.Abs(got-fresh) > 1e-9 {
		t.Errorf("c silent 4 s: Unheard = %v, want %v (b's guess alone)", got, fresh)
	}
	if got := unheard(now-150*ms, false, 0); got != 0 {
		t.Errorf("no replica told of the key, c silent 150 ms: Unheard = %v, want 0", got)
	}
	if got := unheard(now-150*ms, true, now-100*ms); math.Abs(got-fresh) > 1e-9 {
		t.Errorf("c silent 150 ms, its beacons coming: Unheard = %v, want %v (b's guess alone)", got, fresh)
	}
	if got := unheard(now-1000*ms, true, now-900*ms); math.Abs(got-want) > 1e-9 {
		t.Errorf("c silent 1 s, its last beacon 900 ms ago: Unheard = %v, want %v", got, want)
	}
}

// TestHeldReplicaThatTold: b's news of a key flows, 10 ms apart; c told of
// it too, two hits, and then fell silent for 400 ms. With c's presence
// beacons still coming c is quiet, and guessed as any replica; with them
// overdue (the last 1 s ago) c is held up, and counts at least at what b is
// counted at: b's sliding count plus b's guess. A held c that told more
// than b keeps its own count, and with no replica's news flowing there is
// no one to go by.
func TestHeldReplicaThatTold(t *testing.T) {
	ms := int64(time.Millisecond)
	it := perSecond(limit.SlidingWindow, 200, "held")
	now := limit.WindowStart(limittest.T0.Add(30*time.Second).UnixNano(), it.Spec.Window) + 600*ms
	start := limit.WindowStart(now, it.Spec.Window)
	const bCount = 10 + 49/2 // what b last tells, all in this window
	unheard := func(cCount uint64, withB bool, beaconsUntil int64) float64 {
		t.Helper()
		s := NewMemory(MemoryConfig{Replica: "a", Extrapolate: true})
		for at := now - 3000*ms; at <= beaconsUntil; at += 500 * ms {
			s.BeaconAt(at, "c")
		}
		if cCount > 0 {
			for i, sent := range []int64{now - 410*ms, now - 400*ms} {
				s.ApplyAt(sent+5*ms, sent, []crdt.Slot{{Key: string(it.Key), Window: start, Replica: "c", Count: cCount - 1 + uint64(i)}})
			}
		}
		for i := int64(0); withB && i < 50; i++ { // 500 ms of news, 10 ms apart, 5 ms on the way
			sent := now - 505*ms + i*10*ms
			s.ApplyAt(sent+5*ms, sent, []crdt.Slot{{Key: string(it.Key), Window: start, Replica: "b", Count: uint64(10 + i/2)}})
		}
		return unheardAfterHits(t, s, it, now)
	}
	guessB := unheard(0, true, now)
	quiet := unheard(2, true, now)
	if guessB <= 0 || quiet < guessB {
		t.Fatalf("Unheard of b alone %v, with a quiet c %v: want b's guess > 0 and c's ≥ 0", guessB, quiet)
	}
	guessC := quiet - guessB
	want := quiet + (bCount + guessB) - (2 + guessC)
	if got := unheard(2, true, now-1000*ms); math.Abs(got-want) > 1e-9 {
		t.Errorf("c held: Unheard = %v, want %v (c at b's count %d plus b's guess %v, not its own 2 plus %v)", got, want, bCount, guessB, guessC)
	}
	heavy := unheard(60, true, now)
	if got := unheard(60, true, now-1000*ms); math.Abs(got-heavy) > 1e-9 {
		t.Errorf("c held, having told 60 hits: Unheard = %v, want %v (its own guess)", got, heavy)
	}
	alone := unheard(2, false, now)
	if got := unheard(2, false, now-1000*ms); math.Abs(got-alone) > 1e-9 {
		t.Errorf("c held, no other news: Unheard = %v, want %v (its own guess)", got, alone)
	}
}

// TestNeverHeardReplica: c is a replica of the topology (MemoryConfig.
// Replicas) that a has never heard from. From a's first apply on it is held
// for estimate.HeldFirst — its first news may be stalled — and counted as b, who
// tells of the key, is; then no longer. A store not told of c counts only b.
func TestNeverHeardReplica(t *testing.T) {
	ms := int64(time.Millisecond)
	it := perSecond(limit.SlidingWindow, 100, "never")
	t0 := limit.WindowStart(limittest.T0.Add(30*time.Second).UnixNano(), it.Spec.Window)
	unheard := func(replicas []string, at int64) (float64, float64) {
		t.Helper()
		s := NewMemory(MemoryConfig{Replica: "a", Extrapolate: true, Replicas: replicas})
		var told float64
		for sent := t0; sent+5*ms <= at; sent += 10 * ms { // b: news every 10 ms, 5 ms on the way
			n := uint64(1 + (sent-t0)/(20*ms))
			s.ApplyAt(sent+5*ms, sent, []crdt.Slot{{Key: string(it.Key), Window: t0, Replica: "b", Count: n}})
			told = float64(n)
			if (sent-t0)%(20*ms) == 0 && admit(t, s, sent+5*ms, it, 1) != 1 { // a: one hit each 20 ms
				t.Fatalf("a's hit at %v denied", time.Duration(sent-t0))
			}
		}
		s.rep.mu.Lock()
		defer s.rep.mu.Unlock()
		return s.rep.state(&it, at).Unheard, told
	}
	for _, at := range []int64{t0 + 306*ms, t0 + 706*ms} {
		alone, told := unheard(nil, at)
		if alone <= 0 {
			t.Fatalf("at %v: Unheard without c = %v, want b's guess > 0", time.Duration(at-t0), alone)
		}
		want := alone // c's silence is past estimate.HeldFirst: not counted
		if at-t0 < int64(estimate.HeldFirst) {
			want = alone + told + alone
		}
		if got, _ := unheard([]string{"a", "b", "c"}, at); math.Abs(got-want) > 1e-9 {
			t.Errorf("at %v, c never heard: Unheard = %v, want %v (b told %v, guessed %v)", time.Duration(at-t0), got, want, told, alone)
		}
	}
}

// TestReplicaBeforeOnset: a admits a key, one hit each 10 ms from the
// start of a window, and b tells of it every 10 ms (5 ms on the way): 10
// hits at once, then 50 a second. c's
// latest news, of another key, was stamped 50 ms before the key began and
// took 80 ms to arrive; its presence beacons keep coming, so it is not held
// up. Its news cannot have told of the key, so from when a began to
// remember the key until c's first news of it could have come (one flush,
// its 80 ms delay and estimate.BeforeSlack later) c counts as b does: b's count plus
// b's guess. After that c's silence says it had none. A c heard from after
// a began to remember the key told nothing of it when it could have, and
// counts for none.
func TestReplicaBeforeOnset(t *testing.T) {
	ms := int64(time.Millisecond)
	it := perSecond(limit.SlidingWindow, 100, "onset")
	other := perSecond(limit.SlidingWindow, 100, "other")
	w := it.Spec.Window
	t0 := limit.WindowStart(limittest.T0.Add(30*time.Second).UnixNano(), w)
	// unheard runs the key until off after a began to remember it and
	// returns Unheard then and b's count. c's news is stamped when cSent
	// says, given that instant (0 while unknown); 0: not yet. With cSent
	// nil there is no c.
	unheard := func(cSent func(from int64) int64, off int64) (float64, uint64) {
		t.Helper()
		s := NewMemory(MemoryConfig{Replica: "a", Extrapolate: true})
		var from, sent, told int64
		for at := t0 - time.Second.Nanoseconds(); ; at += 5 * ms {
			if cSent != nil && (at-t0)%(500*ms) == 0 {
				s.BeaconAt(at, "c")
			}
			if u := s.rep.units[w]; from == 0 && u != nil && u.recent[string(it.Key)] != nil {
				from = u.recent[string(it.Key)].From()
			}
			if sent == 0 && cSent != nil {
				sent = cSent(from)
			}
			if sent != 0 && at == sent+80*ms {
				s.ApplyAt(at, sent, []crdt.Slot{{Key: string(other.Key), Window: limit.WindowStart(sent, w), Replica: "c", Count: 1}})
			}
			if from != 0 && at >= from+off {
				s.rep.mu.Lock()
				defer s.rep.mu.Unlock()
				return s.rep.state(&it, at).Unheard, uint64(told)
			}
			if at >= t0 && (at-t0)%(10*ms) == 0 {
				if at > t0 {
					told = 10 + (at-5*ms-t0)/(20*ms) // 10, then 50 a second
					s.ApplyAt(at, at-5*ms, []crdt.Slot{{Key: string(it.Key), Window: t0, Replica: "b", Count: uint64(told)}})
				}
				if admit(t, s, at, it, 1) != 1 {
					t.Fatalf("a's hit at %v denied", time.Duration(at-t0))
				}
			}
		}
	}
	early := func(int64) int64 { return t0 - 50*ms }
	late := func(from int64) int64 {
		if from == 0 {
			return 0
		}
		return from + 5*ms
	}
	for _, off := range []int64{100 * ms, 230 * ms} {
		fresh, told := unheard(nil, off)
		if fresh <= 0 {
			t.Fatalf("+%v: Unheard without c = %v, want b's guess > 0", time.Duration(off), fresh)
		}
		want := fresh // past the time c's first news of the key could take
		if off < 80*ms+int64(estimate.FirstNewsSpan+estimate.BeforeSlack) {
			want = fresh + float64(told) + fresh
		}
		if got, _ := unheard(early, off); math.Abs(got-want) > 1e-9 {
			t.Errorf("+%v, c heard before the key began: Unheard = %v, want %v (b told %d, guessed %v)", time.Duration(off), got, want, told, fresh)
		}
	}
	fresh, _ := unheard(nil, 100*ms)
	if got, _ := unheard(late, 100*ms); math.Abs(got-fresh) > 1e-9 {
		t.Errorf("c heard after a began to remember the key: Unheard = %v, want %v (b's guess alone)", got, fresh)
	}
}

// TestMirrorEvidence: a client within its limit of 100 a minute, its
// requests spread over PoPs a and b: b has counted 78 of them, a 18 over
// the first 40 s of the window and one more 20 ms before a check 50 s in
// (and 3 in the previous window); b's news comes every 100 ms, 40 ms on the
// way. The one hit a admitted in the age of b's news says nothing of the
// room opening: b is guessed at its own rate (a fraction of a hit), and
// the client's next request, its 98th, is admitted. Scaled by b's part
// against a's (78/18) that hit was four more of b's, and the request was
// denied. Two hits in the age are taken for the room opening, and the
// mirror holds — but not in the key's first window at a (none of it in the
// previous window), where no room has opened: b is guessed at its rate
// again.
func TestMirrorEvidence(t *testing.T) {
	ms := int64(time.Millisecond)
	t0 := limittest.T0.Add(10*time.Minute + 50*time.Second).UnixNano() // 50 s into a window
	start := limit.WindowStart(t0, int64(time.Minute))
	for _, c := range []struct {
		name   string
		recent int  // a's hits in the last 20 ms before the check
		before bool // a admitted the key in the previous window
		mirror bool
	}{
		{"one hit", 1, true, false},
		{"two hits", 2, true, true},
		{"two hits, first window", 2, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			it := windowItem(rules.Minute, limit.SlidingWindow, limit.ScopeGlobal, 100, "evidence")
			s := NewMemory(MemoryConfig{Replica: "a", Extrapolate: true})
			if c.before && admit(t, s, start-30*int64(time.Second), it, 3) != 3 {
				t.Fatal("a's hits in the previous window denied")
			}
			slot := []crdt.Slot{{Key: string(it.Key), Window: start, Replica: "b", Count: 78}}
			s.ApplyAt(start+time.Second.Nanoseconds(), start+time.Second.Nanoseconds()-40*ms, slot)
			for i := range int64(18) {
				if admit(t, s, start+(2+2*i)*int64(time.Second), it, 1) != 1 {
					t.Fatalf("a's hit %d denied", i)
				}
			}
			for _, sent := range []int64{t0 - 200*ms, t0 - 100*ms} {
				s.ApplyAt(sent+40*ms, sent, slot)
			}
			for i := range c.recent {
				if admit(t, s, t0-20*ms+int64(i)*ms, it, 1) != 1 {
					t.Fatalf("a's recent hit %d denied", i)
				}
			}
			s.rep.mu.Lock()
			st := s.rep.state(&it, t0)
			s.rep.mu.Unlock()
			// b's own rate over the 100 ms age of its news: 78 in the
			// 50 s of the window before it.
			rate := 78 * 0.1 / 50
			then := 18.0 // what a admitted before the age: its 18, and a sixth of the previous window's 3
			if c.before {
				then += 0.5
			}
			mirror := float64(c.recent) * 78 / then
			t.Logf("guessed %.2f of b (its rate: %.2f, the mirror: %.2f)", st.Unheard, rate, mirror)
			if c.mirror {
				if st.Unheard < 0.9*mirror {
					t.Fatalf("Unheard = %.2f after %d hits in the age: the mirror (%.2f) was capped", st.Unheard, c.recent, mirror)
				}
				return
			}
			if st.Unheard > 2*rate {
				t.Fatalf("Unheard = %.2f after %d hits in the age: more than b's rate gives (%.2f)", st.Unheard, c.recent, rate)
			}
			if admit(t, s, t0, it, 1) != 1 {
				t.Fatal("the client's 98th request of the minute denied")
			}
		})
	}
}

// stepItem is a key of 100 a second for a clock step's tests, and a window
// start 30 s on from limittest.T0.
func stepItem(v string) (limit.Item, int64) {
	it := perSecond(limit.SlidingWindow, 100, v)
	return it, limit.WindowStart(limittest.T0.Add(30*time.Second).UnixNano(), it.Spec.Window)
}

// TestNewKeyRemembered: a key with no count in the previous window has
// its admissions remembered from a 32nd of its limit, one that had a count
// there only from a quarter (where it comes near its limit and is hot). A
// sprayer's key that began 100 ms before a window boundary, 20 of its 100
// a second admitted here, when the agreed clock steps this PoP 150 ms
// forward across the boundary: the 17 admitted since they were remembered
// (from the 4th hit, a 25th of the limit) are less than a second old for
// most of the next window and count in it too, so 750 ms into it 78 more
// may be admitted (20 × 0.25 + 17 counted), not the 95 a store that forgot
// them with the old window lets in. The key is not hot for that: it is not
// near its limit. The same hits of a key that b counted 2 of in the window
// before are not remembered: 95.
func TestNewKeyRemembered(t *testing.T) {
	ms := int64(time.Millisecond)
	it, s0 := stepItem("new")
	for _, c := range []struct {
		name  string
		prev  uint64 // b's count of the window before the first hit's
		after int    // admitted 750 ms into the window after the step
	}{
		{"new", 0, 78},
		{"old", 2, 95},
	} {
		s := NewMemory(MemoryConfig{Replica: "a", Extrapolate: true})
		if c.prev > 0 {
			s.ApplyAt(s0-900*ms, s0-950*ms, []crdt.Slot{{Key: string(it.Key), Window: s0 - 2000*ms, Replica: "b", Count: c.prev}})
		}
		for i := range int64(20) {
			if admit(t, s, s0-100*ms+i*2*ms, it, 1) != 1 {
				t.Fatalf("%s: hit %d denied", c.name, i)
			}
		}
		if hot := s.Hot(s.Delta()); len(hot) > 0 {
			t.Errorf("%s: hot 20 hits into a limit of 100", c.name)
		}
		s.MoveClock(s0-50*ms+150*ms, 150*ms)
		if n := admit(t, s, s0+750*ms, it, 100); n != c.after {
			t.Errorf("%s: admitted %d 750 ms into the window after the step, want %d", c.name, n, c.after)
		}
	}
}

// TestSettledCorrection: a and b share a key of 100 a second. In one window
// b admits 50 hits in its first half and none after, telling a every 100 ms
// (60 ms on the way); a guesses b by its rate, admits up to its estimate's
// limit late in the window, and so leaves room its guess of b held: the
// window settles under the limit. 300 ms into the next window a judges that window and takes
// estimate.SettleGain of the shortfall (below the limit less estimate.SettleSlack) off its
// guess from then on; a window after one not at the limit halves the
// correction. The PoP's own count as its store read it (several servers)
// counts in the settled count: settled within the band, nothing changes;
// over the limit, the correction adds estimate.SettleGain of the excess. While b's
// news is held up, the window is not settled and nothing is judged. The
// judged window is reported to SettledExcess as news is applied.
func TestSettledCorrection(t *testing.T) {
	ms := int64(time.Millisecond)
	it := perSecond(limit.SlidingWindow, 100, "settled")
	w := it.Spec.Window
	s0 := limit.WindowStart(limittest.T0.Add(30*time.Second).UnixNano(), w)
	key := string(it.Key)
	var seen []float64 // what SettledExcess reported, in percent of the limit
	run := func(t *testing.T, popExtra uint64, bFlows bool) (*Memory, float64, float64) {
		t.Helper()
		seen = nil
		s := NewMemory(MemoryConfig{Replica: "a", Extrapolate: true, SettledExcess: func(sc limit.Scope, pct float64) {
			if sc != limit.ScopeGlobal {
				t.Errorf("SettledExcess scope %v, want global", sc)
			}
			seen = append(seen, pct)
		}})
		for sent := s0; sent < s0+w; sent += 100 * ms {
			n := uint64(min(50, 10*(sent-s0)/(100*ms)))
			s.ApplyAt(sent+60*ms, sent, []crdt.Slot{{Key: key, Window: s0, Replica: "b", Count: max(n, 1)}})
			if sent >= s0+700*ms {
				admit(t, s, sent+90*ms, it, 20) // until a's estimate reaches the limit
			}
		}
		own := float64(s.rep.units[w].own.Count(key, s0))
		if popExtra > 0 {
			s.rep.mu.Lock()
			s.rep.popCount(w, key, s0, uint64(own)+popExtra) // another server of the PoP admitted more
			s.rep.mu.Unlock()
		}
		settled := own + float64(popExtra) + 50
		// Into the next window: b's news goes on, nothing new of the key.
		s1 := s0 + w
		for sent := s1; bFlows && sent <= s1+300*ms; sent += 100 * ms {
			s.ApplyAt(sent+60*ms, sent, []crdt.Slot{{Key: key, Window: s0, Replica: "b", Count: 50}})
		}
		return s, own, settled
	}
	check := func(s *Memory, now int64) (limit.State, float64) {
		s.rep.mu.Lock()
		defer s.rep.mu.Unlock()
		st := s.rep.state(&it, now)
		u := s.rep.units[w]
		return st, u.recent[key].Correction()
	}

	t.Run("settled under", func(t *testing.T) {
		s, own, settled := run(t, 0, true)
		if settled >= 100-estimate.SettleSlack {
			t.Fatalf("the window settled at %v (a admitted %v): the setup meant it to settle under %v", settled, own, 100-estimate.SettleSlack)
		}
		s1 := s0 + w
		if _, c := check(s, s1+200*ms); c != 0 {
			t.Fatalf("correction %v before the window settled (200 ms), want 0", c)
		}
		now := s1 + 360*ms
		st, c := check(s, now)
		want := max(estimate.SettleGain*(settled-(100-estimate.SettleSlack)), -estimate.SettleBound*100)
		if math.Abs(c-want) > 1e-9 {
			t.Fatalf("correction %v after a window settled at %v, want %v", c, settled, want)
		}
		s.rep.mu.Lock()
		u := s.rep.units[w]
		raw := s.rep.unheard(u, key, u.own.Key(key), u.remote.Key(key), s1, w, now, nil)
		s.rep.mu.Unlock()
		if math.Abs(st.Unheard-max(raw+c, 0)) > 1e-9 {
			t.Errorf("Unheard %v, want the guess %v corrected by %v", st.Unheard, raw, c)
		}
		if len(seen) != 0 {
			t.Fatalf("SettledExcess reported %v before news was applied", seen)
		}
		s.ApplyAt(now+5*ms, now, []crdt.Slot{{Key: key, Window: s0, Replica: "b", Count: 50}})
		if len(seen) != 1 || math.Abs(seen[0]-(settled-100)) > 1e-9 {
			t.Errorf("SettledExcess reported %v, want once %v%% (the window settled at %v of 100)", seen, settled-100, settled)
		}
		// The window after: a admits 20 more of it, far from the limit.
		if n := admit(t, s, s1+400*ms, it, 20); n != 20 {
			t.Fatalf("%d of 20 admitted at 400 ms", n)
		}
		for sent := s1 + 400*ms; sent <= s1+w+300*ms; sent += 100 * ms { // b's news flows (a held b's would not settle)
			s.ApplyAt(sent+60*ms, sent, []crdt.Slot{{Key: key, Window: s0, Replica: "b", Count: 50}})
		}
		if _, c2 := check(s, s1+w+360*ms); math.Abs(c2-c/2) > 1e-9 {
			t.Errorf("correction %v after a window not at the limit, want half of %v", c2, c)
		}
	})
	// Another server of the PoP admitted more of the window than this one
	// (popCount): the settled count holds them.
	_, _, under := run(t, 0, true)
	for _, c := range []struct {
		name string
		over float64 // settled minus the limit
		want float64
	}{
		{"within the band", -1, 0},
		{"over the limit", 3, estimate.SettleGain * 3},
	} {
		t.Run("the PoP's own count settles "+c.name, func(t *testing.T) {
			s, _, settled := run(t, uint64(100+c.over-under), true)
			if _, got := check(s, s0+w+360*ms); math.Abs(got-c.want) > 1e-9 {
				t.Errorf("correction %v with the PoP's count settling the window at %v, want %v", got, settled, c.want)
			}
		})
	}
	t.Run("held replica", func(t *testing.T) {
		s, _, settled := run(t, 0, false) // b silent since the window's end: held up
		if _, c := check(s, s0+w+360*ms); c != 0 {
			t.Errorf("correction %v with b's news held up (its count %v not settled), want 0", c, settled)
		}
	})
}

// TestMovedKeyIsNotNew: a key that b admitted through the previous window
// and half of this one (a client at b) moves to a mid-window. c's latest
// news, of another key, was stamped before a began to remember the key,
// and its beacons keep coming. The key is not new: it was counted before
// this window began, so c had the whole previous window and half this one
// to tell of it and told nothing — it counts for none, as it would had a
// remembered the key all along. Counted as b (the rule for a key that has
// just begun), a guessed c at b's whole sliding count, a hundred hits it
// never admitted, and denied the client it had just taken over.
func TestMovedKeyIsNotNew(t *testing.T) {
	ms := int64(time.Millisecond)
	it := perSecond(limit.SlidingWindow, 200, "moved")
	other := perSecond(limit.SlidingWindow, 100, "other")
	w := it.Spec.Window
	t0 := limit.WindowStart(limittest.T0.Add(30*time.Second).UnixNano(), w)
	moved := t0 + 500*ms
	unheard := func(withC bool) float64 {
		t.Helper()
		s := NewMemory(MemoryConfig{Replica: "a", Extrapolate: true})
		for at := t0 - w; at < moved; at += 10 * ms {
			if withC && (at-t0)%(500*ms) == 0 {
				s.BeaconAt(at, "c")
			}
			if withC && at == moved-100*ms {
				s.ApplyAt(at, at-80*ms, []crdt.Slot{{Key: string(other.Key), Window: limit.WindowStart(at-80*ms, w), Replica: "c", Count: 1}})
			}
			// b admits 100 a second and tells of it 5 ms later.
			sent := at - 5*ms
			var sl []crdt.Slot
			if n := (sent - (t0 - w)) / (10 * ms); sent < t0 {
				sl = append(sl, crdt.Slot{Key: string(it.Key), Window: t0 - w, Replica: "b", Count: uint64(n)})
			} else {
				sl = append(sl, crdt.Slot{Key: string(it.Key), Window: t0 - w, Replica: "b", Count: 100},
					crdt.Slot{Key: string(it.Key), Window: t0, Replica: "b", Count: uint64((sent - t0) / (10 * ms))})
			}
			s.ApplyAt(at, sent, sl)
		}
		if admit(t, s, moved, it, 1) != 1 {
			t.Fatalf("a's first hit of the moved key denied")
		}
		s.rep.mu.Lock()
		defer s.rep.mu.Unlock()
		return s.rep.state(&it, moved+ms).Unheard
	}
	alone := unheard(false)
	if got := unheard(true); math.Abs(got-alone) > 1e-9 {
		t.Errorf("Unheard = %v with a silent c, want %v as without it: c never told of the key", got, alone)
	}
}
