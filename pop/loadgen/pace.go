package loadgen

import (
	"context"
	"sort"
	"time"
)

// Second is one second of a run's timeline: the checks answered 200
// (Allowed) and 429 (Denied) whose responses ended in the Unix second Unix.
// Seconds are the PoPs' window boundaries for a limit of unit second, so
// the timelines of several generators, each driving its own PoP, add up to
// the admissions of every window.
type Second struct {
	Unix    int64 `json:"unix"`
	Allowed int64 `json:"allowed"`
	Denied  int64 `json:"denied"`
}

// pacer schedules one worker's requests at a fixed rate. The zero pacer
// (interval 0) does not wait: the worker is closed-loop. Only its worker's
// goroutine uses it.
type pacer struct {
	interval time.Duration
	next     time.Time
}

// newPacer paces one of n workers sharing rate requests per second; the
// workers' schedules are offset so that together they send evenly. rate 0
// gives the zero pacer.
func newPacer(rate float64, n, idx int, start time.Time) pacer {
	if rate <= 0 {
		return pacer{}
	}
	iv := time.Duration(float64(n) * float64(time.Second) / rate)
	return pacer{interval: iv, next: start.Add(iv * time.Duration(idx) / time.Duration(n))}
}

// wait blocks until the next request is due, and reports false when ctx
// ended first. A worker that falls behind sends at once but never more than
// one interval's worth of catching up: a stalled PoP is not hit by a burst
// of the requests it could not take.
func (p *pacer) wait(ctx context.Context) bool {
	if p.interval == 0 {
		return true
	}
	now := time.Now()
	if p.next.Before(now.Add(-p.interval)) {
		p.next = now
	}
	if d := p.next.Sub(now); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
	p.next = p.next.Add(p.interval)
	return true
}

// timeline counts one worker's decisions by Unix second. The nil timeline
// counts nothing. Only its worker's goroutine uses it.
type timeline map[int64]*Second

// add counts a response with status that ended at t.
func (tl timeline) add(t time.Time, status int) {
	if tl == nil || (status != 200 && status != 429) {
		return
	}
	u := t.Unix()
	s := tl[u]
	if s == nil {
		s = &Second{Unix: u}
		tl[u] = s
	}
	if status == 200 {
		s.Allowed++
	} else {
		s.Denied++
	}
}

// mergeTimelines adds up the workers' timelines, in time order.
func mergeTimelines(tls []timeline) []Second {
	sum := map[int64]*Second{}
	for _, tl := range tls {
		for u, s := range tl {
			if sum[u] == nil {
				sum[u] = &Second{Unix: u}
			}
			sum[u].Allowed += s.Allowed
			sum[u].Denied += s.Denied
		}
	}
	out := make([]Second, 0, len(sum))
	for _, s := range sum {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Unix < out[j].Unix })
	return out
}
