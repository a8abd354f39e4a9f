package estimate

import (
	"testing"
	"time"
)

// TestRecentSince checks what Recent remembers: exactly what was admitted
// after an instant its ring reaches back to, and an extrapolation at the
// ring's rate past it.
func TestRecentSince(t *testing.T) {
	var r Recent
	for i := range int64(100) { // one hit a ms, 100 of them: the ring holds the last 32
		r.add(i*int64(time.Millisecond), 0, 1)
	}
	now := 99 * int64(time.Millisecond)
	for _, c := range []struct {
		t    int64
		want float64
	}{
		{now, 0},
		{90 * int64(time.Millisecond), 9},
		{68 * int64(time.Millisecond), 31}, // the oldest held is at 68 ms
		// Past the ring: 31 hits after its oldest, in 31 ms, times 59 ms.
		{40 * int64(time.Millisecond), 59},
	} {
		if got := r.Since(c.t, now); got-c.want > 1e-9 || c.want-got > 1e-9 {
			t.Errorf("since(%v) = %v, want %v", time.Duration(c.t), got, c.want)
		}
	}
}

// TestRecentSinceAfterPause: a ring filled by hits a new window let in
// after a pause does not extrapolate their rate back over the pause. The
// PoP admitted 10 hits in the first 100 ms of a 1 s window, none for the
// rest of it (the room was gone), then 40 in the first 40 ms of the next.
// Since an instant in the pause, it admitted those 40 and no more; the
// ring's rate (1 a ms) over the span from there said 200 for 240 ms.
func TestRecentSinceAfterPause(t *testing.T) {
	ms := int64(time.Millisecond)
	w := 1000 * ms
	var r Recent
	for i := range int64(10) {
		r.add(i*10*ms, 0, 1)
	}
	for i := range int64(40) {
		r.add(w+i*ms, w, 1)
	}
	now := w + 39*ms
	if got := r.Since(800*ms, now); got != 40 {
		t.Errorf("since(800ms) after a pause = %v, want the 40 admitted since", got)
	}
	// Before the last admission of the earlier window the pause bounds
	// nothing: the ring's rate goes on.
	if got, want := r.Since(50*ms, now), 31.0*float64(now-50*ms)/float64(31*ms); got != want {
		t.Errorf("since(50ms) = %v, want the ring's rate over the span, %v", got, want)
	}
	// A clock step moves the pause with the rest (shift).
	r.Shift(-5 * ms)
	if got := r.Since(800*ms-5*ms, now-5*ms); got != 40 {
		t.Errorf("since after a clock step = %v, want 40", got)
	}
}
