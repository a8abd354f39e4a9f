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
