package simulate

import (
	"slices"
	"testing"
	"unsafe"
)

// TestOracle grades timelines computed by hand: window 10ns, limit 3.
func TestOracle(t *testing.T) {
	type dec struct {
		at    int64
		admit bool
	}
	cases := []struct {
		name                     string
		decs                     []dec
		falseAllow, falseDeny    int64
		worst, admitted          int64
		crossing, firstDeny, end int64
		windows                  int64 // fixed windows that admitted anything
		excess                   int64 // Σ per fixed window of max(0, admitted − limit)
		legit                    int64
	}{
		{
			// The denial at 3 is the 4th hit offered in (−7, 3]: not legit.
			name:      "exact limiter",
			decs:      []dec{{0, true}, {1, true}, {2, true}, {3, false}, {10, true}, {11, true}},
			admitted:  5,
			crossing:  3,
			firstDeny: 3,
			end:       20, windows: 2,
		},
		{
			// t=10 sees (0, 10]: the hits at 1 and 2 (0 left), so 2 + 1 ≤ 3 fits.
			name:      "window boundary is exclusive",
			decs:      []dec{{0, true}, {1, true}, {2, true}, {10, true}, {10, false}},
			admitted:  4,
			falseDeny: 0, // at the second t=10: 3 in (0,10], one more does not fit
			crossing:  10, firstDeny: 10,
			end: 20, windows: 2, excess: 0,
		},
		{
			name:       "overshoot and false allows",
			decs:       []dec{{0, true}, {1, true}, {2, true}, {3, true}, {4, true}, {5, false}},
			admitted:   5,
			falseAllow: 2, worst: 2,
			crossing: 3, firstDeny: 5,
			end: 10, windows: 1, excess: 2,
		},
		{
			// Offered in (−10, 1] are 2 hits, in (2, 12] 1: both denials
			// wronged a client within its limit.
			name:      "false denies",
			decs:      []dec{{0, true}, {1, false}, {2, true}, {12, false}},
			admitted:  2,
			falseDeny: 2, legit: 2,
			crossing: -1, firstDeny: 1,
			end: 25, windows: 1,
		},
		{
			// Hits at 8, 9 (window 0) and 10, 11 (window 1): 4 in (1, 11] is
			// over, though no fixed window holds more than 2.
			name:       "sliding overshoot across fixed windows",
			decs:       []dec{{8, true}, {9, true}, {10, true}, {11, true}},
			admitted:   4,
			falseAllow: 1, worst: 1,
			crossing: 11, firstDeny: -1,
			end: 20, windows: 2,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := newOracle(10, 3, 1, 0, 1, c.end)
			for _, d := range c.decs {
				o.decide(0, d.at, 1, d.admit)
			}
			o.finish()
			k := o.firsts[0]
			got := []int64{o.falseAllow, o.falseDeny, o.legitDeny, o.worst, o.admitted, k.crossing, k.firstDeny, o.fixedWindows, o.fixedExcess}
			want := []int64{c.falseAllow, c.falseDeny, c.legit, c.worst, c.admitted, c.crossing, c.firstDeny, c.windows, c.excess}
			names := []string{"false allows", "false denies", "legit denies", "worst", "admitted", "crossing", "first deny", "windows", "excess"}
			for i := range got {
				if got[i] != want[i] {
					t.Errorf("%s = %d, want %d", names[i], got[i], want[i])
				}
			}
		})
	}
}

// TestOracleCompacts checks that a long run keeps the log short and the
// count exact.
func TestOracleCompacts(t *testing.T) {
	o := newOracle(100, 50, 1, 0, 1000, 100000)
	for i := range int64(100000) {
		o.decide(0, i, 1, true)
	}
	k := &o.keys[0]
	if k.log.adm != 100 || k.log.offered != 100 {
		t.Fatalf("count in the last window = %d admitted, %d offered; want 100", k.log.adm, k.log.offered)
	}
	if o.worst != 50 {
		t.Fatalf("worst = %d, want 50", o.worst)
	}
	if len(k.log.log) > 4096 {
		t.Fatalf("the log holds %d entries for a window of 100", len(k.log.log))
	}
}

// TestOracleKeys checks that keys are graded apart, and the per-key figures:
// the histogram of excess per fixed window, the tracked key's series, and
// the denial lags. Window 10, limit 4.
func TestOracleKeys(t *testing.T) {
	o := newOracle(10, 4, 3, 1, 5, 20)
	// Key 0: 4 hits at 0..3 fit; 2 more at 4, 5 are false allows (excess 2 =
	// 50% of the limit); denied at 6 (crossed at 4: lag 2).
	for at := int64(0); at < 6; at++ {
		o.decide(0, at, 1, true)
	}
	o.decide(0, 6, 1, false)
	// Key 1 (tracked): 3 hits in window 0, denied at 7 though it fits (a
	// legit deny: 4 offered); 1 hit in window 1 at 12.
	for at := int64(1); at < 4; at++ {
		o.decide(1, at, 1, true)
	}
	o.decide(1, 7, 1, false)
	o.decide(1, 12, 1, true)
	// Key 2: never decided.
	o.finish()

	if o.falseAllow != 2 || o.falseDeny != 1 || o.legitDeny != 1 {
		t.Errorf("false allows %d, denies %d, legit %d; want 2, 1, 1", o.falseAllow, o.falseDeny, o.legitDeny)
	}
	if o.worst != 2 {
		t.Errorf("worst = %d, want 2 (key 0 only)", o.worst)
	}
	// Windows that admitted: key 0 window 0 (excess 50%), key 1 windows 0
	// and 1 (none).
	want := make([]int64, len(OvershootBuckets)+1)
	want[0] = 2
	want[slices.Index(OvershootBuckets, 50)] = 1
	if !slices.Equal(o.hist, want) {
		t.Errorf("histogram %v, want %v (edges %v)", o.hist, want, OvershootBuckets)
	}
	// Series of key 1 in steps of 5: [0,5) peaks at 3 admitted, [5,10)
	// saw 3 at the denial, [10,15) 2 (hits at 2, 3 expired by 12: (2,12]
	// holds 3 and 12 → 2).
	if want := []int64{3, 3, 2, 0}; !slices.Equal(o.series, want) {
		t.Errorf("series %v, want %v", o.series, want)
	}
	if !slices.Equal(o.lags, []int64{2}) {
		t.Errorf("lags %v, want [2] (key 0 crossed at 4, denied at 6; key 1 never crossed)", o.lags)
	}
	if o.keys[2].fixedCount != 0 || o.firsts[2].crossing != -1 {
		t.Error("key 2 was touched")
	}
}

func TestQuantiles(t *testing.T) {
	if q := quantiles(nil); q != (Quantiles{}) {
		t.Errorf("no samples: %+v", q)
	}
	s := make([]int64, 100)
	for i := range s {
		s[i] = int64(100 - i) // 100..1, unsorted
	}
	q := quantiles(s)
	if q.N != 100 || q.P50 != 50 || q.P99 != 99 || q.Max != 100 {
		t.Errorf("quantiles of 1..100 = %+v", q)
	}
}

// TestKeyLogSize: a key's log header stays one cache line (see keyLog).
func TestKeyLogSize(t *testing.T) {
	if n := unsafe.Sizeof(keyLog{}); n != 64 {
		t.Fatalf("keyLog is %d bytes, want 64", n)
	}
}
