package estimate

import (
	"testing"
	"time"
)

// TestClockStep: when a replica's stamp-to-apply delay steps by more than
// jitter — a clock moved — the age of its news follows at once instead of
// over a dozen messages.
func TestClockStep(t *testing.T) {
	ms := int64(time.Millisecond)
	c := &Clock{}
	now := int64(1000 * time.Second)
	for i := range int64(20) { // 310 ms: a clock 300 ms behind, 10 ms on the way
		sent := now + i*10*ms
		c.Heard(sent+310*ms, sent)
	}
	// The clocks agree: the next message says 10 ms.
	sent := now + 200*ms
	c.Heard(sent+10*ms, sent)
	if got := c.age(sent+10*ms, 0); got != float64(10*ms) {
		t.Fatalf("age on arrival after the step = %v, want 10ms", time.Duration(got))
	}
	// Jitter is smoothed, not followed.
	c.Heard(sent+10*ms+30*ms, sent+10*ms)
	if got := c.age(sent+40*ms, 0); got != float64(10*ms)+float64(20*ms)/8 {
		t.Fatalf("age after 30 ms of jitter = %v, want 12.5ms", time.Duration(got))
	}
}
