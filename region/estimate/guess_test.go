package estimate

import (
	"math"
	"testing"
	"time"
)

// TestUnheardFirstNews: a replica's first news of a key it began to admit
// with this window says n hits in a span that ends with the n-th (it sends
// news right after it admits), so its rate is n−½ over that span; the guess
// is that rate over the age of the news — no more than its delay while no
// gap between its messages is known. The values a store would hand in, and
// nothing else.
func TestUnheardFirstNews(t *testing.T) {
	ms := int64(time.Millisecond)
	w := int64(time.Minute)
	t0 := 1000 * w      // a window starts here
	sent := t0 + 100*ms // 100 ms into the window
	c := NewClock("b")
	c.Heard(sent+50*ms, sent) // 50 ms on the way
	k := Key{Now: sent + 100*ms, Start: t0, Window: w}
	for _, n := range []uint64{1, 2, 5} {
		got := Unheard(k, []Count{{Name: "b", Cur: n}}, []*Clock{c}, nil)
		want := (float64(n) - 0.5) / 100 * 50
		if math.Abs(got-want) > 1e-4 { // ns stamps as float64 are off by ~256 ns
			t.Errorf("count %d: Unheard = %v, want %v", n, got, want)
		}
		if g := c.Guess(k, n, 0); g != got {
			t.Errorf("count %d: Guess = %v, Unheard = %v: one replica, want the same", n, g, got)
		}
	}
	// A replica out of the scope is not counted.
	if got := Unheard(k, nil, []*Clock{c}, func(string) bool { return false }); got != 0 {
		t.Errorf("no replica of the scope told of the key: Unheard = %v, want 0", got)
	}
}

// TestJudge walks the settled count's correction over windows of a key of
// 100: a window at the limit that settled under it less SettleSlack takes
// SettleGain of the shortfall off, one over the limit adds SettleGain of
// the excess, within the band a negative correction gives back, and a
// window not at the limit here halves it; never past SettleBound.
func TestJudge(t *testing.T) {
	w := int64(time.Second)
	var r Recent
	for _, c := range []struct {
		name    string
		reached bool   // this PoP found the key at its limit in the window
		settled uint64 // the window's settled count, own + others
		want    float64
	}{
		{"under", true, 88, SettleGain * (88 - (100 - SettleSlack))},
		{"within the band", true, 99, SettleGain*(88-(100-SettleSlack)) + SettleGain*(99-(100-SettleSlack))},
		{"far under: bounded", true, 10, -SettleBound * 100},
		{"not at the limit", false, 50, -SettleBound * 100 / 2},
		{"over", true, 104, -SettleBound*100/2 + SettleGain*4},
	} {
		start := r.judged + w
		if r.judged == 0 {
			start = 10 * w
		}
		if c.reached {
			r.Reached(start - w)
		}
		if r.Due(start, w, start+100*int64(time.Millisecond), nil, nil) {
			t.Fatalf("%s: due 100 ms into the window, before settleAfter", c.name)
		}
		now := start + settleAfter
		if !r.Due(start, w, now, nil, nil) {
			t.Fatalf("%s: not due at settleAfter", c.name)
		}
		settled, atLimit := r.Judge(start, w, 100, c.settled-3, 3)
		if atLimit != c.reached || atLimit && settled != float64(c.settled) {
			t.Errorf("%s: Judge = %v, %v; want %v, %v", c.name, settled, atLimit, float64(c.settled), c.reached)
		}
		if got := r.Correction(); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s: correction %v, want %v", c.name, got, c.want)
		}
		if r.Due(start, w, now, nil, nil) {
			t.Errorf("%s: due again once judged", c.name)
		}
	}
}
