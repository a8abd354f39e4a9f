package simulate

import (
	"bytes"
	"cmp"
	"fmt"
	"html/template"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Chart geometry, in SVG user units. Both charts share it.
const (
	chartW     = 760
	plotLeft   = 64  // room for the y tick labels
	plotRight  = 76  // room for the limit's label
	plotTop    = 28  // room for the y axis title
	plotH      = 260 // height of the plotting area
	plotBottom = plotTop + plotH
	plotW      = chartW - plotLeft - plotRight
	legendTop  = plotBottom + 52 // first legend row
	legendRow  = 18
)

// strategyColors are the Okabe–Ito colours, which stay apart for the common
// forms of colour blindness; strategy i gets colour i (mod len).
var strategyColors = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"}

// WriteHTML writes the report as one self-contained HTML page: the header of
// WriteTable, its two tables as HTML tables (the same cells, each column's
// legend help under them, edgelimit's row marked) and two inline SVG charts,
// the tracked key's admitted rate against the limit over time and the
// distribution of overshoot per window.
// It uses no script and loads nothing, and like WriteTable its output
// depends only on the report.
func (rep Report) WriteHTML(w io.Writer) error {
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		return err
	}
	head, _, _ := strings.Cut(table.String(), "\n\n")
	page := htmlPage{
		Scenario: rep.Scenario,
		Facts:    rep.htmlFacts(),
		Head:     head,
		Tables:   rep.htmlResultTables(),
		Rate:     rep.htmlRateCharts(),
		Over:     rep.htmlOvershootChart(),
		Tracked:  rep.Tracked,
		Unit:     rep.Unit,
		Step:     rep.htmlStep(),
		Counts:   rep.htmlOvershootTable(),
		Cuts:     rep.htmlCuts(),
	}
	var b bytes.Buffer
	if err := htmlPageTemplate.Execute(&b, page); err != nil {
		return err
	}
	_, err := w.Write(b.Bytes())
	return err
}

// htmlPage is what the template renders; every number in it is already
// formatted, so the template only places and escapes text.
type htmlPage struct {
	Scenario string
	Facts    []string
	// Head is the text report's header lines, the run's setup.
	Head string
	// Tables are the text report's tables, cell for cell.
	Tables     []resultTable
	Rate       []svgChart
	Over       svgChart
	Tracked    string
	Unit, Step string
	Counts     overshootTable
	// Cuts says in words what the shaded bands of the rate chart are: the
	// scenario's partitions, one phrase per pair of regions.
	Cuts []string
}

// svgChart is one inline SVG: lists of shapes, each drawn as is.
type svgChart struct {
	Title         string // for screen readers
	Width, Height string
	// Bands are drawn first, under everything: the scenario's cuts.
	Bands []svgRect
	Lines []svgLine
	Texts []svgText
	Polys []svgPoly
	Dots  []svgDot
	Rects []svgRect
	// Above are drawn over the data: the limit line and its label.
	Above      []svgLine
	AboveTexts []svgText
	Legend     []svgLegend
}

type svgLine struct{ Class, X1, Y1, X2, Y2 string }

type svgText struct{ Class, X, Y, Anchor, Text string }

type svgPoly struct{ Strategy, Points, Color string }

type svgDot struct{ Strategy, X, Y, Color string }

type svgRect struct{ X, Y, W, H, Color, Tip string }

type svgLegend struct{ X, Y, TX, TY, Color, Name string }

type overshootTable struct {
	Buckets []string
	Rows    []overshootRow
}

type overshootRow struct {
	Strategy string
	Cells    []string
}

// resultTable is one of the text report's tables (reportTables) as HTML:
// the same columns and cells, each column's legend help beside its heading.
type resultTable struct {
	Cols []column
	Rows []resultRow
}

type resultRow struct {
	Strategy string
	// Ours marks edgelimit's row.
	Ours  bool
	Cells []string
}

// htmlResultTables are reportTables with every strategy's cells as WriteTable
// prints them.
func (rep Report) htmlResultTables() []resultTable {
	var out []resultTable
	for _, cols := range reportTables {
		t := resultTable{Cols: cols}
		for _, r := range rep.Results {
			t.Rows = append(t.Rows, resultRow{Strategy: r.Strategy, Ours: r.Strategy == Edgelimit.String(), Cells: rep.cells(cols, r)})
		}
		out = append(out, t)
	}
	return out
}

// htmlFacts are the report's headline figures, one short phrase each.
func (rep Report) htmlFacts() []string {
	f := []string{
		"seed " + strconv.FormatUint(rep.Seed, 10),
		fmt.Sprintf("limit %d per %s (%s)", rep.Limit, rep.Unit, rep.Algorithm),
		fmt.Sprintf("%d PoPs in %d regions", rep.PoPs, rep.Regions),
		fmt.Sprintf("offered %s/s", htmlNum(rep.OfferedPerSecond, 0)),
		"flush every " + rep.FlushInterval.String(),
		rep.Duration.String() + " simulated",
	}
	if rep.Sources > 0 || rep.Keys > 0 {
		f = append(f, plural(rep.Sources, "source")+" on "+plural(rep.Keys, "key"))
	}
	return f
}

// plural is n and noun, with an s unless n is 1: "1 source", "3 keys".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// htmlNum formats v with prec decimals. The scales never divide by zero, so
// v is finite; TestHTMLEmpty checks that no NaN or Inf reaches the page.
func htmlNum(v float64, prec int) string {
	s := strconv.FormatFloat(v, 'f', prec, 64)
	if strings.Trim(s, "-0.") == "" { // no "-0.0"
		s = strings.TrimPrefix(s, "-")
	}
	return s
}

// svgCoord formats an SVG coordinate.
func svgCoord(v float64) string { return htmlNum(v, 1) }

// htmlStep is SeriesStep for the prose, "" when unknown.
func (rep Report) htmlStep() string {
	if rep.SeriesStep <= 0 {
		return ""
	}
	return rep.SeriesStep.String()
}

// niceTickStep returns the step of about n ticks over [0, max]: 1, 2 or 5 times
// a power of ten. max must be above 0.
func niceTickStep(max float64, n int) float64 {
	raw := max / float64(n)
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	switch f := raw / p; {
	case f <= 1:
		return p
	case f <= 2:
		return 2 * p
	case f <= 5:
		return 5 * p
	}
	return 10 * p
}

// tickDecimals is how many decimals label multiples of step exactly.
func tickDecimals(step float64) int {
	d := 0
	for s := step; s < 1-1e-9 && d < 6; s *= 10 {
		d++
	}
	return d
}

// svgAxis is a linear scale from [0, Top] onto pixels.
type svgAxis struct {
	Top, Step float64
	Decimals  int
}

// newSVGAxis covers [0, max] with about n ticks; a max of 0 or less gets [0, 1].
// minStep, when above 0, is the smallest step allowed (whole requests).
func newSVGAxis(max float64, n int, minStep float64) svgAxis {
	if !(max > 0) || math.IsInf(max, 0) {
		max = 1
	}
	step := niceTickStep(max, n)
	if step < minStep {
		step = minStep
	}
	top := math.Ceil(max/step-1e-9) * step
	return svgAxis{Top: top, Step: step, Decimals: tickDecimals(step)}
}

// ticks returns the values 0, Step, 2·Step, … up to Top.
func (a svgAxis) ticks() []float64 {
	var t []float64
	for k := 0; ; k++ {
		v := float64(k) * a.Step
		if v > a.Top*(1+1e-9) || k > 100 {
			return t
		}
		t = append(t, v)
	}
}

// y maps v to a y pixel of the plot (0 at the bottom).
func (a svgAxis) y(v float64) float64 {
	return float64(plotBottom) - float64(plotH*(v/a.Top))
}

// x maps v to an x pixel of the plot (0 at the left).
func (a svgAxis) x(v float64) float64 {
	return float64(plotLeft) + float64(plotW*(v/a.Top))
}

// frame draws a chart's y grid with tick labels, its axes and axis titles.
func (c *svgChart) frame(ya svgAxis, yTitle, xTitle string) {
	for _, v := range ya.ticks() {
		y := svgCoord(ya.y(v))
		c.Lines = append(c.Lines, svgLine{Class: "grid", X1: svgCoord(plotLeft), Y1: y, X2: svgCoord(plotLeft + plotW), Y2: y})
		c.Texts = append(c.Texts, svgText{Class: "tick", X: svgCoord(plotLeft - 6), Y: svgCoord(ya.y(v) + 4), Anchor: "end", Text: htmlNum(v, ya.Decimals)})
	}
	c.Lines = append(c.Lines,
		svgLine{Class: "axis", X1: svgCoord(plotLeft), Y1: svgCoord(plotTop), X2: svgCoord(plotLeft), Y2: svgCoord(plotBottom)},
		svgLine{Class: "axis", X1: svgCoord(plotLeft), Y1: svgCoord(plotBottom), X2: svgCoord(plotLeft + plotW), Y2: svgCoord(plotBottom)})
	c.Texts = append(c.Texts,
		svgText{Class: "title", X: svgCoord(plotLeft), Y: svgCoord(plotTop - 12), Anchor: "start", Text: yTitle},
		svgText{Class: "title", X: svgCoord(plotLeft + plotW/2), Y: svgCoord(plotBottom + 36), Anchor: "middle", Text: xTitle})
}

// legend lays out one entry per strategy below the plot, left to right,
// wrapping rows, and sets the chart's size. Entries are as wide as their text
// at an estimated 7 units a character.
func (c *svgChart) legend(rep Report, note func(Result) string) {
	x, y := 0, legendTop
	for i, r := range rep.Results {
		name := r.Strategy
		if n := note(r); n != "" {
			name += " " + n
		}
		w := 18 + 7*utf8.RuneCountInString(name) + 20
		if x > 0 && x+w > plotW {
			x, y = 0, y+legendRow
		}
		c.Legend = append(c.Legend, svgLegend{
			X: svgCoord(float64(plotLeft + x)), Y: svgCoord(float64(y - 10)), TX: svgCoord(float64(plotLeft + x + 18)), TY: svgCoord(float64(y)),
			Color: strategyColor(i), Name: name,
		})
		x += w
	}
	c.Width = strconv.Itoa(chartW)
	c.Height = strconv.Itoa(y + legendRow)
}

func strategyColor(i int) string { return strategyColors[i%len(strategyColors)] }

// note centres a message in the plot, for a chart with nothing to draw.
func (c *svgChart) note(msg string) {
	c.Texts = append(c.Texts, svgText{Class: "note", X: svgCoord(plotLeft + plotW/2), Y: svgCoord(plotTop + plotH/2), Anchor: "middle", Text: msg})
}

// farOver is how far over the limit a strategy's peak must go for the rate
// chart to draw it in a panel of its own: on one axis with the limit at a
// third of the height or less, the strategies that hold the limit would lie
// flat on the dashed line, where no one can tell them apart.
const farOver = 3

// seriesPeak is the most r's Series admitted in one window.
func seriesPeak(r Result) int64 {
	var p int64
	for _, v := range r.Series {
		p = max(p, v)
	}
	return p
}

// htmlRateCharts plots each strategy's Series against the limit: one panel
// for the strategies that stay within farOver × the limit, and, when some go
// further (local-only under a sprayer admits a limit per PoP), a second panel
// for those, each panel's axis scaled to its own strategies.
func (rep Report) htmlRateCharts() []svgChart {
	near := func(r Result) bool { return float64(seriesPeak(r)) <= farOver*float64(rep.Limit) }
	far := func(r Result) bool { return !near(r) }
	some := func(keep func(Result) bool) bool {
		for _, r := range rep.Results {
			if keep(r) && len(r.Series) > 0 {
				return true
			}
		}
		return false
	}
	if rep.Limit <= 0 || !some(near) || !some(far) {
		return []svgChart{rep.htmlRateChart(func(Result) bool { return true }, "")}
	}
	return []svgChart{
		rep.htmlRateChart(near, fmt.Sprintf("strategies within %d× the limit", farOver)),
		rep.htmlRateChart(far, fmt.Sprintf("strategies past %d× the limit, on their own scale", farOver)),
	}
}

// htmlRateChart plots the Series of the strategies keep selects: one
// polyline per strategy with samples, a point at the middle of each
// SeriesStep, against a dashed line at the limit; edgelimit's line is drawn
// last, on top. panel, when set, names the selection in the axis title.
func (rep Report) htmlRateChart(keep func(Result) bool, panel string) svgChart {
	c := svgChart{Title: "admitted hits per window of the tracked key over time, against the limit"}
	if panel != "" {
		c.Title += ": " + panel
	}
	n := 0
	peak := float64(rep.Limit)
	for _, r := range rep.Results {
		if !keep(r) {
			continue
		}
		n = max(n, len(r.Series))
		peak = max(peak, float64(seriesPeak(r)))
	}
	// Time: SeriesStep per sample; without one, spread the samples over
	// the run (or one second each when that is unknown too).
	step := rep.SeriesStep.Seconds()
	if !(step > 0) && n > 0 {
		step = 1
		if rep.Duration > 0 {
			step = rep.Duration.Seconds() / float64(n)
		}
	}
	span := max(rep.Duration.Seconds(), float64(n)*step)
	xa := newSVGAxis(span, 6, 0)
	if span > 0 {
		xa.Top = span // the run ends at the right edge
	}
	ya := newSVGAxis(peak, 5, 1)
	c.cuts(rep.Partitions, xa)

	key := "the tracked key"
	if rep.Tracked != "" {
		key = "key " + strconv.Quote(rep.Tracked)
	}
	yTitle := "hits of " + key + " admitted in one window (requests)"
	if panel != "" {
		yTitle += " — " + panel
	}
	c.frame(ya, yTitle, "simulated time (s)")
	for _, v := range xa.ticks() {
		x := svgCoord(xa.x(v))
		c.Lines = append(c.Lines, svgLine{Class: "xtick", X1: x, Y1: svgCoord(plotBottom), X2: x, Y2: svgCoord(plotBottom + 4)})
		c.Texts = append(c.Texts, svgText{Class: "tick", X: x, Y: svgCoord(plotBottom + 17), Anchor: "middle", Text: htmlNum(v, xa.Decimals)})
	}
	order := make([]int, 0, len(rep.Results)) // edgelimit last: drawn over the others
	for i, r := range rep.Results {
		if r.Strategy != "edgelimit" {
			order = append(order, i)
		}
	}
	for i, r := range rep.Results {
		if r.Strategy == "edgelimit" {
			order = append(order, i)
		}
	}
	for _, i := range order {
		r := rep.Results[i]
		if len(r.Series) == 0 || !keep(r) {
			continue
		}
		var pts strings.Builder
		for j, v := range r.Series {
			if j > 0 {
				pts.WriteByte(' ')
			}
			x, y := svgCoord(xa.x((float64(j)+0.5)*step)), svgCoord(ya.y(float64(v)))
			pts.WriteString(x + "," + y)
			if len(r.Series) == 1 { // a one-point line draws nothing
				c.Dots = append(c.Dots, svgDot{Strategy: r.Strategy, X: x, Y: y, Color: strategyColor(i)})
			}
		}
		c.Polys = append(c.Polys, svgPoly{Strategy: r.Strategy, Points: pts.String(), Color: strategyColor(i)})
	}
	ly := ya.y(float64(rep.Limit))
	c.Above = append(c.Above, svgLine{Class: "limit", X1: svgCoord(plotLeft), Y1: svgCoord(ly), X2: svgCoord(plotLeft + plotW), Y2: svgCoord(ly)})
	c.AboveTexts = append(c.AboveTexts, svgText{Class: "limitlabel", X: svgCoord(plotLeft + plotW + 4), Y: svgCoord(ly + 4), Anchor: "start",
		Text: fmt.Sprintf("limit %d", rep.Limit)})
	if len(c.Polys) == 0 {
		c.note("no samples of the admitted rate in this report")
	}
	c.legend(rep, func(r Result) string {
		if len(r.Series) == 0 {
			return "(no data)"
		}
		if !keep(r) {
			return "(other panel)"
		}
		// A line hidden under an identical one would otherwise be missed.
		for _, o := range rep.Results {
			if o.Strategy == r.Strategy {
				break
			}
			if slices.Equal(o.Series, r.Series) {
				return "(= " + o.Strategy + ")"
			}
		}
		return ""
	})
	return c
}

// cutLabelRoom is the least width, in SVG units, of a cut's band and of the
// gap after it for its edges to be labelled "cut" and "heal": narrower, as
// flapping.yaml's 2 s cuts a minute long run are, the labels would run into
// each other, and the band alone marks it (the caption names every cut).
const cutLabelRoom = 40

// cuts shades, under the data, each partition's span on the time axis xa,
// with a line where the link is cut and one where it heals, labelled "cut"
// and "heal" where there is room. A partition past the run's end is left out;
// one that outlasts it is shaded to the right edge, with no heal.
func (c *svgChart) cuts(parts []Partition, xa svgAxis) {
	type span struct {
		x0, x1 float64
		healed bool
		tip    string
	}
	var spans []span
	for _, p := range parts {
		s, e := p.Start.Seconds(), p.End.Seconds()
		if s >= xa.Top || e <= s {
			continue
		}
		sp := span{x0: xa.x(max(s, 0)), x1: xa.x(min(e, xa.Top)), healed: e <= xa.Top}
		sp.tip = fmt.Sprintf("%s cut from %s to %s", cutPair(p), cutTime(p.Start), cutTime(p.End))
		spans = append(spans, sp)
	}
	slices.SortStableFunc(spans, func(a, b span) int { return cmp.Compare(a.x0, b.x0) })
	for i, sp := range spans {
		c.Bands = append(c.Bands, svgRect{X: svgCoord(sp.x0), Y: svgCoord(plotTop), W: svgCoord(max(sp.x1-sp.x0, 1)), H: svgCoord(plotH), Tip: sp.tip})
		c.Lines = append(c.Lines, svgLine{Class: "cutedge", X1: svgCoord(sp.x0), Y1: svgCoord(plotTop), X2: svgCoord(sp.x0), Y2: svgCoord(plotBottom)})
		if sp.healed {
			c.Lines = append(c.Lines, svgLine{Class: "cutedge", X1: svgCoord(sp.x1), Y1: svgCoord(plotTop), X2: svgCoord(sp.x1), Y2: svgCoord(plotBottom)})
		}
		room := sp.x1 - sp.x0
		if i+1 < len(spans) {
			room = min(room, spans[i+1].x0-sp.x1)
		}
		if room < cutLabelRoom {
			continue
		}
		c.Texts = append(c.Texts, svgText{Class: "cutlabel", X: svgCoord(sp.x0 + 4), Y: svgCoord(plotTop + 14), Anchor: "start", Text: "cut"})
		if sp.healed {
			c.Texts = append(c.Texts, svgText{Class: "cutlabel", X: svgCoord(sp.x1 + 4), Y: svgCoord(plotTop + 14), Anchor: "start", Text: "heal"})
		}
	}
}

// cutPair names a partition's link: "us ↔ eu", or "us → eu" one way.
func cutPair(p Partition) string {
	if p.OneWay {
		return p.From + " → " + p.To + " (one way)"
	}
	return p.From + " ↔ " + p.To
}

// cutTime is a moment of the run in seconds, as the time axis reads: "58s",
// "2.5s" (not Duration's "1m0s").
func cutTime(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
}

// htmlCuts is the caption of the rate chart's bands: per link, in the
// scenario's order, "us ↔ eu cut 10s–20s" with every span of it.
func (rep Report) htmlCuts() []string {
	var order []string
	spans := map[string][]string{}
	for _, p := range rep.Partitions {
		if p.End <= p.Start {
			continue
		}
		k := cutPair(p)
		if _, ok := spans[k]; !ok {
			order = append(order, k)
		}
		spans[k] = append(spans[k], cutTime(p.Start)+"–"+cutTime(p.End))
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		out = append(out, k+" cut "+strings.Join(spans[k], ", "))
	}
	return out
}

// overshootLabels names the buckets of Result.Overshoot: "0", "≤1%", "1–5%", …,
// ">200%".
func overshootLabels() []string {
	e := OvershootBuckets
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	if len(e) == 0 {
		return []string{"all"}
	}
	l := make([]string, 0, len(e)+1)
	if e[0] == 0 {
		l = append(l, "0")
	} else {
		l = append(l, "≤"+f(e[0])+"%")
	}
	for i := 1; i < len(e); i++ {
		if i == 1 && e[0] == 0 {
			l = append(l, "≤"+f(e[1])+"%")
		} else {
			l = append(l, f(e[i-1])+"–"+f(e[i])+"%")
		}
	}
	return append(l, ">"+f(e[len(e)-1])+"%")
}

// htmlHistogram returns r's Overshoot when it has one count per bucket, and its
// total; nil when it does not fit or counts nothing.
func htmlHistogram(r Result) ([]int64, int64) {
	if len(r.Overshoot) != len(OvershootBuckets)+1 {
		return nil, 0
	}
	var total int64
	for _, n := range r.Overshoot {
		total += max(n, 0)
	}
	if total == 0 {
		return nil, 0
	}
	return r.Overshoot, total
}

// windowShare is n of total in percent.
func windowShare(n, total int64) float64 { return 100 * float64(max(n, 0)) / float64(total) }

// htmlOvershootChart draws grouped bars: per bucket of excess, one bar per
// strategy with the share of that strategy's windows in the bucket. Bucket 0
// (no excess) is left out of the chart, the table gives it: with many keys
// nearly every window is within its limit, and its bar would flatten the
// ones that matter to nothing.
func (rep Report) htmlOvershootChart() svgChart {
	c := svgChart{Title: "windows over the limit, by how far over, by strategy"}
	labels := overshootLabels()[1:]
	peak := 0.0
	for _, r := range rep.Results {
		if h, total := htmlHistogram(r); h != nil {
			for _, n := range h[1:] {
				peak = max(peak, windowShare(n, total))
			}
		}
	}
	ya := newSVGAxis(min(peak, 100), 5, 0)
	c.frame(ya, "share of windows (%)", "excess over the limit in a fixed window (% of the limit)")
	group := float64(plotW) / float64(len(labels))
	for b, l := range labels {
		c.Texts = append(c.Texts, svgText{Class: "tick", X: svgCoord(float64(plotLeft) + float64(group*(float64(b)+0.5))), Y: svgCoord(plotBottom + 17), Anchor: "middle", Text: l})
	}
	ns := max(len(rep.Results), 1)
	bar := float64(group*0.8) / float64(ns)
	drawn, any := false, false
	for i, r := range rep.Results {
		h, total := htmlHistogram(r)
		any = any || h != nil
		for b, n := range h[min(1, len(h)):] {
			if n <= 0 {
				continue
			}
			s := windowShare(n, total)
			top := ya.y(s)
			x := float64(plotLeft) + float64(group*float64(b)) + float64(group*0.1) + float64(bar*float64(i))
			c.Rects = append(c.Rects, svgRect{
				X: svgCoord(x), Y: svgCoord(top), W: svgCoord(bar), H: svgCoord(float64(plotBottom) - top), Color: strategyColor(i),
				Tip: fmt.Sprintf("%s, excess %s: %s%% of %d windows (%d)", r.Strategy, labels[b], htmlNum(s, 4), total, n),
			})
			drawn = true
		}
	}
	switch {
	case !any:
		c.note("no overshoot histogram in this report")
	case !drawn:
		c.note("no window went over the limit")
	}
	c.legend(rep, func(r Result) string {
		if h, _ := htmlHistogram(r); h == nil {
			return "(no data)"
		}
		return ""
	})
	return c
}

// htmlOvershootTable is the histogram as a table: each strategy's share of
// windows per bucket, for those who would rather read numbers than bars.
func (rep Report) htmlOvershootTable() overshootTable {
	t := overshootTable{Buckets: overshootLabels()}
	for _, r := range rep.Results {
		row := overshootRow{Strategy: r.Strategy}
		h, total := htmlHistogram(r)
		for b := range t.Buckets {
			cell := "–"
			if h != nil {
				cell = htmlNum(windowShare(h[b], total), 2)
			}
			row.Cells = append(row.Cells, cell)
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}

// htmlPageTemplate is the page. It is XHTML-compatible (void elements closed,
// attributes quoted), so that a test can check it with an XML parser.
var htmlPageTemplate = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8"/>
<meta name="viewport" content="width=device-width, initial-scale=1"/>
<title>edgelimit sim: {{.Scenario}}</title>
<style>
body { font: 15px/1.45 system-ui, sans-serif; color: #222; margin: 2em auto; max-width: 64em; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.15em; margin-top: 2em; }
.facts { color: #555; margin-top: 0; }
pre { font-size: 12px; overflow-x: auto; background: #f6f6f6; padding: 0.8em; }
svg { max-width: 100%; height: auto; font-family: system-ui, sans-serif; }
svg .grid { stroke: #e4e4e4; stroke-width: 1; }
svg .axis, svg .xtick { stroke: #444; stroke-width: 1; }
svg .limit { stroke: #222; stroke-width: 1.5; stroke-dasharray: 6 4; }
svg .tick { font-size: 11px; fill: #444; }
svg .title { font-size: 12px; fill: #222; }
svg .limitlabel { font-size: 11px; fill: #222; }
svg .note { font-size: 14px; fill: #888; }
svg .cut { fill: #999; fill-opacity: 0.16; }
svg .cutedge { stroke: #777; stroke-width: 1; stroke-dasharray: 2 3; }
svg .cutlabel { font-size: 11px; fill: #555; }
svg .legend { font-size: 12px; fill: #222; }
svg polyline { fill: none; stroke-width: 1.5; stroke-linejoin: round; stroke-opacity: 0.85; }
.wide { overflow-x: auto; max-width: 100%; }
table.results { border-collapse: collapse; font-size: 13px; margin: 1em 0 0.4em; font-variant-numeric: tabular-nums; }
table.results th, table.results td { padding: 0.25em 0.35em; text-align: right; border-bottom: 1px solid #ddd; white-space: nowrap; }
table.results thead th { border-bottom: 2px solid #444; }
table.results thead th:first-child, table.results tbody th { text-align: left; }
table.results tbody th { font-weight: normal; }
table.results tr.ours { background: #e3f0fa; font-weight: 600; }
table.results tr.ours th { border-left: 4px solid #0072B2; font-weight: 600; }
dl.help { font-size: 12.5px; color: #444; display: grid; grid-template-columns: max-content 1fr; gap: 0.1em 0.9em; margin: 0 0 1.6em; }
dl.help dt { font-weight: 600; font-family: ui-monospace, monospace; }
dl.help dd { margin: 0; }
table.counts { border-collapse: collapse; font-size: 13px; }
table.counts th, table.counts td { padding: 0.2em 0.6em; text-align: right; border-bottom: 1px solid #ddd; }
table.counts th:first-child, table.counts td:first-child { text-align: left; }
</style>
</head>
<body>
<h1>edgelimit sim: {{.Scenario}}</h1>
<p class="facts">{{range $i, $f := .Facts}}{{if $i}} · {{end}}{{$f}}{{end}}</p>

<h2>Results</h2>
<pre>{{.Head}}</pre>
{{range .Tables}}<div class="wide"><table class="results">
<thead><tr>{{range .Cols}}<th scope="col" title="{{.Help}}">{{.Name}}</th>{{end}}</tr></thead>
<tbody>
{{range .Rows}}<tr{{if .Ours}} class="ours"{{end}}>{{range $i, $c := .Cells}}{{if $i}}<td>{{$c}}</td>{{else}}<th scope="row">{{$c}}</th>{{end}}{{end}}</tr>
{{end}}</tbody>
</table></div>
<dl class="help">
{{range .Cols}}<dt>{{.Name}}</dt><dd>{{.Help}}</dd>
{{end}}</dl>
{{end}}
<h2>Admitted rate against the limit</h2>
{{range .Rate}}{{template "chart" .}}{{end}}
{{if .Cuts}}<p class="cuts">Shaded, between dotted lines: the links the scenario cuts, from the cut to the heal — {{range $i, $c := .Cuts}}{{if $i}}; {{end}}{{$c}}{{end}}. Messages across a cut link are held and delivered when it heals.</p>
{{end}}<p>How to read this: each line follows one strategy through the run. For every {{if .Step}}{{.Step}} of simulated time{{else}}sample{{end}} it plots the most hits of {{if .Tracked}}the key “{{.Tracked}}”{{else}}the tracked key{{end}} that the strategy had admitted within one limit window (one {{.Unit}}) ending in that stretch. The dashed line is the limit. A line above it means the strategy let more through than the limit allows, and the gap is the overshoot; a line below it while clients send more than the limit means the strategy denied requests it could have admitted. An exact limiter would sit on the dashed line.</p>

<h2>How far windows went over the limit</h2>
{{template "chart" .Over}}
<p>How to read this: every fixed limit window of every key that admitted at least one hit counts once. For each strategy, the bars show which share of those windows ended with how much excess over the limit, as a percentage of the limit. Windows with no excess are left out of the chart (with many keys they are nearly all of them, and their bar would flatten the others); the table below gives every bucket, “0” included, and each strategy's row adds up to 100%. A strategy that never overshoots has no bars; the further right its bars reach, the further it went over the limit, and the taller they are there, the more often.</p>
<div class="wide"><table class="counts">
<tr><th>% of windows</th>{{range .Counts.Buckets}}<th>{{.}}</th>{{end}}</tr>
{{range .Counts.Rows}}<tr><td>{{.Strategy}}</td>{{range .Cells}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table></div>
</body>
</html>
{{define "chart"}}<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {{.Width}} {{.Height}}" width="{{.Width}}" height="{{.Height}}" role="img" aria-label="{{.Title}}">
{{range .Bands}}<rect class="cut" x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}"><title>{{.Tip}}</title></rect>
{{end}}{{range .Lines}}<line class="{{.Class}}" x1="{{.X1}}" y1="{{.Y1}}" x2="{{.X2}}" y2="{{.Y2}}"/>
{{end}}{{range .Texts}}<text class="{{.Class}}" x="{{.X}}" y="{{.Y}}" text-anchor="{{.Anchor}}">{{.Text}}</text>
{{end}}{{range .Rects}}<rect class="bar" x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}" fill="{{.Color}}"><title>{{.Tip}}</title></rect>
{{end}}{{range .Polys}}<polyline data-strategy="{{.Strategy}}" stroke="{{.Color}}" points="{{.Points}}"><title>{{.Strategy}}</title></polyline>
{{end}}{{range .Dots}}<circle data-strategy="{{.Strategy}}" cx="{{.X}}" cy="{{.Y}}" r="2.5" fill="{{.Color}}"/>
{{end}}{{range .Above}}<line class="{{.Class}}" x1="{{.X1}}" y1="{{.Y1}}" x2="{{.X2}}" y2="{{.Y2}}"/>
{{end}}{{range .AboveTexts}}<text class="{{.Class}}" x="{{.X}}" y="{{.Y}}" text-anchor="{{.Anchor}}">{{.Text}}</text>
{{end}}{{range .Legend}}<rect class="swatch" x="{{.X}}" y="{{.Y}}" width="12" height="12" fill="{{.Color}}"/><text class="legend" x="{{.TX}}" y="{{.TY}}">{{.Name}}</text>
{{end}}</svg>{{end}}`))
