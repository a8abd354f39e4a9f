package simulate

import (
	"testing"
	"time"
)

// result returns rep's row of strategy st.
func result(t *testing.T, rep Report, st Strategy) Result {
	t.Helper()
	for _, r := range rep.Results {
		if r.Strategy == st.String() {
			return r
		}
	}
	t.Fatalf("no %s row", st)
	return Result{}
}

// A strong limit in the simulator is decided at the key's home: over the
// limit no more than one central store, at the cost of a round trip for
// the checks made outside the home region, which +latency reports.
func TestStrongHoldsLikeCentral(t *testing.T) {
	sc := load(t, "spray.yaml")
	sc.Duration = 5 * time.Second
	sc.Limit.Consistency = "strong"
	rep, err := Run(sc)
	if err != nil {
		t.Fatal(err)
	}
	central := result(t, rep, Centralized)
	for _, st := range []Strategy{Edgelimit, AsyncSync} {
		r := result(t, rep, st)
		if r.WorstOvershoot > central.WorstOvershoot {
			t.Errorf("%s: worst %d over the limit, central %d", st, r.WorstOvershoot, central.WorstOvershoot)
		}
		// Three PoPs of four ask a home in their own region (10 or 8 ms
		// one way) or the other (40 ms): the mean round trip is tens of ms.
		if r.AddedLatency < 10*time.Millisecond || r.AddedLatencyP99 < r.AddedLatency {
			t.Errorf("%s: +latency %v, p99 %v: want the round trips to the home", st, r.AddedLatency, r.AddedLatencyP99)
		}
		if r.HomeUnreachable != 0 {
			t.Errorf("%s: %d checks found no home on a network without cuts", st, r.HomeUnreachable)
		}
	}
	if r := result(t, rep, LocalOnly); r.AddedLatency != 0 || r.AddedLatencyP99 != 0 {
		t.Errorf("local-only waited %v (p99 %v) on the network", r.AddedLatency, r.AddedLatencyP99)
	}
}

// A home whose clock the PoPs' agreement corrects holds the limit across
// the step: on skew.yaml the home (eu-central, 300 ms behind) steps 300 ms
// forward 80 ms into the spray, and the hits it admitted before count in
// the window the new clock puts them in. Without that, the sprayer went
// far over the limit in the first second, where one central store does not.
func TestStrongHomeClockStep(t *testing.T) { clockStepHeld(t, "strong") }

// A PoP whose clock the clock agreement steps forward holds a bounded limit
// as well: the hits it admitted just before the step, which the agreed
// clock places in the new window, count there (escrow.Ledger.Step).
// Without that, skew.yaml's PoP 300 ms behind spent a second allowance in
// the same second.
func TestBoundedClockStep(t *testing.T) { clockStepHeld(t, "bounded") }

// clockStepHeld runs skew.yaml's first 3 s under consistency mode and
// holds its worst window to the central store's.
func clockStepHeld(t *testing.T, mode string) {
	sc := load(t, "skew.yaml")
	sc.Duration = 3 * time.Second
	sc.Limit.Consistency = mode
	for _, seed := range []uint64{0, 1} {
		sc.Seed = seed
		rep, err := Run(sc)
		if err != nil {
			t.Fatal(err)
		}
		central, r := result(t, rep, Centralized), result(t, rep, Edgelimit)
		if r.WorstOvershoot > central.WorstOvershoot {
			t.Errorf("seed %d: worst %d over the limit, central %d", seed, r.WorstOvershoot, central.WorstOvershoot)
		}
	}
}

// While a region is cut off from a key's home, its checks follow the
// partition policy, and the report counts them.
func TestStrongCutOffFromHome(t *testing.T) {
	sc := load(t, "partition.yaml")
	sc.Duration = 14 * time.Second // the cut starts at 10 s
	sc.Limit.Consistency = "strong"
	rep, err := Run(sc)
	if err != nil {
		t.Fatal(err)
	}
	r := result(t, rep, Edgelimit)
	if r.HomeUnreachable == 0 {
		t.Errorf("no check found its home unreachable across a 4 s cut")
	}
	if central := result(t, rep, Centralized); r.HomeUnreachable > r.Decisions/2 {
		t.Errorf("%d of %d checks without a home; the cut lasts 4 s of 14, for one region of two (central %d decisions)",
			r.HomeUnreachable, r.Decisions, central.Decisions)
	}
}
