package limit

import (
	"flag"
	"math/rand/v2"
	"testing"
	"time"
)

var seed = flag.Uint64("seed", 0, "seed for the property tests (0: from the clock)")

func rng(t *testing.T) *rand.Rand {
	s := *seed
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay with -seed %d)", s, s)
	return rand.New(rand.NewPCG(s, s^0x9E3779B97F4A7C15))
}

// What a denial promises and what an allowance reports are true: after
// waiting RetryAfter with nothing else arriving, the same hits fit; right
// after an allowance with Remaining r, r more single hits fit at once.
func TestDecisionsKeepTheirWord(t *testing.T) {
	r := rng(t)
	windows := []int64{int64(time.Second), int64(time.Minute), int64(time.Hour)}
	for trial := range 3000 {
		spec := Spec{
			Algorithm: Algorithm(r.IntN(int(SlidingLog) + 1)),
			Limit:     1 + r.Int64N(50),
			Window:    windows[r.IntN(len(windows))],
		}
		if spec.Algorithm == TokenBucket || spec.Algorithm == GCRA {
			spec.Burst = r.Int64N(2 * spec.Limit)
		}
		var st State
		now := int64(1706000040e9) + r.Int64N(spec.Window)
		for step := range 40 {
			now += r.Int64N(spec.Window / 4)
			hits := 1 + r.Int64N(3)
			d := spec.Take(&st, now, hits)
			if d.Remaining < 0 || d.Reset < 0 || d.RetryAfter < 0 {
				t.Fatalf("trial %d step %d %+v: negative field in %+v", trial, step, spec, d)
			}
			probe := cloneState(st)
			if d.Allowed {
				if d.RetryAfter != 0 {
					t.Fatalf("trial %d step %d %+v: allowed with RetryAfter %d", trial, step, spec, d.RetryAfter)
				}
				for i := range d.Remaining {
					if !spec.Take(&probe, now, 1).Allowed {
						t.Fatalf("trial %d step %d %+v: Remaining %d, but hit %d was denied", trial, step, spec, d.Remaining, i+1)
					}
				}
				continue
			}
			fits := spec.Limit // what can ever fit at once
			if spec.Algorithm == TokenBucket || spec.Algorithm == GCRA {
				fits = spec.Capacity()
			}
			if hits > fits {
				continue // can never fit: RetryAfter only says "not soon"
			}
			if got := spec.Take(&probe, now+d.RetryAfter, hits); !got.Allowed {
				t.Fatalf("trial %d step %d %+v: denied %d hits with RetryAfter %v, still denied then: %+v (state %+v)",
					trial, step, spec, hits, time.Duration(d.RetryAfter), got, st)
			}
		}
	}
}

func cloneState(st State) State {
	if st.Log != nil {
		l := *st.Log
		l.buf = append([]int64(nil), st.Log.buf...)
		st.Log = &l
	}
	return st
}

func TestParseAlgorithm(t *testing.T) {
	for _, a := range []Algorithm{SlidingWindow, FixedWindow, TokenBucket, GCRA, SlidingLog} {
		got, err := ParseAlgorithm(a.String())
		if err != nil || got != a {
			t.Fatalf("%v: %v %v", a, got, err)
		}
	}
	if a, err := ParseAlgorithm(""); err != nil || a != SlidingWindow {
		t.Fatal("empty algorithm is not sliding_window")
	}
	if _, err := ParseAlgorithm("leaky"); err == nil {
		t.Fatal("unknown algorithm accepted")
	}
}

func TestValidate(t *testing.T) {
	bad := []Spec{
		{Limit: 1},
		{Limit: -1, Window: 1},
		{Limit: 1, Window: 1, Burst: -1},
		{Algorithm: SlidingLog, Limit: MaxLogLimit + 1, Window: 1},
		{Algorithm: 9, Limit: 1, Window: 1},
	}
	for _, s := range bad {
		if s.Validate() == nil {
			t.Errorf("%+v validated", s)
		}
	}
	if err := (Spec{Limit: 0, Window: 1}).Validate(); err != nil {
		t.Errorf("a zero limit (deny all) is valid: %v", err)
	}
}

// TestUnheard checks that the window algorithms count State.Unheard as hits
// already admitted, and that Add leaves it alone.
func TestUnheard(t *testing.T) {
	w := int64(time.Second)
	start := int64(100) * w
	for _, c := range []struct {
		alg       Algorithm
		unheard   float64
		allowed   bool
		remaining int64
	}{
		{SlidingWindow, 0, true, 1},    // 4 + 4×½ + 2 hits = 8 of 9
		{SlidingWindow, 0.5, true, 0},  // 8.5 of 9
		{SlidingWindow, 1.5, false, 1}, // 9.5 of 9; 1 left for a single hit
		{FixedWindow, 0, true, 3},      // 4 + 2 = 6 of 9
		{FixedWindow, 2.5, true, 0},    // 4 + 3 + 2 = 9
		{FixedWindow, 3.5, false, 1},   // 4 + 4 + 2 = 10
	} {
		s := Spec{Algorithm: c.alg, Limit: 9, Window: w}
		st := State{Start: start, Cur: 4, Prev: 4, Unheard: c.unheard}
		d := s.Take(&st, start+w/2, 2)
		if d.Allowed != c.allowed || d.Remaining != c.remaining {
			t.Errorf("%v unheard %v: allowed %v remaining %d, want %v %d", c.alg, c.unheard, d.Allowed, d.Remaining, c.allowed, c.remaining)
		}
		if !d.Allowed && d.RetryAfter != 1 {
			// What was heard fits: the denial rests on the guess alone.
			t.Errorf("%v unheard %v: denied with RetryAfter %d, want 1", c.alg, c.unheard, d.RetryAfter)
		}
		if st.Unheard != c.unheard {
			t.Errorf("%v: Take changed Unheard to %v", c.alg, st.Unheard)
		}
	}
	// Over on what was heard: RetryAfter is the counts' own, Unheard or not.
	for _, alg := range []Algorithm{SlidingWindow, FixedWindow} {
		s := Spec{Algorithm: alg, Limit: 9, Window: w}
		for _, unheard := range []float64{0, 3} {
			st := State{Start: start, Cur: 9, Prev: 4, Unheard: unheard}
			if d := s.Take(&st, start+w/2, 1); d.Allowed || d.RetryAfter < w/2 {
				t.Errorf("%v unheard %v: allowed %v RetryAfter %d, want a denial until the next window", alg, unheard, d.Allowed, d.RetryAfter)
			}
		}
	}
}
