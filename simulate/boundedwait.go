package simulate

import (
	"context"
	"slices"
	"time"

	"github.com/edgelimit/edgelimit/pop"
)

// A check that bounded limits deny while allowance for it is on its way
// waits at its PoP, as a PoP's check does (pop.Engine.UseAllowanceWait), on
// the simulated clock: it is decided again each time escrow news reaching
// its PoP says deciding it again may admit it, and a last time at the end of
// its wait (Scenario.BoundedWait). It is graded at its final decision, at
// that instant, and its wait is added latency.

// waitingCheck is a check waiting for bounded allowance.
type waitingCheck struct {
	key, pop int
	arrived  int64
	await    <-chan struct{}
}

// waitingChecks are a run's waiting checks, by id and by PoP.
type waitingChecks struct {
	checks map[int]*waitingCheck
	atPoP  [][]int // ids per PoP, oldest first
	next   int
}

// boundedWait is the wait of sc's checks for bounded allowance: its
// bounded_wait, or edgelimit pop's default.
func boundedWait(sc *Scenario) time.Duration {
	if sc.BoundedWait != nil {
		return *sc.BoundedWait
	}
	return pop.DefaultBoundedWait
}

// await sets the check of key k that arrived at PoP p at arrived waiting on
// ch until arrived plus the run's wait.
func (r *run) await(k, p int, arrived int64, ch <-chan struct{}) {
	w := &r.waiting
	if w.checks == nil {
		w.checks, w.atPoP = map[int]*waitingCheck{}, make([][]int, len(r.engines))
	}
	id := w.next
	w.next++
	w.checks[id] = &waitingCheck{key: k, pop: p, arrived: arrived, await: ch}
	w.atPoP[p] = append(w.atPoP[p], id)
	r.q.schedule(event{at: arrived + r.wait, kind: evWaited, idx: id})
}

// take removes waiting check id and returns it, or nil if it is no longer
// waiting.
func (w *waitingChecks) take(id int) *waitingCheck {
	c := w.checks[id]
	if c == nil {
		return nil
	}
	delete(w.checks, id)
	w.atPoP[c.pop] = slices.DeleteFunc(w.atPoP[c.pop], func(x int) bool { return x == id })
	return c
}

// wake decides again every check waiting at PoP p whose channel news has
// closed.
func (r *run) wake(p int) error {
	w := &r.waiting
	if w.checks == nil || len(w.atPoP[p]) == 0 {
		return nil
	}
	for _, id := range slices.Clone(w.atPoP[p]) {
		select {
		case <-w.checks[id].await:
		default:
			continue
		}
		c := w.take(id)
		if err := r.decide(context.Background(), c.key, c.pop, c.arrived, r.q.now < c.arrived+r.wait); err != nil {
			return err
		}
	}
	return nil
}

// waitedOut decides waiting check id a last time, at the end of its wait.
func (r *run) waitedOut(id int) error {
	c := r.waiting.take(id)
	if c == nil {
		return nil // decided already
	}
	return r.decide(context.Background(), c.key, c.pop, c.arrived, false)
}

// finishWaiting decides, at the run's end, the checks still waiting.
func (r *run) finishWaiting() error {
	ids := make([]int, 0, len(r.waiting.checks))
	for id := range r.waiting.checks {
		ids = append(ids, id)
	}
	slices.Sort(ids) // in the order they began to wait: the run stays deterministic
	for _, id := range ids {
		if err := r.waitedOut(id); err != nil {
			return err
		}
	}
	return nil
}
