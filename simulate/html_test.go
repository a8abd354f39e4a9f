package simulate

import (
	"bytes"
	"encoding/xml"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// htmlElement is one start tag of a parsed page.
type htmlElement struct {
	name  string
	attrs map[string]string
	text  string // character data directly inside, for text and title
}

// parseHTML checks that page is well-formed XML — every tag closed, in
// order, attributes quoted — which the page is written to be, and returns
// its elements in document order.
func parseHTML(t *testing.T, page []byte) []htmlElement {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(page))
	d.Strict = true
	d.Entity = xml.HTMLEntity
	var els []htmlElement
	var open []int // indexes in els of the open elements
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("page is not well-formed: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			e := htmlElement{name: tok.Name.Local, attrs: map[string]string{}}
			for _, a := range tok.Attr {
				e.attrs[a.Name.Local] = a.Value
			}
			els = append(els, e)
			open = append(open, len(els)-1)
		case xml.EndElement:
			open = open[:len(open)-1]
		case xml.CharData:
			if len(open) > 0 {
				els[open[len(open)-1]].text += string(tok)
			}
		}
	}
	if len(open) != 0 {
		t.Fatalf("%d elements left open", len(open))
	}
	return els
}

func renderHTML(t *testing.T, rep Report) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := rep.WriteHTML(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func findElements(els []htmlElement, name, class string) []htmlElement {
	var out []htmlElement
	for _, e := range els {
		if e.name == name && (class == "" || e.attrs["class"] == class) {
			out = append(out, e)
		}
	}
	return out
}

// syntheticHTMLReport has a limit of 100, series peaking at exactly 200 (so the
// y axis runs 0–200 and the limit sits halfway up) and a histogram each.
func syntheticHTMLReport() Report {
	rep := Report{
		Scenario: "synthetic", Seed: 7, Duration: 3 * time.Second, Limit: 100,
		Unit: "second", Algorithm: "sliding_window", PoPs: 4, Regions: 2,
		OfferedPerSecond: 500, FlushInterval: 50 * time.Millisecond,
		Tracked: "t1", SeriesStep: 250 * time.Millisecond,
	}
	lengths := []int{12, 12, 12, 12, 7} // the last one stops early
	for i, st := range Strategies {
		r := Result{Strategy: st.String(), Series: make([]int64, lengths[i])}
		for j := range r.Series {
			r.Series[j] = int64(50 + 25*i + j)
		}
		r.Series[0] = 200
		r.Overshoot = make([]int64, len(OvershootBuckets)+1)
		r.Overshoot[0] = 3
		r.Overshoot[i+1] = 1 // 25% of this strategy's windows
		rep.Results = append(rep.Results, r)
	}
	return rep
}

func parseCoord(t *testing.T, s string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("not a number: %q", s)
	}
	return v
}

// TestHTMLCharts renders a synthetic report and checks the page's structure
// and geometry: one polyline per strategy with one point per sample, the
// limit line halfway up a 0–200 axis, bars sized by share, bucket labels.
func TestHTMLCharts(t *testing.T) {
	rep := syntheticHTMLReport()
	page := renderHTML(t, rep)
	els := parseHTML(t, page)

	if n := len(findElements(els, "svg", "")); n != 2 {
		t.Fatalf("%d svg charts, want 2", n)
	}
	if n := len(findElements(els, "script", "")) + len(findElements(els, "link", "")) + len(findElements(els, "img", "")); n != 0 {
		t.Fatalf("%d script, link or img elements: the page must be self-contained", n)
	}
	if bytes.Contains(page, []byte("http://")) && bytes.Count(page, []byte("http://")) != bytes.Count(page, []byte(`xmlns="http://www.w3.org/2000/svg"`)) {
		t.Fatal("the page refers to an external resource")
	}

	polys := findElements(els, "polyline", "")
	if len(polys) != len(rep.Results) {
		t.Fatalf("%d polylines, want one per strategy (%d)", len(polys), len(rep.Results))
	}
	colors := map[string]bool{}
	byName := map[string]Result{}
	for _, r := range rep.Results {
		byName[r.Strategy] = r
	}
	if last := polys[len(polys)-1].attrs["data-strategy"]; last != "edgelimit" {
		t.Fatalf("the last polyline drawn is %q; edgelimit's must be on top", last)
	}
	for i, p := range polys {
		r, ok := byName[p.attrs["data-strategy"]]
		if !ok {
			t.Fatalf("polyline %d is %q, no strategy of the report", i, p.attrs["data-strategy"])
		}
		pts := strings.Fields(p.attrs["points"])
		if len(pts) != len(r.Series) {
			t.Fatalf("%s: %d points, want %d", r.Strategy, len(pts), len(r.Series))
		}
		// The first sample is 200, the top of the axis.
		if y := parseCoord(t, strings.Split(pts[0], ",")[1]); y != plotTop {
			t.Fatalf("%s: the sample of 200 is at y %v, want the top %d", r.Strategy, y, plotTop)
		}
		// Samples sit at the middle of their step, left to right.
		x0 := parseCoord(t, strings.Split(pts[0], ",")[0])
		x1 := parseCoord(t, strings.Split(pts[1], ",")[0])
		if want := plotLeft + float64(plotW)*0.125/3; absFloat(x0-want) > 0.051 || x1 <= x0 {
			t.Fatalf("%s: first points at x %v, %v; want the first at %.1f", r.Strategy, x0, x1, want)
		}
		colors[p.attrs["stroke"]] = true
	}
	if len(colors) != len(polys) {
		t.Fatalf("strategies share colours: %v", colors)
	}

	limit := findElements(els, "line", "limit")
	if len(limit) != 1 {
		t.Fatalf("%d limit lines, want 1", len(limit))
	}
	want := float64(plotTop) + float64(plotH)/2
	if y1, y2 := parseCoord(t, limit[0].attrs["y1"]), parseCoord(t, limit[0].attrs["y2"]); y1 != want || y2 != want {
		t.Fatalf("limit line at y %v–%v, want %v (100 on a 0–200 axis)", y1, y2, want)
	}
	ticks := map[string]bool{}
	for _, e := range findElements(els, "text", "tick") {
		ticks[e.text] = true
	}
	for _, l := range []string{"0", "100", "200", "0.5", "3.0", "25", "≤1%", "1–5%", "100–200%", ">200%"} {
		if !ticks[l] {
			t.Errorf("no tick label %q in %v", l, ticks)
		}
	}

	// Bars: 3/4 of each strategy's windows in bucket 0, left out of the
	// chart, and 1/4 in one other bucket, on an axis to 25%: one full-height
	// bar per strategy, each in its own bucket.
	bars := findElements(els, "rect", "bar")
	if len(bars) != len(rep.Results) {
		t.Fatalf("%d bars, want %d", len(bars), len(rep.Results))
	}
	prevX := -1.0
	for _, b := range bars {
		h := parseCoord(t, b.attrs["height"])
		if absFloat(h-float64(plotH)) > 0.051 {
			t.Fatalf("bar of height %v, want %v", h, plotH)
		}
		x := parseCoord(t, b.attrs["x"])
		if x <= prevX+float64(plotW)/float64(len(OvershootBuckets))/2 {
			t.Fatalf("bar at x %v not in a later bucket than the one at %v", x, prevX)
		}
		prevX = x
	}
	if !bytes.Contains(page, []byte("<td>75.00</td>")) {
		t.Fatal("the counts table does not show 75.00% in bucket 0")
	}
	if !bytes.Contains(page, []byte("<pre>scenario synthetic  seed 7")) {
		t.Fatal("the page does not embed the text table")
	}
}

func absFloat(v float64) float64 {
	if v < 0 {
		return -v
	}
	return v
}

// TestHTMLEscapes puts markup in every string a report carries: none of it
// may reach the page as markup.
func TestHTMLEscapes(t *testing.T) {
	rep := syntheticHTMLReport()
	evil := `<script>alert("x")</script>`
	rep.Scenario, rep.Tracked, rep.Unit, rep.Algorithm = evil, evil, evil, evil
	rep.Results[0].Strategy = evil
	page := renderHTML(t, rep)
	if bytes.Contains(bytes.ToLower(page), []byte("<script")) {
		t.Fatal("markup from the report reached the page unescaped")
	}
	if !bytes.Contains(page, []byte("&lt;script&gt;")) {
		t.Fatal("the scenario name is missing from the page")
	}
	els := parseHTML(t, page)
	if n := len(findElements(els, "script", "")); n != 0 {
		t.Fatalf("%d script elements", n)
	}
	if got := findElements(els, "h1", "")[0].text; got != "edgelimit sim: "+evil {
		t.Fatalf("heading %q", got)
	}
}

var htmlNotFinite = regexp.MustCompile(`NaN|[+-]?Inf\b`)

// TestHTMLEmpty renders reports with nothing to chart: empty and short
// series, zero and malformed histograms, no limit, no step, no duration.
// The page must stay well-formed, say there is no data, and carry no NaN or
// Inf.
func TestHTMLEmpty(t *testing.T) {
	full := syntheticHTMLReport()
	cases := map[string]Report{
		"no results": {Scenario: "empty"},
		"nothing measured": func() Report {
			rep := full
			rep.Results = nil
			rep.Limit, rep.SeriesStep, rep.Duration = 0, 0, 0
			for _, st := range Strategies {
				rep.Results = append(rep.Results, Result{Strategy: st.String()})
			}
			return rep
		}(),
		"zero and short": func() Report {
			rep := full
			rep.Results = nil
			rep.SeriesStep = 0
			for i, st := range Strategies {
				r := Result{Strategy: st.String(), Series: make([]int64, i%2), Overshoot: make([]int64, i)}
				rep.Results = append(rep.Results, r)
			}
			return rep
		}(),
	}
	for name, rep := range cases {
		t.Run(name, func(t *testing.T) {
			page := renderHTML(t, rep)
			els := parseHTML(t, page)
			if m := htmlNotFinite.Find(page); m != nil {
				t.Fatalf("page contains %q", m)
			}
			if n := len(findElements(els, "svg", "")); n != 2 {
				t.Fatalf("%d charts, want 2 even without data", n)
			}
			notes := 2 // one per chart
			if name == "zero and short" {
				notes = 1 // the one-sample series are drawn, as dots
				if n := len(findElements(els, "circle", "")); n != 2 {
					t.Fatalf("%d dots, want 2 for the 2 one-sample series", n)
				}
			}
			if n := len(findElements(els, "text", "note")); n != notes {
				t.Fatalf("%d notes, want %d", n, notes)
			}
			for _, e := range els {
				for k, v := range e.attrs {
					if (k == "x" || k == "y" || k == "y1" || k == "height" || k == "width") && v == "" {
						t.Fatalf("<%s> has an empty %s", e.name, k)
					}
				}
			}
		})
	}
}

// TestHTMLDeterministic renders two runs of spray.yaml: same bytes.
func TestHTMLDeterministic(t *testing.T) {
	sc := load(t, "spray.yaml")
	a, _ := table(t, sc)
	b, _ := table(t, sc)
	pa, pb := renderHTML(t, a), renderHTML(t, b)
	if !bytes.Equal(pa, pb) {
		t.Fatal("two runs of the same scenario and seed render different pages")
	}
	parseHTML(t, pa)
	if m := htmlNotFinite.Find(pa); m != nil {
		t.Fatalf("page contains %q", m)
	}
	if !bytes.Contains(pa, []byte("edgelimit sim: spray")) {
		t.Fatal("no title")
	}
	if out := os.Getenv("EDGELIMIT_HTML_OUT"); out != "" { // to look at it
		if err := os.WriteFile(out, pa, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHTMLRatePanels: a strategy far over the limit (local-only under a
// sprayer) gets a panel of its own, so the others are drawn on an axis scaled
// to them, not flattened onto the limit line under its peak.
func TestHTMLRatePanels(t *testing.T) {
	rep := syntheticHTMLReport() // every strategy peaks at 200, twice the limit of 100
	for i := range rep.Results {
		if rep.Results[i].Strategy == "local-only" {
			rep.Results[i].Series = []int64{4000, 3900, 4000}
		}
	}
	els := parseHTML(t, renderHTML(t, rep))
	if n := len(findElements(els, "svg", "")); n != 3 {
		t.Fatalf("%d svg charts, want 3: two rate panels and the overshoot chart", n)
	}
	polys := findElements(els, "polyline", "")
	if len(polys) != len(rep.Results) {
		t.Fatalf("%d polylines, want one per strategy (%d)", len(polys), len(rep.Results))
	}
	// The first panel's strategies peak at 200, and its axis tops there: a
	// sample of 200 is at the top of the plot, not at a twentieth of it.
	for _, p := range polys[:len(polys)-1] {
		if p.attrs["data-strategy"] == "local-only" {
			t.Fatalf("local-only is drawn in the first panel, among the strategies near the limit")
		}
		first := strings.Fields(p.attrs["points"])[0]
		if y := parseCoord(t, strings.Split(first, ",")[1]); y != plotTop {
			t.Fatalf("%s: its peak of 200 is at y %v, want the top %d", p.attrs["data-strategy"], y, plotTop)
		}
	}
	if polys[len(polys)-2].attrs["data-strategy"] != "edgelimit" {
		t.Fatalf("edgelimit is not drawn last in its panel")
	}
	if last := polys[len(polys)-1]; last.attrs["data-strategy"] != "local-only" {
		t.Fatalf("the second panel draws %q, want local-only alone", last.attrs["data-strategy"])
	}
	if n := len(findElements(els, "line", "limit")); n != 2 {
		t.Fatalf("%d limit lines, want one per rate panel", n)
	}
}

// TestHTMLCuts: a scenario's cuts are shaded on the rate chart, from the cut
// to the heal on its time axis, with "cut" and "heal" where there is room and
// a caption naming each; a scenario without cuts has none of it.
func TestHTMLCuts(t *testing.T) {
	rep := syntheticHTMLReport() // 3 s
	els := parseHTML(t, renderHTML(t, rep))
	if n := len(findElements(els, "rect", "cut")); n != 0 {
		t.Fatalf("no partitions, yet %d cut bands", n)
	}
	if n := len(findElements(els, "line", "cutedge")) + len(findElements(els, "text", "cutlabel")) + len(findElements(els, "p", "cuts")); n != 0 {
		t.Fatalf("no partitions, yet %d cut marks", n)
	}

	rep.Partitions = []Partition{
		{From: "us", To: "eu", Start: time.Second, End: 2 * time.Second},
		{From: "us", To: "ap", Start: 2500 * time.Millisecond, End: 10 * time.Second, OneWay: true}, // outlasts the run
		{From: "eu", To: "ap", Start: 5 * time.Second, End: 6 * time.Second},                        // after it
	}
	els = parseHTML(t, renderHTML(t, rep))
	bands := findElements(els, "rect", "cut")
	if len(bands) != 2 {
		t.Fatalf("%d cut bands, want 2: the cut past the run's end is left out", len(bands))
	}
	// 1 s to 2 s of a 3 s axis: the middle third of the plot.
	x, w := parseCoord(t, bands[0].attrs["x"]), parseCoord(t, bands[0].attrs["width"])
	if want := plotLeft + plotW/3.0; x < want-0.1 || x > want+0.1 {
		t.Errorf("the 1 s cut starts at x %v, want %v", x, want)
	}
	if want := plotW / 3.0; w < want-0.2 || w > want+0.2 {
		t.Errorf("the 1 s cut is %v wide, want %v", w, want)
	}
	if x, w := parseCoord(t, bands[1].attrs["x"]), parseCoord(t, bands[1].attrs["width"]); x+w > plotLeft+plotW+0.1 {
		t.Errorf("the cut that outlasts the run ends at x %v, past the plot's right edge %d", x+w, plotLeft+plotW)
	}
	// An edge at each cut and at the one heal within the run.
	if n := len(findElements(els, "line", "cutedge")); n != 3 {
		t.Errorf("%d cut and heal lines, want 3", n)
	}
	var labels []string
	for _, e := range findElements(els, "text", "cutlabel") {
		labels = append(labels, e.text)
	}
	if strings.Join(labels, ",") != "cut,heal,cut" {
		t.Errorf("labels %q, want cut,heal of the first cut and cut alone of the second, which heals after the run", labels)
	}
	// Cuts too narrow to label (a flapping link's) are shaded all the same.
	rep.Partitions = nil
	for s := time.Duration(0); s < 3*time.Second; s += 200 * time.Millisecond {
		rep.Partitions = append(rep.Partitions, Partition{From: "us", To: "eu", Start: s, End: s + 100*time.Millisecond})
	}
	narrow := parseHTML(t, renderHTML(t, rep))
	if n := len(findElements(narrow, "rect", "cut")); n != len(rep.Partitions) {
		t.Errorf("%d bands of %d short cuts", n, len(rep.Partitions))
	}
	if n := len(findElements(narrow, "text", "cutlabel")); n != 0 {
		t.Errorf("%d labels on cuts %v wide, want none", n, plotW/30.0)
	}
	caption := findElements(els, "p", "cuts")
	if len(caption) != 1 {
		t.Fatalf("%d captions of the cuts, want 1", len(caption))
	}
	for _, want := range []string{"us ↔ eu cut 1s–2s", "us → ap (one way) cut 2.5s–10s", "eu ↔ ap cut 5s–6s"} {
		if !strings.Contains(caption[0].text, want) {
			t.Errorf("caption %q does not say %q", caption[0].text, want)
		}
	}
}

// TestHTMLResultsTable runs a small scenario: the page's results tables have
// one row per strategy, edgelimit's marked, with the cells the text report
// prints, worst% included, and every column's help from the legend.
func TestHTMLResultsTable(t *testing.T) {
	sc := load(t, "spray.yaml")
	shrink(&sc, 1, 2*time.Second)
	rep, text := table(t, sc)
	els := parseHTML(t, renderHTML(t, rep))
	if n := len(findElements(els, "pre", "")); n != 1 {
		t.Fatalf("%d pre elements, want only the header", n)
	}
	if n := len(findElements(els, "table", "results")); n != len(reportTables) {
		t.Fatalf("%d results tables, want %d", n, len(reportTables))
	}
	// The text table's rows, by strategy, as fields: "strategy decisions
	// admitted worst worst% …".
	textRows := map[string][]string{}
	for _, line := range strings.Split(string(text), "\n") {
		f := strings.Fields(line)
		if len(f) == len(reportTables[0]) && f[0] != "strategy" {
			textRows[f[0]] = f
		}
	}
	if len(textRows) != len(Strategies) {
		t.Fatalf("text report has %d accuracy rows, want %d", len(textRows), len(Strategies))
	}
	// Walk the page: rows are tr elements inside tbody; the first cell is a
	// th, the others td.
	var rows [][]string
	var ours []string
	for _, e := range els {
		switch {
		case e.name == "tr":
			rows = append(rows, nil)
			if e.attrs["class"] == "ours" {
				ours = append(ours, "")
			}
		case (e.name == "th" && e.attrs["scope"] == "row") || e.name == "td":
			rows[len(rows)-1] = append(rows[len(rows)-1], e.text)
		}
	}
	var accuracy [][]string
	for _, r := range rows {
		if len(r) == len(reportTables[0]) && textRows[r[0]] != nil {
			accuracy = append(accuracy, r)
		}
	}
	if len(accuracy) != len(Strategies) {
		t.Fatalf("%d accuracy rows on the page, want one per strategy (%d)", len(accuracy), len(Strategies))
	}
	worst := slicesIndex(reportTables[0], "worst%")
	for i, r := range accuracy {
		if r[0] != Strategies[i].String() {
			t.Fatalf("row %d is %q, want %q", i, r[0], Strategies[i])
		}
		want := textRows[r[0]]
		if r[worst] != want[worst] {
			t.Fatalf("%s: worst%% %q on the page, %q in the text report", r[0], r[worst], want[worst])
		}
		if strings.Join(r, " ") != strings.Join(want, " ") {
			t.Fatalf("%s: page row %q, text row %q", r[0], r, want)
		}
	}
	if len(ours) != len(reportTables) {
		t.Fatalf("%d rows marked as edgelimit's, want one per table", len(ours))
	}
	help := findElements(els, "dd", "")
	if n := len(reportTables[0]) + len(reportTables[1]); len(help) != n {
		t.Fatalf("%d help lines, want one per column (%d)", len(help), n)
	}
	for _, h := range help {
		if !strings.Contains(strings.Join(strings.Fields(string(text)), " "), h.text) {
			t.Fatalf("help %q is not the text report's legend", h.text)
		}
	}
}

func slicesIndex(cols []column, name string) int {
	for i, c := range cols {
		if c.Name == name {
			return i
		}
	}
	return -1
}

// TestHTMLTablesScroll: every table of the page sits in a box that scrolls
// sideways, so that on a narrow screen a wide table scrolls by itself and
// the page keeps the screen's width.
func TestHTMLTablesScroll(t *testing.T) {
	sc := load(t, "partition.yaml")
	shrink(&sc, 1, 2*time.Second)
	rep, _ := table(t, sc)
	page := string(renderHTML(t, rep))
	if !regexp.MustCompile(`\.wide \{[^}]*overflow-x: auto`).MatchString(page) {
		t.Fatal("the style has no .wide box with overflow-x: auto")
	}
	tables := strings.Count(page, "<table")
	wrapped := strings.Count(page, `<div class="wide"><table`)
	if tables == 0 || wrapped != tables {
		t.Fatalf("%d of %d tables in a scrolling box", wrapped, tables)
	}
	parseHTML(t, []byte(page)) // still well-formed
	if rep.Sources == 1 && rep.Keys == 1 && !strings.Contains(page, "1 source on 1 key<") {
		t.Errorf("the facts do not say %q", "1 source on 1 key")
	}
}
