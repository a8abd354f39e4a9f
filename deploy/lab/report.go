package lab

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/simulate"
)

// Report is what a lab run measured.
type Report struct {
	Scenario       string
	Seed           uint64
	Limit          int64
	Window         time.Duration // the limit's unit
	Duration       time.Duration
	PoPs, Regions  int
	Servers        int       // PoP servers: more than PoPs when the servers of a Redis PoP share its Redis
	Layout         string    // the plan's Layout
	Direct         bool      // the PoPs had direct paths (--nats-direct), the simulator too
	Start          time.Time // t = 0 of the scenario
	Windows        []Window
	Offered        int64
	Admitted       int64
	LoadErrors     int64
	MeanExcessPct  float64 // mean over windows that admitted anything of max(0, admitted − limit), % of the limit
	WorstExcessPct float64 // the most over the limit in one fixed window, % of the limit
	// MeanShortPct and WorstShortPct are the same of Window.Short: the
	// scenario traffic's under-admission, at the resolution its loads report.
	MeanShortPct, WorstShortPct float64
	BitP50, BitP99              time.Duration
	BitsReceived                int64
	// HotBatches and DirectBatches are, over every PoP, the batches of hot
	// slots published for other regions' direct paths and the other
	// regions' batches taken straight off their subjects (on the direct
	// path, and while a stream source was stalled) — the direct path at
	// work, or (without it) only the stall path.
	HotBatches, DirectBatches int64
	Partitions                []PartitionResult
	Shapes                    []ShapeResult
	Faults                    []FaultResult
	Alert                     *AlertResult  // nil: no alert phase
	Dashboard                 []QueryResult // the Grafana dashboard's queries on the lab's Prometheus
	Wall                      time.Duration // the whole run, setup and teardown included
}

// Window is one fixed window of the limit (Unix-epoch aligned), from Start
// after the scenario's t = 0: the checks the loads sent and those admitted,
// over every PoP.
type Window struct {
	Start             time.Duration
	Offered, Admitted int64
}

// Short is what w admitted short of what an exact limiter would have:
// min(offered, limit) − admitted, at least 0. The loads report counts per
// second, not each decision, so this is the window's under-admission as
// an exact sliding log under steady traffic sees it (it admits the whole
// limit in every window the offered traffic fills); the shapes' ledger
// grades each decision.
func (w Window) Short(limit int64) int64 { return max(min(w.Offered, limit)-w.Admitted, 0) }

// PartitionResult is one of the scenario's partitions as the PoPs saw it:
// Reduced is how long after the cut every PoP enforced a reduced global
// share, Restored how long after the heal every PoP was back at the whole
// limit (-1: never, within the run).
type PartitionResult struct {
	Region            string // the region whose link was taken down
	Cut, Heal         time.Duration
	Reduced, Restored time.Duration
}

// FaultResult is one fault the lab injected after the scenario and what
// followed.
type FaultResult struct {
	What   string
	OK     bool
	Took   time.Duration
	Detail string
}

// summarize fills the totals and the excess figures from Windows, graded
// as the simulator's oracle grades fixed windows.
func (r *Report) summarize() {
	var excess, short float64
	var n, offered int
	for _, w := range r.Windows {
		r.Offered += w.Offered
		r.Admitted += w.Admitted
		if w.Offered > 0 {
			offered++
			s := pct(w.Short(r.Limit), r.Limit)
			short += s
			r.WorstShortPct = max(r.WorstShortPct, s)
		}
		if w.Admitted == 0 {
			continue
		}
		n++
		e := 100 * float64(max(w.Admitted-r.Limit, 0)) / float64(r.Limit)
		excess += e
		r.WorstExcessPct = max(r.WorstExcessPct, e)
	}
	if n > 0 {
		r.MeanExcessPct = excess / float64(n)
	}
	if offered > 0 {
		r.MeanShortPct = short / float64(offered)
	}
}

// fmtDur prints d, or "never" for a negative one.
func fmtDur(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return d.Round(time.Millisecond).String()
}

// WriteTable writes the report: every window, then the measured figures
// beside sim's edgelimit row for the same scenario (nil sim: none).
func (r Report) WriteTable(w io.Writer, sim *simulate.Report) error {
	var b strings.Builder
	direct := ""
	if r.Direct {
		direct = "  direct paths"
	}
	fmt.Fprintf(&b, "lab %s  seed %d  %d PoPs (%d servers; %s) in %d regions%s  limit %d per %v (global)  traffic %v from %s\n\n",
		r.Scenario, r.Seed, r.PoPs, r.Servers, r.Layout, r.Regions, direct, r.Limit, r.Window, r.Duration, r.Start.UTC().Format(time.RFC3339))
	fmt.Fprintf(&b, "%8s %9s %9s %8s %8s\n", "window", "offered", "admitted", "excess%", "short%")
	for _, win := range r.Windows {
		mark := ""
		for _, p := range r.Partitions {
			if win.Start+r.Window > p.Cut && win.Start < p.Heal {
				mark = "  (" + p.Region + " cut)"
			}
		}
		fmt.Fprintf(&b, "%8v %9d %9d %8.2f %8.2f%s\n", win.Start, win.Offered, win.Admitted,
			100*float64(max(win.Admitted-r.Limit, 0))/float64(r.Limit), pct(win.Short(r.Limit), r.Limit), mark)
	}
	fmt.Fprintf(&b, "\n%-34s %14s %14s\n", "", "simulated", "measured")
	var res *simulate.Result
	if sim != nil {
		for i := range sim.Results {
			if sim.Results[i].Strategy == simulate.Edgelimit.String() {
				res = &sim.Results[i]
			}
		}
	}
	row := func(name, simv, labv string) { fmt.Fprintf(&b, "%-34s %14s %14s\n", name, simv, labv) }
	s := func(f func(*simulate.Result) string) string {
		if res == nil {
			return "-"
		}
		return f(res)
	}
	row("admitted / decisions", s(func(x *simulate.Result) string { return fmt.Sprintf("%d/%d", x.Admitted, x.Decisions) }),
		fmt.Sprintf("%d/%d", r.Admitted, r.Offered))
	row("mean excess per window, % limit", s(func(x *simulate.Result) string { return fmt.Sprintf("%.2f", 100*x.MeanWindowExcess/float64(sim.Limit)) }),
		fmt.Sprintf("%.2f", r.MeanExcessPct))
	row("mean / worst short per window, %", "-", fmt.Sprintf("%.2f/%.2f", r.MeanShortPct, r.WorstShortPct))
	row("worst excess, % limit", s(func(x *simulate.Result) string { return fmt.Sprintf("%.2f (sliding)", x.WorstOvershootPct(sim.Limit)) }),
		fmt.Sprintf("%.2f (fixed)", r.WorstExcessPct))
	row("bit propagation p50 / p99", s(func(x *simulate.Result) string {
		return fmt.Sprintf("%s/%s", fmtDur(x.MitigationDelay.P50), fmtDur(x.MitigationDelay.P99))
	}), fmt.Sprintf("%s/%s", fmtDur(r.BitP50), fmtDur(r.BitP99)))
	row("bits received (all PoPs)", s(func(x *simulate.Result) string { return fmt.Sprint(x.MitigationDelay.N) }), fmt.Sprint(r.BitsReceived))
	row("hot / direct batches (all PoPs)", "-", fmt.Sprintf("%d/%d", r.HotBatches, r.DirectBatches))
	for _, p := range r.Partitions {
		row(fmt.Sprintf("cut %s %v–%v: share reduced after", p.Region, p.Cut, p.Heal), "-", fmtDur(p.Reduced))
		row("  convergence after the heal", s(func(x *simulate.Result) string {
			return fmt.Sprintf("%s (counts)", fmtDur(x.Convergence.Max))
		}), fmtDur(p.Restored)+" (share)")
	}
	if len(r.Shapes) > 0 {
		writeShapes(&b, r.Shapes, r.Servers)
	}
	if r.LoadErrors > 0 {
		fmt.Fprintf(&b, "\nload errors: %d (requests that got no answer)\n", r.LoadErrors)
	}
	if len(r.Faults) > 0 {
		b.WriteString("\nfaults\n")
		for _, f := range r.Faults {
			ok := "ok"
			if !f.OK {
				ok = "FAILED"
			}
			fmt.Fprintf(&b, "  %-6s %-44s %10s  %s\n", ok, f.What, fmtDur(f.Took), f.Detail)
		}
	}
	if a := r.Alert; a != nil {
		fmt.Fprintf(&b, "\nalert %s, %s cut: fired after %s, resolved %s after the heal  %s\n",
			PartitionAlert, a.Region, fmtDur(a.Fired), fmtDur(a.Resolved), a.Detail)
	}
	if len(r.Dashboard) > 0 {
		b.WriteString("\ndashboard queries on the lab's Prometheus (series returned)\n")
		for _, q := range r.Dashboard {
			fmt.Fprintf(&b, "  %3d  %-50s %s %s\n", q.Series, q.Panel, q.Expr, q.Err)
		}
	}
	fmt.Fprintf(&b, "\nwall time %v\n", r.Wall.Round(time.Second))
	_, err := io.WriteString(w, b.String())
	return err
}

// writeShapes writes every shape's figures beside the simulator's for the
// same shape on the same network, then the shapes' ledger.
func writeShapes(b *strings.Builder, shapes []ShapeResult, servers int) {
	fmt.Fprintf(b, "\ntraffic shapes: global limit %d per hour, one key per shape, over %d PoP servers; graded against the exact sliding log\n", ShapeLimit, servers)
	fmt.Fprintf(b, "%-10s %-11s %8s %9s %8s %8s %6s %7s %6s\n", "shape", "consistency", "span", "admitted", "excess%", "short%", "over", "beyond", "under")
	var rows []LedgerRow
	for _, s := range shapes {
		sum := LedgerRow{Of: ShapeLimit}
		for _, r := range s.Rows {
			sum.Offered += r.Offered
			sum.Admitted += r.Admitted
			sum.Over += r.Over
			sum.OverBound += r.OverBound
			sum.Under += r.Under
		}
		rows = append(rows, s.Rows...)
		errs := ""
		if s.Errors > 0 {
			errs = fmt.Sprintf("  (%d checks unanswered)", s.Errors)
		}
		fmt.Fprintf(b, "%-10s %-11s %8v %9s %8.1f %8.1f %6d %7d %6d%s\n", s.Shape, s.Consistency, s.Span.Round(time.Millisecond),
			fmt.Sprintf("%d/%d", s.Admitted, s.Checks), pct(sum.Excess(), ShapeLimit), pct(sum.Short(), ShapeLimit), sum.Over, sum.OverBound, sum.Under, errs)
		if x := s.Sim; x != nil {
			sim := LedgerRow{Of: ShapeLimit, Offered: x.Decisions, Admitted: x.Admitted}
			fmt.Fprintf(b, "%-10s %-11s %8s %9s %8.1f %8.1f %6d %7s %6d\n", "  sim", "", "", fmt.Sprintf("%d/%d", x.Admitted, x.Decisions),
				pct(sim.Excess(), ShapeLimit), pct(sim.Short(), ShapeLimit), x.FalseAllows, "-", x.FalseDenies)
		}
	}
	b.WriteString("(sim: edgelimit sim of the same shape on the scenario's network, one server per PoP on the embedded store; its over and\n")
	b.WriteString(" under are its oracle's false allows and false denies, in its one order of decisions)\n\n")
	writeLedger(b, rows)
}
