package escrow

import "testing"

// TestStep: replica a of three holds a third of a fixed window of 99 and
// admits 30 hits 900 ms into window 1. The clock agreement then steps its
// clock 300 ms forward, into window 2: by the agreed clock some of those 30
// hits fell in window 2, where b and c count from its start, so window 2
// must count them — all 30, since counts cannot tell which. A step that
// stays within the window, or goes back, moves nothing.
func TestStep(t *testing.T) {
	const s = int64(1e9)
	spec := Spec{Limit: 99, Window: s}
	cases := []struct {
		name       string
		before, d  int64 // the instant of the 30 hits, and the step
		wantRemain int64 // a's room in the window it is in after the step
	}{
		{"forward across the window's start", s + 900e6, 300e6, 33 - 30},
		{"forward within the window", s + 100e6, 300e6, 33 - 30}, // the same window: its own 30 stand
		{"back across the window's start", 2*s + 100e6, -300e6, 33 - 30},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, _, _ := trio(t, 0)
			if ok, _ := a.Decide(c.before, "k", spec, 30); !ok {
				t.Fatal("30 of a third of 99 denied")
			}
			now := c.before + 1 + c.d
			a.Step(now, c.d)
			if _, remain := a.Decide(now, "k", spec, 0); remain != c.wantRemain {
				t.Errorf("after the step: room %d, want %d", remain, c.wantRemain)
			}
			if c.d > 0 && windowStart(now, s) > windowStart(c.before, s) {
				// What a publishes carries the moved count: b and c see it.
				_, items := a.Own(now)
				var n uint64
				for _, it := range items {
					if it.Window == windowStart(now, s) && it.Kind == Count && it.Replica == "a" {
						n = it.Value
					}
				}
				if n != 30 {
					t.Errorf("a publishes a count of %d in the new window, want 30", n)
				}
			}
		})
	}
}
