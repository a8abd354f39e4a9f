package simulate

import "testing"

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
		windows                  int64
		excess                   int64 // Σ per fixed window of max(0, admitted − limit)
	}{
		{
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
			name:      "false denies",
			decs:      []dec{{0, true}, {1, false}, {2, true}, {12, false}},
			admitted:  2,
			falseDeny: 2,
			crossing:  -1, firstDeny: 1,
			end: 25, windows: 3,
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
			o := newOracle(10, 3)
			for _, d := range c.decs {
				o.decide(d.at, 1, d.admit)
			}
			o.finish(c.end)
			got := []int64{o.falseAllow, o.falseDeny, o.worst, o.admitted, o.crossing, o.firstDeny, o.fixedWindows, o.fixedExcess}
			want := []int64{c.falseAllow, c.falseDeny, c.worst, c.admitted, c.crossing, c.firstDeny, c.windows, c.excess}
			names := []string{"false allows", "false denies", "worst", "admitted", "crossing", "first deny", "windows", "excess"}
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
	o := newOracle(100, 50)
	for i := range int64(100000) {
		o.decide(i, 1, true)
	}
	if o.count != 100 {
		t.Fatalf("count in the last window = %d, want 100", o.count)
	}
	if o.worst != 50 {
		t.Fatalf("worst = %d, want 50", o.worst)
	}
	if len(o.log) > 4096 {
		t.Fatalf("log holds %d entries for a window of 100", len(o.log))
	}
}
