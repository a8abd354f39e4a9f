package simulate

import (
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"
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
	for i, cols := range reportTables {
		if i > 0 {
			b.WriteString("\n")
		}
		head := make([]string, len(cols))
		for j, c := range cols {
			head[j] = c.Name
		}
		writeRow(&b, cols, head)
		for _, r := range rep.Results {
			writeRow(&b, cols, rep.cells(cols, r))
		}
	}
	b.WriteString("\n")
	b.WriteString(legendText())
	_, err := io.WriteString(w, b.String())
	return err
}

// column is one column of the report's tables: its heading, its width in the
// text table (negative: left-aligned), the help the legend gives for it, and
// its value for one strategy. The text table and the HTML page both take
// their columns, values and help from here.
type column struct {
	Name  string
	Width int
	Help  string
	Cell  func(rep Report, r Result) string
}

// reportTables are the report's two tables: accuracy, then propagation and
// cost. Consecutive columns with the same help share one legend entry.
var reportTables = [][]column{
	{
		{"strategy", -12, "how the PoPs decide, edgelimit first", func(_ Report, r Result) string { return r.Strategy }},
		{"decisions", 10, "requests decided, over all keys", func(_ Report, r Result) string { return fmt.Sprintf("%d", r.Decisions) }},
		{"admitted", 10, "requests admitted", func(_ Report, r Result) string { return fmt.Sprintf("%d", r.Admitted) }},
		{"worst", 8, "max over keys and time of (admitted in the last window − limit)", func(_ Report, r Result) string { return fmt.Sprintf("%d", r.WorstOvershoot) }},
		{"worst%", 8, "worst in percent of the limit", func(rep Report, r Result) string { return fmt.Sprintf("%.2f", r.WorstOvershootPct(rep.Limit)) }},
		{"mean%/win", 9, "mean excess, in percent of the limit, over the (key, fixed window) pairs that admitted anything", func(rep Report, r Result) string {
			return fmt.Sprintf("%.2f", pct(r.MeanWindowExcess, float64(rep.Limit)))
		}},
		{"wrong%", 9, "decisions an exact sliding log of what was admitted grades wrong: f-allow% + f-deny%", func(_ Report, r Result) string { return fmt.Sprintf("%.4f", r.WrongDecisions()) }},
		{"f-allow%", 9, "decisions that admitted past the limit", func(_ Report, r Result) string {
			return fmt.Sprintf("%.4f", pct(float64(r.FalseAllows), float64(r.Decisions)))
		}},
		{"f-deny%", 9, "decisions that denied though the hit fit", func(_ Report, r Result) string {
			return fmt.Sprintf("%.4f", pct(float64(r.FalseDenies), float64(r.Decisions)))
		}},
		{"legit%", 9, "decisions that denied a key whose offered traffic in the window was within the limit", func(_ Report, r Result) string {
			return fmt.Sprintf("%.4f", pct(float64(r.LegitDenies), float64(r.Decisions)))
		}},
		{"deny-lag", 11, "first denial − first true crossing of the tracked key", func(_ Report, r Result) string {
			if d, ok := r.DenialLag(); ok {
				return fmtDuration(d)
			}
			return "never"
		}},
	},
	{
		{"strategy", -12, "how the PoPs decide, edgelimit first", func(_ Report, r Result) string { return r.Strategy }},
		{"lag-p50", 11, "deny-lag's median and max over all keys that crossed", func(_ Report, r Result) string { return fmtQuantile(r.DenialLags, r.DenialLags.P50) }},
		{"lag-max", 11, "deny-lag's median and max over all keys that crossed", func(_ Report, r Result) string { return fmtQuantile(r.DenialLags, r.DenialLags.Max) }},
		{"bit-p50", 11, "mitigation bit issue → arrival at another PoP, median and 99th percentile", func(_ Report, r Result) string {
			return fmtQuantile(r.MitigationDelay, r.MitigationDelay.P50)
		}},
		{"bit-p99", 11, "mitigation bit issue → arrival at another PoP, median and 99th percentile", func(_ Report, r Result) string {
			return fmtQuantile(r.MitigationDelay, r.MitigationDelay.P99)
		}},
		{"converge", 11, "heal → every PoP holds the others' pre-heal counts (worst heal)", func(_ Report, r Result) string {
			switch {
			case r.Unconverged > 0:
				return "never"
			case r.Convergence.N > 0:
				return fmtDuration(r.Convergence.Max)
			}
			return "-"
		}},
		{"reduced%", 9, "decisions made at a reduced partition share", func(_ Report, r Result) string {
			return fmt.Sprintf("%.2f", pct(float64(r.ReducedDecisions), float64(r.Decisions)))
		}},
		{"msgs", 10, "messages and bytes replication put on the wire, each copy counted", func(_ Report, r Result) string { return fmt.Sprintf("%d", r.Messages) }},
		{"bytes", 12, "messages and bytes replication put on the wire, each copy counted", func(_ Report, r Result) string { return fmt.Sprintf("%d", r.Bytes) }},
		{"+latency", 9, "mean and 99th percentile of the time a decision waited on the network (a strong limit's round trip to the key's home, the central store's, or a bounded limit's wait for allowance on its way)", func(_ Report, r Result) string {
			return fmtDuration(r.AddedLatency)
		}},
		{"+lat-p99", 10, "mean and 99th percentile of the time a decision waited on the network (a strong limit's round trip to the key's home, the central store's, or a bounded limit's wait for allowance on its way)", func(_ Report, r Result) string {
			return fmtDuration(r.AddedLatencyP99)
		}},
		{"no-home%", 9, "decisions of a strong limit whose home did not answer in time, made by the limit's partition policy", func(_ Report, r Result) string {
			return fmt.Sprintf("%.2f", pct(float64(r.HomeUnreachable), float64(r.Decisions)))
		}},
	},
}

// cells are r's values in cols, as both the text table and the HTML page
// show them.
func (rep Report) cells(cols []column, r Result) []string {
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = c.Cell(rep, r)
	}
	return out
}

// writeRow writes one line of a text table, each cell padded to its
// column's width.
func writeRow(b *strings.Builder, cols []column, cells []string) {
	for i, c := range cols {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(b, "%*s", c.Width, cells[i])
	}
	b.WriteByte('\n')
}

// legendEntry is one entry of the legend: the columns it explains and what
// it says about them.
type legendEntry struct {
	Names []string
	Help  string
}

// reportLegend lists every column's help once, the strategy column aside
// and consecutive columns with the same help together.
func reportLegend() []legendEntry {
	var out []legendEntry
	seen := map[string]bool{}
	for _, cols := range reportTables {
		for i, c := range cols {
			if seen[c.Name] {
				continue
			}
			seen[c.Name] = true
			if i > 0 && c.Help == cols[i-1].Help && len(out) > 0 {
				out[len(out)-1].Names = append(out[len(out)-1].Names, c.Name)
				continue
			}
			out = append(out, legendEntry{Names: []string{c.Name}, Help: c.Help})
		}
	}
	return out
}

// legendText is the legend as the text table prints it, wrapped at about
// 106 columns.
func legendText() string {
	var b strings.Builder
	line := 0
	legend := reportLegend()
	for i, e := range legend {
		s := strings.Join(e.Names, ", ") + ": " + e.Help
		if i < len(legend)-1 {
			s += ";"
		} else {
			s += "."
		}
		for _, w := range strings.Fields(s) {
			n := utf8.RuneCountInString(w)
			if line > 0 && line+1+n > 106 {
				b.WriteByte('\n')
				line = 0
			}
			if line > 0 {
				b.WriteByte(' ')
				line++
			}
			b.WriteString(w)
			line += n
		}
	}
	b.WriteByte('\n')
	return b.String()
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
