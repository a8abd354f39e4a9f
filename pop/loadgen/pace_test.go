package loadgen

import (
	"context"
	"testing"
	"time"
)

// TestRunRateTimeline paces a run at 400 requests/s over 4 connections for
// 1.5 s: about 600 requests, not the thousands a closed loop sends, and a
// timeline whose seconds add up to the decisions, split 200/429 as the
// server answered (every 3rd "hot" check denied).
func TestRunRateTimeline(t *testing.T) {
	s, srv := newCheckServer(t)
	rep, err := Run(context.Background(), Config{URL: srv.URL, Concurrency: 4, Duration: 1500 * time.Millisecond,
		Rate: 400, Timeline: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Requests < 450 || rep.Requests > 650 {
		t.Errorf("paced at 400/s for 1.5s: %d requests, want about 600", rep.Requests)
	}
	var allowed, denied int64
	for i, sec := range rep.Timeline {
		if i > 0 && sec.Unix <= rep.Timeline[i-1].Unix {
			t.Fatalf("timeline out of order: %+v", rep.Timeline)
		}
		allowed += sec.Allowed
		denied += sec.Denied
	}
	if len(rep.Timeline) < 2 || len(rep.Timeline) > 3 {
		t.Errorf("1.5s run spans %d seconds, want 2 or 3", len(rep.Timeline))
	}
	if allowed != rep.Status[200] || denied != rep.Status[429] {
		t.Errorf("timeline allowed %d denied %d; report %v", allowed, denied, rep.Status)
	}
	// The server answered every request the report counts, and at most one
	// more per worker: a request in flight when the run's time ran out,
	// whose answer the worker no longer read.
	_, status, _ := s.snapshot()
	if extra := status[200] + status[429] - allowed - denied; status[200] < allowed || status[429] < denied || extra > 4 {
		t.Errorf("server answered %v; the report counts %d allowed and %d denied (at most one in flight per worker may be missing)", status, allowed, denied)
	}
}

// TestPacerCatchUp: a worker that fell far behind its schedule sends at
// once, but does not burst to catch up the requests it missed.
func TestPacerCatchUp(t *testing.T) {
	p := newPacer(100, 1, 0, time.Now().Add(-time.Second)) // 100 slots missed
	start := time.Now()
	for range 5 {
		if !p.wait(context.Background()) {
			t.Fatal("wait ended early")
		}
	}
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Errorf("5 requests after a stall took %v: a burst, want about 4×10ms", d)
	}
}
