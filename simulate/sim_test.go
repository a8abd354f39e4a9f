package simulate

import (
	"bytes"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func load(t testing.TB, name string) Scenario {
	t.Helper()
	sc, err := LoadScenario(filepath.Join("scenarios", name))
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func table(t testing.TB, sc Scenario) (Report, []byte) {
	t.Helper()
	rep, err := Run(sc)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := rep.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	return rep, b.Bytes()
}

// TestDeterministic runs every shipped scenario twice: the reports must be
// byte-identical, and another seed must give another report.
func TestDeterministic(t *testing.T) {
	for _, name := range []string{"spray.yaml", "anycast.yaml", "partition.yaml"} {
		t.Run(name, func(t *testing.T) {
			sc := load(t, name)
			_, a := table(t, sc)
			_, b := table(t, sc)
			if !bytes.Equal(a, b) {
				t.Fatalf("same scenario and seed, different reports:\n%s\n%s", a, b)
			}
			if !bytes.Contains(a, []byte("seed "+strconv.FormatUint(sc.Seed, 10)+" ")) {
				t.Fatalf("report does not print the seed:\n%s", a)
			}
			sc.Seed++
			_, c := table(t, sc)
			if bytes.Equal(a, c) {
				t.Fatalf("seeds %d and %d gave the same report", sc.Seed-1, sc.Seed)
			}
		})
	}
}

// TestSprayOvershootBound checks edgelimit's overshoot on spray.yaml against
// a bound derived from how replication works.
//
// Without loss or partitions, a hit admitted at PoP q at time s reaches every
// other PoP's store by s + D, where D = FlushInterval (waiting for q's next
// flush) + Lmax (the largest one-way latency, jitter included). So a PoP
// deciding at t sees every hit except those admitted at the other N−1 PoPs in
// (t − D, t]. Spraying at rate R puts R·(N−1)/N per second on the other PoPs,
// so the hits a PoP cannot see are at most the arrivals there in D: a Poisson
// count of mean m = R·D·(N−1)/N, which we bound by m + 3√m. On top comes what
// the sliding-window counter itself lets through with no replication lag at
// all, measured by the centralized strategy on the very same arrivals:
//
//	overshoot(edgelimit) ≤ R·D·(N−1)/N + 3·√(R·D·(N−1)/N) + overshoot(centralized)
//
// Local-only lets each PoP admit the whole limit, so it approaches (N−1)×limit;
// edgelimit must stay far below that.
func TestSprayOvershootBound(t *testing.T) {
	sc := load(t, "spray.yaml")
	rep, out := table(t, sc)
	t.Logf("\n%s", out)
	if sc.Loss != 0 || len(sc.Partitions) != 0 {
		t.Fatal("the bound assumes no loss and no partitions")
	}
	el, local, central := rep.Results[Edgelimit], rep.Results[LocalOnly], rep.Results[Centralized]

	m, bound := replicationBound(sc, rep, 0)
	t.Logf("unseen hits m = %.0f; bound %.0f; edgelimit worst %d; local-only worst %d",
		m, bound, el.WorstOvershoot, local.WorstOvershoot)

	if float64(el.WorstOvershoot) > bound {
		t.Errorf("edgelimit worst overshoot %d exceeds the bound %.0f", el.WorstOvershoot, bound)
	}
	if 4*el.WorstOvershoot > local.WorstOvershoot {
		t.Errorf("edgelimit worst overshoot %d is not far below local-only's %d", el.WorstOvershoot, local.WorstOvershoot)
	}
	if want := rep.Limit * int64(rep.PoPs-1) * 9 / 10; local.WorstOvershoot < want {
		t.Errorf("local-only worst overshoot %d, want near (N−1)×limit (≥ %d)", local.WorstOvershoot, want)
	}
	if el.Messages == 0 || el.Bytes == 0 || local.Messages != 0 {
		t.Errorf("wire: edgelimit %d msgs %d bytes, local-only %d msgs", el.Messages, el.Bytes, local.Messages)
	}
	if central.AddedLatency <= 0 || el.AddedLatency != 0 {
		t.Errorf("added latency: centralized %v, edgelimit %v", central.AddedLatency, el.AddedLatency)
	}
}

// replicationBound is the bound of TestSprayOvershootBound for rep's
// scenario: m = R·D·(N−1)/N, the mean hits a PoP cannot see yet, and
// cut×limit + m + 3√m + overshoot(centralized), where cut counts regions that
// may be unable to see each other at all (their hits held by a partition).
func replicationBound(sc Scenario, rep Report, cut int64) (m, bound float64) {
	var lmax time.Duration
	for _, l := range sc.Latency {
		lmax = max(lmax, time.Duration((l.Ms+l.JitterMs)*float64(time.Millisecond)))
	}
	d := (sc.FlushInterval + lmax).Seconds()
	n := float64(rep.PoPs)
	m = rep.OfferedPerSecond * d * (n - 1) / n
	return m, float64(cut*rep.Limit) + m + 3*math.Sqrt(m) + float64(rep.Results[Centralized].WorstOvershoot)
}

// TestPartitionOvershootBound: while us and eu are cut, neither sees the
// other's hits, so each may admit the whole limit: the bound of
// TestSprayOvershootBound grows by (regions − 1) × limit. The cut must cost
// overshoot compared with the same run uncut, and stay within that bound.
func TestPartitionOvershootBound(t *testing.T) {
	sc := load(t, "partition.yaml")
	cut, out := table(t, sc)
	t.Logf("\n%s", out)
	sc.Partitions = nil
	whole, err := Run(sc)
	if err != nil {
		t.Fatal(err)
	}
	c, w := cut.Results[Edgelimit], whole.Results[Edgelimit]
	if c.WorstOvershoot <= w.WorstOvershoot {
		t.Errorf("the partition did not raise overshoot: %d with, %d without", c.WorstOvershoot, w.WorstOvershoot)
	}
	_, bound := replicationBound(sc, cut, int64(cut.Regions-1))
	if float64(c.WorstOvershoot) > bound {
		t.Errorf("edgelimit worst overshoot %d under a partition exceeds the bound %.0f", c.WorstOvershoot, bound)
	}
	_, uncut := replicationBound(sc, whole, 0)
	t.Logf("worst overshoot: cut %d (bound %.0f), uncut %d (bound %.0f)", c.WorstOvershoot, bound, w.WorstOvershoot, uncut)
	if float64(w.WorstOvershoot) > uncut {
		t.Errorf("edgelimit worst overshoot %d without the partition exceeds the bound %.0f", w.WorstOvershoot, uncut)
	}
}

func TestScenarioErrors(t *testing.T) {
	base := `
seed: 1
duration: 10s
regions: [{name: us, pops: [a, b]}, {name: eu, pops: [c]}]
latency: [{from: us, to: eu, ms: 40}]
limit: {requests_per_unit: 100, unit: second}
sources: [{rate: 500, spread: spray}]
`
	if _, err := ParseScenario([]byte(base)); err != nil {
		t.Fatalf("base scenario: %v", err)
	}
	cases := []struct{ name, edit, want string }{
		{"unknown field", "colour: blue\n", "field colour not found"},
		{"missing latency", "regions: [{name: us, pops: [a]}, {name: eu, pops: [c]}, {name: ap, pops: [d]}]\n", `no entry for regions "us" and "ap"`},
		{"duplicate pop", "regions: [{name: us, pops: [a, a]}, {name: eu, pops: [c]}]\n", `PoP "a" named twice`},
		{"bad spread", "sources: [{rate: 1, spread: broadcast}]\n", `"broadcast" is not anycast, spray or random`},
		{"unknown anycast pop", "sources: [{rate: 1, spread: anycast, pop: zz}]\n", `unknown PoP "zz"`},
		{"bad loss", "loss: 1.5\n", "loss: must be in [0, 1)"},
		{"bad partition", "partitions: [{from: us, to: eu, start: 5s, end: 2s}]\n", "partitions[0]: need 0 ≤ start < end"},
		{"partition unknown region", "partitions: [{from: us, to: mars, start: 1s, end: 2s}]\n", `unknown region in "us"–"mars"`},
		{"token bucket", "limit: {requests_per_unit: 10, unit: second, algorithm: token_bucket}\n", "does not replicate"},
		{"bad unit", "limit: {requests_per_unit: 10, unit: fortnight}\n", `unknown unit "fortnight"`},
		{"zero rate", "sources: [{rate: 0, spread: spray}]\n", "sources[0].rate: must be positive"},
		{"no duration", "duration: 0s\n", "duration: must be positive"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseScenario([]byte(replaceTop(base, c.edit)))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
}

// replaceTop replaces the top-level YAML keys that edit sets, or appends them.
func replaceTop(base, edit string) string {
	key := edit[:strings.Index(edit, ":")+1]
	var out []string
	for _, line := range strings.Split(base, "\n") {
		if !strings.HasPrefix(line, key) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n") + edit
}

func TestQueueOrder(t *testing.T) {
	q := newQueue(1, 1)
	q.schedule(event{at: 5, idx: 0})
	q.schedule(event{at: 3, idx: 1})
	q.schedule(event{at: 5, idx: 2})
	q.schedule(event{at: 3, idx: 3})
	var got []int
	for {
		e, ok := q.next()
		if !ok {
			break
		}
		got = append(got, e.idx)
	}
	if want := []int{1, 3, 0, 2}; !equalInts(got, want) {
		t.Fatalf("order %v, want %v (time, then insertion)", got, want)
	}
	if q.now != 5 {
		t.Fatalf("clock at %d, want 5", q.now)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// BenchmarkRun reports simulated decisions per second of wall time, over all
// four strategies of each shipped scenario.
func BenchmarkRun(b *testing.B) {
	for _, name := range []string{"spray.yaml", "anycast.yaml", "partition.yaml"} {
		b.Run(strings.TrimSuffix(name, ".yaml"), func(b *testing.B) {
			sc := load(b, name)
			b.ReportAllocs()
			var decisions int64
			for b.Loop() {
				rep, err := Run(sc)
				if err != nil {
					b.Fatal(err)
				}
				for _, r := range rep.Results {
					decisions += r.Decisions
				}
			}
			b.ReportMetric(float64(decisions)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
}

func TestHealAt(t *testing.T) {
	top := &topology{cuts: []cut{
		{from: 0, to: 1, start: 10, end: 20},
		{from: 0, to: 1, start: 15, end: 30}, // overlaps: the link heals at 30
		{from: 2, to: 0, start: 10, end: 20, oneWay: true},
	}}
	cases := []struct {
		a, b int
		now  int64
		want int64
	}{
		{0, 1, 5, 5},
		{0, 1, 10, 30},
		{1, 0, 19, 30}, // both ways
		{0, 1, 30, 30}, // healed: end is exclusive
		{2, 0, 12, 20},
		{0, 2, 12, 12}, // one way only
	}
	for _, c := range cases {
		if got := top.healAt(c.a, c.b, c.now); got != c.want {
			t.Errorf("healAt(%d→%d, %d) = %d, want %d", c.a, c.b, c.now, got, c.want)
		}
	}
}

// TestLossRepairedBySnapshots: with a quarter of messages lost and every
// PoP's full state re-sent each second, edgelimit still holds far below
// local-only, and Run leaves the caller's scenario as it was.
func TestLossRepairedBySnapshots(t *testing.T) {
	sc := load(t, "spray.yaml")
	sc.Loss, sc.SnapshotInterval = 0.25, time.Second
	sc.Sources[0].End = 0
	rep, out := table(t, sc)
	t.Logf("\n%s", out)
	if sc.Sources[0].End != 0 {
		t.Fatal("Run wrote to the caller's scenario")
	}
	el, local := rep.Results[Edgelimit], rep.Results[LocalOnly]
	if 4*el.WorstOvershoot > local.WorstOvershoot {
		t.Errorf("with 25%% loss, edgelimit worst overshoot %d is not far below local-only's %d", el.WorstOvershoot, local.WorstOvershoot)
	}
}

func TestFixedWindowRuns(t *testing.T) {
	sc := load(t, "spray.yaml")
	sc.Limit.Algorithm = "fixed_window"
	rep, out := table(t, sc)
	if !bytes.Contains(out, []byte("fixed_window")) || rep.Results[Edgelimit].Decisions == 0 {
		t.Fatalf("fixed_window run:\n%s", out)
	}
}
