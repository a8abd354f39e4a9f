package simulate

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// Report is what a run found, strategy by strategy.
type Report struct {
	Scenario         string
	Seed             uint64
	Duration         time.Duration
	Limit            int64
	Unit, Algorithm  string
	PoPs, Regions    int
	OfferedPerSecond float64
	FlushInterval    time.Duration
	// Direct is Scenario.Direct: edgelimit's PoPs have a direct path to the
	// other regions.
	Direct bool
	// Sources is the number of traffic sources and Keys the number of
	// distinct limit keys they use.
	Sources, Keys int
	// Tracked names the key whose admissions Result.Series samples: the key
	// with the most offered traffic.
	Tracked string
	// SeriesStep is the time each entry of Result.Series covers.
	SeriesStep time.Duration
	// EventualBound is the worst overshoot, in percent of the limit, the
	// eventual mode is held to in this scenario outside cuts: the hits a
	// deciding PoP cannot have heard of, Σ rate × (flush + delay) over the
	// other PoPs a key's traffic reaches (eventualBound).
	EventualBound float64
	// Partitions are the scenario's cuts (Scenario.Partitions), which the
	// HTML report marks on its charts over time.
	Partitions []Partition
	Results    []Result // in Strategies order
}

// OvershootBuckets are the upper edges, in percent of the limit, of the
// buckets of Result.Overshoot: bucket 0 holds windows with no excess at all,
// bucket i (1 ≤ i < len) excess in (edge[i-1], edge[i]], and the last bucket
// excess above the last edge.
var OvershootBuckets = []float64{0, 1, 5, 10, 25, 50, 100, 200}

// Quantiles summarises a distribution of durations; N is the sample count
// (the others are 0 when N is 0).
type Quantiles struct {
	N             int64
	P50, P99, Max time.Duration
}

// Result is one strategy's outcome, graded by the exact oracle.
type Result struct {
	Strategy  string
	Decisions int64
	Admitted  int64
	// WorstOvershoot is the maximum, over the run, of the hits admitted in
	// the last window minus the limit (0 when never above).
	WorstOvershoot int64
	// MeanWindowExcess is the mean, over the run's fixed windows, of
	// max(0, admitted in the window − limit).
	MeanWindowExcess float64
	// FalseAllows are admissions that took the true count past the limit;
	// FalseDenies are denials of hits that fit; LegitDenies are denials of a
	// key whose offered traffic in the last window (the denied request
	// included) was within the limit. See oracle for the definitions.
	FalseAllows, FalseDenies, LegitDenies int64
	// TrueCrossing is when an exact limiter would first have denied the
	// tracked key, and FirstDenial when the strategy first denied it; -1
	// when never.
	TrueCrossing, FirstDenial time.Duration
	// DenialLags is, over every key that both crossed its limit and was
	// denied, first denial − true crossing (negative: denied early).
	DenialLags Quantiles
	// MitigationDelay is, per mitigation bit and PoP it reached, the time
	// from the hit that issued it to its arrival there (edgelimit only).
	MitigationDelay Quantiles
	// Convergence is, per partition that healed during the run, the time
	// from the heal until every PoP held every other PoP's counts as they
	// were at the heal; Unconverged counts heals that never got there.
	Convergence Quantiles
	Unconverged int
	// ReducedDecisions counts decisions a PoP made while it enforced only
	// its share of the limit because it heard no beacons from some region.
	ReducedDecisions int64
	// Rejected counts what the PoPs' receiver checks (replication/core
	// check.go, with each PoP's rules as bounds) refused or clamped: honest
	// traffic, which is all the simulator sends, must leave it 0.
	Rejected int64
	// Messages and Bytes are what replication put on the wire, counting each
	// copy delivered (or lost) to each PoP.
	Messages, Bytes int64
	// AddedLatency is the mean time a decision waited on the network, and
	// AddedLatencyP99 its 99th percentile (to 0.1 ms).
	AddedLatency, AddedLatencyP99 time.Duration
	// HomeUnreachable counts the checks of a strong limit whose home gave no
	// reply in time, decided by the limit's partition policy.
	HomeUnreachable int64

	// Series samples the tracked key: Series[i] is the largest number of
	// its hits admitted in any one window (t − window, t] over the instants
	// t of [i·SeriesStep, (i+1)·SeriesStep) at which it saw a decision (0
	// when none). Charted against the limit, it is the admitted rate.
	Series []int64
	// Overshoot is the distribution, over every (key, fixed window) pair
	// that admitted at least one hit, of max(0, admitted − limit) in
	// percent of the limit, bucketed by OvershootBuckets (len+1 counts).
	Overshoot []int64
}

// pct returns n as a percentage of of, 0 when of is 0.
func pct(n, of float64) float64 {
	if of == 0 {
		return 0
	}
	return 100 * n / of
}

// WorstOvershootPct is WorstOvershoot as a percentage of limit.
func (r Result) WorstOvershootPct(limit int64) float64 {
	return pct(float64(r.WorstOvershoot), float64(limit))
}

// DenialLag is FirstDenial − TrueCrossing (negative: denied before an
// exact limiter would have); ok is false when either never happened.
func (r Result) DenialLag() (lag time.Duration, ok bool) {
	if r.TrueCrossing < 0 || r.FirstDenial < 0 {
		return 0, false
	}
	return r.FirstDenial - r.TrueCrossing, true
}

// WrongDecisions is the share of decisions, in percent, that an exact
// sliding log calls wrong either way: false allows plus false denies.
func (r Result) WrongDecisions() float64 {
	return pct(float64(r.FalseAllows+r.FalseDenies), float64(r.Decisions))
}

// WriteTable writes the report as two fixed-width tables: accuracy, then
// propagation and cost. The output depends only on the report, so the same
// scenario and seed write the same bytes.
func (rep Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "scenario %s  seed %d  duration %v  limit %d/%s %s  pops %d in %d regions  offered %.0f/s  flush %v\n",
		rep.Scenario, rep.Seed, rep.Duration, rep.Limit, rep.Unit, rep.Algorithm,
		rep.PoPs, rep.Regions, rep.OfferedPerSecond, rep.FlushInterval)
	if rep.Direct {
		b.WriteString("edgelimit's PoPs take other regions' bits and keys near their limit on a direct path too (edgelimit pop --nats-direct)\n")
	}
	fmt.Fprintf(&b, "sources %d  keys %d  tracked key %q\n", rep.Sources, rep.Keys, rep.Tracked)
	fmt.Fprintf(&b, "eventual's bound outside cuts: worst%% ≤ %.2f (what a deciding PoP cannot have heard: Σ rate × (flush + delay) of the others)\n\n",
		rep.EventualBound)
	fmt.Fprintf(&b, "%-12s %10s %10s %8s %8s %9s %9s %9s %9s %9s %11s\n",
		"strategy", "decisions", "admitted", "worst", "worst%", "mean%/win", "wrong%", "f-allow%", "f-deny%", "legit%", "deny-lag")
	for _, r := range rep.Results {
		lag := "never"
		if d, ok := r.DenialLag(); ok {
			lag = fmtDuration(d)
		}
		fmt.Fprintf(&b, "%-12s %10d %10d %8d %8.2f %9.2f %9.4f %9.4f %9.4f %9.4f %11s\n",
			r.Strategy, r.Decisions, r.Admitted, r.WorstOvershoot, r.WorstOvershootPct(rep.Limit),
			pct(r.MeanWindowExcess, float64(rep.Limit)), r.WrongDecisions(),
			pct(float64(r.FalseAllows), float64(r.Decisions)), pct(float64(r.FalseDenies), float64(r.Decisions)),
			pct(float64(r.LegitDenies), float64(r.Decisions)), lag)
	}
	fmt.Fprintf(&b, "\n%-12s %11s %11s %11s %11s %11s %9s %10s %12s %9s %10s %9s\n",
		"strategy", "lag-p50", "lag-max", "bit-p50", "bit-p99", "converge", "reduced%", "msgs", "bytes", "+latency", "+lat-p99", "no-home%")
	for _, r := range rep.Results {
		conv := "-"
		if r.Convergence.N > 0 {
			conv = fmtDuration(r.Convergence.Max)
		}
		if r.Unconverged > 0 {
			conv = "never"
		}
		fmt.Fprintf(&b, "%-12s %11s %11s %11s %11s %11s %9.2f %10d %12d %9s %10s %9.2f\n",
			r.Strategy, fmtQuantile(r.DenialLags, r.DenialLags.P50), fmtQuantile(r.DenialLags, r.DenialLags.Max),
			fmtQuantile(r.MitigationDelay, r.MitigationDelay.P50), fmtQuantile(r.MitigationDelay, r.MitigationDelay.P99),
			conv, pct(float64(r.ReducedDecisions), float64(r.Decisions)), r.Messages, r.Bytes, fmtDuration(r.AddedLatency),
			fmtDuration(r.AddedLatencyP99), pct(float64(r.HomeUnreachable), float64(r.Decisions)))
	}
	b.WriteString(`
worst: max over keys and time of (admitted in the last window − limit); mean%/win: mean excess over the
(key, fixed window) pairs that admitted anything. Graded per decision against an exact sliding log of what
was admitted: f-allow% admitted past the limit, f-deny% denied though it fit, wrong% both; legit% denied
a key whose offered traffic in the window was within the limit. deny-lag: first denial − first true crossing
of the tracked key; lag-p50/max: the same over all keys that crossed. bit-p50/p99: mitigation bit issue →
arrival at another PoP. converge: heal → every PoP holds the others' pre-heal counts. reduced%: decisions
made at a reduced partition share. +latency, +lat-p99: mean and 99th percentile of the time a decision
waited on the network (a strong limit's round trip to the key's home, or the central store's). no-home%:
decisions of a strong limit whose home did not answer in time, made by the limit's partition policy.
`)
	_, err := io.WriteString(w, b.String())
	return err
}

// fmtQuantile renders one quantile of q, or "-" when q has no samples.
func fmtQuantile(q Quantiles, d time.Duration) string {
	if q.N == 0 {
		return "-"
	}
	return fmtDuration(d)
}

// fmtDuration renders d in milliseconds with microsecond precision.
func fmtDuration(d time.Duration) string {
	return fmt.Sprintf("%.3fms", float64(d)/float64(time.Millisecond))
}
