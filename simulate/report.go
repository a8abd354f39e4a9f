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
	Results          []Result // in Strategies order
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
	// FalseDenies are denials of hits that fit.
	FalseAllows, FalseDenies int64
	// TrueCrossing is when an exact limiter would first have denied, and
	// FirstDenial when the strategy first denied; -1 when never.
	TrueCrossing, FirstDenial time.Duration
	// Messages and Bytes are what replication put on the wire, counting each
	// copy delivered (or lost) to each PoP.
	Messages, Bytes int64
	// AddedLatency is the mean time a decision waited on the network.
	AddedLatency time.Duration
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

// WriteTable writes the report as a fixed-width table. The output depends
// only on the report, so the same scenario and seed write the same bytes.
func (rep Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "scenario %s  seed %d  duration %v  limit %d/%s %s  pops %d in %d regions  offered %.0f/s  flush %v\n",
		rep.Scenario, rep.Seed, rep.Duration, rep.Limit, rep.Unit, rep.Algorithm,
		rep.PoPs, rep.Regions, rep.OfferedPerSecond, rep.FlushInterval)
	fmt.Fprintf(&b, "%-12s %10s %10s %9s %8s %10s %9s %9s %11s %9s %11s %9s\n",
		"strategy", "decisions", "admitted", "worst", "worst%", "mean%/win", "f-allow%", "f-deny%", "deny-lag", "msgs", "bytes", "+latency")
	for _, r := range rep.Results {
		lag := "never"
		if d, ok := r.DenialLag(); ok {
			lag = fmtDuration(d)
		}
		fmt.Fprintf(&b, "%-12s %10d %10d %9d %8.2f %10.2f %9.3f %9.3f %11s %9d %11d %9s\n",
			r.Strategy, r.Decisions, r.Admitted, r.WorstOvershoot, r.WorstOvershootPct(rep.Limit),
			pct(r.MeanWindowExcess, float64(rep.Limit)),
			pct(float64(r.FalseAllows), float64(r.Decisions)), pct(float64(r.FalseDenies), float64(r.Decisions)),
			lag, r.Messages, r.Bytes, fmtDuration(r.AddedLatency))
	}
	b.WriteString("worst: max over time of (admitted in the last window − limit); mean%/win: mean over fixed windows of the excess;\n" +
		"f-allow%/f-deny%: share of decisions an exact sliding log calls wrong; deny-lag: first denial − first true crossing.\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// fmtDuration renders d in milliseconds with microsecond precision.
func fmtDuration(d time.Duration) string {
	return fmt.Sprintf("%.3fms", float64(d)/float64(time.Millisecond))
}
