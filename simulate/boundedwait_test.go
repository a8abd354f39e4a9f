package simulate

import (
	"testing"
	"time"
)

// waitScenario: a client pinned to PoP a, sending 300 checks within 30 ms
// on a limit of 100 a minute held by a and b, 20 ms apart: b's half is
// idle, and its give reaches a after the burst has ended.
const waitScenario = `
name: bounded-wait
seed: 1
duration: 1s
flush_interval: 50ms
regions:
  - {name: r1, pops: [a]}
  - {name: r2, pops: [b]}
latency:
  - {from: r1, to: r2, ms: 20}
limit: {requests_per_unit: 100, unit: minute, consistency: bounded}
sources:
  - {name: pinned, key: client, rate: 10000, spread: anycast, pop: a, start: 100ms, end: 130ms}
`

// A check that a bounded limit denies while the other PoP holds allowance
// it does not need waits for the give, as a PoP's does, and is admitted
// when it arrives: the pinned client gets its whole limit, where without
// the wait it gets a's half; the wait shows as added latency, and nothing
// is admitted past the limit either way.
func TestBoundedWaitInSimulator(t *testing.T) {
	sc, err := ParseScenario([]byte(waitScenario))
	if err != nil {
		t.Fatal(err)
	}
	admitted := func(wait time.Duration) Result {
		t.Helper()
		sc := sc
		sc.BoundedWait = &wait
		rep, err := Run(sc)
		if err != nil {
			t.Fatal(err)
		}
		r := result(t, rep, Edgelimit)
		if r.WorstOvershoot > 0 {
			t.Errorf("wait %v: %d over the limit", wait, r.WorstOvershoot)
		}
		return r
	}
	without, with := admitted(0), admitted(250*time.Millisecond)
	t.Logf("admitted %d without, %d with; +latency %v", without.Admitted, with.Admitted, with.AddedLatency)
	if without.Admitted > 55 {
		t.Errorf("without waiting a admitted %d of 300 before b's give could arrive, want its half, 50", without.Admitted)
	}
	if with.Admitted < 95 {
		t.Errorf("waiting for b's give, a admitted %d of 300, want the whole limit, 100", with.Admitted)
	}
	if with.AddedLatency == 0 || without.AddedLatency != 0 {
		t.Errorf("+latency %v with the wait and %v without; want the wait's, and none", with.AddedLatency, without.AddedLatency)
	}
	if with.Decisions != without.Decisions {
		t.Errorf("%d decisions with the wait, %d without: every waiting check must be decided", with.Decisions, without.Decisions)
	}
}
