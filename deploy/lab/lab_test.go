package lab

import (
	"context"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/deploy/lab/faultnet"
	"github.com/edgelimit/edgelimit/pop/loadgen"
	"github.com/edgelimit/edgelimit/simulate"
)

func loadScenario(t *testing.T, name string) simulate.Scenario {
	t.Helper()
	sc, err := simulate.LoadScenario(filepath.Join("..", "..", "simulate", "scenarios", name))
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// TestPlan lays out partition.yaml: hosts per region on their subnets, one
// relay per hub server with the scenario's link, loads splitting the random
// source evenly, and the cut on the side that is not the hub.
func TestPlan(t *testing.T) {
	sc := Shrink(loadScenario(t, "partition.yaml"), 1, 15*time.Second)
	if sc.Duration != 15*time.Second || sc.Partitions[0].Start != 5*time.Second || sc.Partitions[0].End != 10*time.Second {
		t.Fatalf("Shrink to 15s: duration %v, partition %v–%v; want 15s, 5s–10s", sc.Duration, sc.Partitions[0].Start, sc.Partitions[0].End)
	}
	p, err := NewPlan(sc, Layout{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Topology != "us=us-east;eu=eu-west" {
		t.Errorf("topology %q", p.Topology)
	}
	if got := p.Regions[1].NATS[2].IP; got != "10.213.2.12" {
		t.Errorf("nats-eu-3 at %s, want 10.213.2.12", got)
	}
	if got := p.Regions[1].PoPs[0].IP; got != "10.213.2.13" {
		t.Errorf("eu-west at %s, want 10.213.2.13", got)
	}
	if len(p.Links) != NATSPerRegion {
		t.Fatalf("%d relays, want one per hub server (%d)", len(p.Links), NATSPerRegion)
	}
	l := p.Links[1]
	if l.Listen != "10.214.2.1:7423" || l.Target != "10.213.1.11:7422" || l.Link.Delay != 40*time.Millisecond ||
		l.Link.Jitter != 5*time.Millisecond || l.Link.Loss != 0.005 {
		t.Errorf("relay to nats-us-2: %+v", l)
	}
	if len(p.Loads) != 2 || p.Loads[0].Rate != 1500 || p.Loads[1].Rate != 1500 {
		t.Errorf("loads %+v, want 2 × 1500/s", p.Loads)
	}
	if got := p.cutRegion(sc.Partitions[0]); got != "eu" {
		t.Errorf("cut region %s, want eu (us is the hub)", got)
	}
	for _, bad := range []string{"skew.yaml", "mix.yaml"} {
		if _, err := NewPlan(loadScenario(t, bad), Layout{}); err == nil {
			t.Errorf("NewPlan(%s) accepted a scenario the lab cannot run", bad)
		}
	}
}

// TestPlanLayout lays out partition.yaml (one PoP per region) with its PoPs
// on Redis, two servers each on the PoP's one redis-server, both taking
// traffic; mixed puts the first PoP on Redis and the next on the embedded
// store; bounded is refused on a layout with Redis PoPs, saying so.
func TestPlanLayout(t *testing.T) {
	sc := Shrink(loadScenario(t, "partition.yaml"), 1, 15*time.Second)
	p, err := NewPlan(sc, Layout{Store: StoreRedis, Servers: 2})
	if err != nil {
		t.Fatal(err)
	}
	us := p.Regions[0]
	want := []Host{
		{Name: "us-east", NS: "elab-pop-us-east", IP: "10.213.1.14", PoP: "us-east", Redis: "10.213.1.13:6379"},
		{Name: "us-east-s2", NS: "elab-pop-us-east-s2", IP: "10.213.1.15", PoP: "us-east", Redis: "10.213.1.13:6379"},
	}
	if len(us.PoPs) != 2 || us.PoPs[0] != want[0] || us.PoPs[1] != want[1] {
		t.Errorf("us's servers %+v, want %+v", us.PoPs, want)
	}
	if len(us.Redis) != 1 || us.Redis[0].Name != "redis-us-east" || us.Redis[0].IP != "10.213.1.13" {
		t.Errorf("us's redis-servers %+v, want redis-us-east at 10.213.1.13", us.Redis)
	}
	if len(p.Loads) != 4 {
		t.Fatalf("loads %+v, want one per server (4)", p.Loads)
	}
	for _, lp := range p.Loads {
		if lp.Rate != 750 {
			t.Errorf("load at %s: %v/s, want 3000/4", lp.PoP.Name, lp.Rate)
		}
	}
	if p.Topology != "us=us-east;eu=eu-west" {
		t.Errorf("topology %q names servers, want PoPs", p.Topology)
	}

	m, err := NewPlan(sc, Layout{Store: StoreMixed, Servers: 2})
	if err != nil {
		t.Fatal(err)
	}
	if eu := m.Regions[1]; len(m.Regions[0].PoPs) != 2 || len(eu.PoPs) != 1 || len(eu.Redis) != 0 || eu.PoPs[0].Redis != "" {
		t.Errorf("mixed: us %+v, eu %+v; want us-east on Redis with 2 servers, eu-west embedded with 1", m.Regions[0].PoPs, eu.PoPs)
	}

	sc.Limit.Consistency = "bounded"
	for _, st := range []string{StoreRedis, StoreMixed} {
		_, err := NewPlan(sc, Layout{Store: st, Servers: 2})
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "refuses a bounded limit") {
			t.Errorf("bounded on %s: %v; want ErrUnsupported saying a PoP on Redis refuses it", st, err)
		}
	}
	if _, err := NewPlan(sc, Layout{Store: StoreEmbedded}); err != nil {
		t.Errorf("bounded on embedded PoPs: %v", err)
	}
}

// TestPlanDirect lays out anycast.yaml (2 regions × 2 PoPs) with direct
// paths: every PoP gets a relay of its own per server of the other region,
// on its own region's wan address, to that server's client port, with the
// link between the two regions; its --nats-direct names them. Without
// Scenario.Direct there are none.
func TestPlanDirect(t *testing.T) {
	sc := loadScenario(t, "anycast.yaml")
	sc.Duplicate = 0 // TCP delivers once: the lab refuses duplicates
	p, err := NewPlan(sc, Layout{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Direct) != 0 || p.DirectFlag("us-east") != "" {
		t.Fatalf("direct relays %+v without Scenario.Direct", p.Direct)
	}
	sc.Direct = true
	if p, err = NewPlan(sc, Layout{}); err != nil {
		t.Fatal(err)
	}
	if want := 4 * NATSPerRegion; len(p.Direct) != want {
		t.Fatalf("%d direct relays, want one per (PoP, other region's server): %d", len(p.Direct), want)
	}
	us2eu := faultnet.Link{Delay: 40 * time.Millisecond, Jitter: 5 * time.Millisecond, Loss: 0.01}
	for _, c := range []struct {
		i              int
		pop, from, to  string
		listen, target string
	}{
		{0, "us-east", "us", "eu", "10.214.1.1:14222", "10.213.2.10:4222"},
		{2, "us-east", "us", "eu", "10.214.1.1:14224", "10.213.2.12:4222"},
		{3, "us-west", "us", "eu", "10.214.1.1:14225", "10.213.2.10:4222"},
		{6, "eu-west", "eu", "us", "10.214.2.1:14222", "10.213.1.10:4222"},
		{11, "eu-central", "eu", "us", "10.214.2.1:14227", "10.213.1.12:4222"},
	} {
		d := p.Direct[c.i]
		if d.PoP != c.pop || d.From != c.from || d.To != c.to || d.Listen != c.listen || d.Target != c.target || d.Link != us2eu {
			t.Errorf("direct relay %d: %+v, want %s of %s on %s to %s (%s) with %+v", c.i, d, c.pop, c.from, c.listen, c.target, c.to, us2eu)
		}
	}
	listens := map[string]bool{}
	for _, d := range p.Direct {
		if listens[d.Listen] {
			t.Errorf("two relays listen on %s: each PoP's direct connection must be a stream of its own", d.Listen)
		}
		listens[d.Listen] = true
	}
	for _, l := range p.Links {
		if listens[l.Listen] {
			t.Errorf("a direct relay listens on leaf relay %s", l.Listen)
		}
	}
	if got, want := p.DirectFlag("eu-central"), "us=nats://10.214.2.1:14225,nats://10.214.2.1:14226,nats://10.214.2.1:14227"; got != want {
		t.Errorf("eu-central's --nats-direct %q, want %q", got, want)
	}
}

// TestHubRouted: the simulator's copy of a lab run with more than two
// regions routes leaf to leaf through the hub, as the lab's network does.
func TestHubRouted(t *testing.T) {
	sc, err := HubRouted(loadScenario(t, "world.yaml")) // us-east is the hub
	if err != nil {
		t.Fatal(err)
	}
	get := func(a, b string) simulate.Link {
		t.Helper()
		l, err := find(sc, a, b)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	if l := get("eu", "us-east"); l.Ms != 75 || l.JitterMs != 5 || l.Loss != nil {
		t.Errorf("eu–us-east (a leg to the hub) changed: %+v", l)
	}
	if l := get("eu", "ap"); l.Ms != 75+120 || l.JitterMs != 5+10 || l.Loss == nil || math.Abs(*l.Loss-(1-0.99*0.99)) > 1e-12 {
		t.Errorf("eu–ap: %+v, want 195 ms ± 15 over two links of 1%% loss", l)
	}
	if l := get("ap", "ap"); l.Ms != 5 {
		t.Errorf("inside ap: %+v, want the scenario's 5 ms", l)
	}
	// A cut between two leaf regions is a leaf cut from the hub: from
	// every other region.
	in := loadScenario(t, "world.yaml")
	in.Partitions = []simulate.Partition{{From: "eu", To: "ap", Start: time.Second, End: 2 * time.Second}}
	if sc, err = HubRouted(in); err != nil {
		t.Fatal(err)
	}
	if len(sc.Partitions) != 4 {
		t.Fatalf("partitions %+v, want eu cut from the 4 other regions", sc.Partitions)
	}
	for _, p := range sc.Partitions {
		if p.From != "eu" || p.To == "eu" || p.Start != time.Second || p.End != 2*time.Second {
			t.Errorf("partition %+v", p)
		}
	}
	// Two regions: nothing to route.
	two := loadScenario(t, "partition.yaml")
	if got, _ := HubRouted(two); len(got.Latency) != len(two.Latency) || len(got.Partitions) != len(two.Partitions) {
		t.Errorf("two regions changed: %+v", got)
	}
}

// TestWindows adds two loads' timelines into windows of one second and
// grades them as the simulator's oracle does.
func TestWindows(t *testing.T) {
	t0 := time.Unix(1000, 0)
	reps := []loadgen.Report{
		{Timeline: []loadgen.Second{{Unix: 999, Allowed: 5}, {Unix: 1000, Allowed: 600, Denied: 10}, {Unix: 1001, Allowed: 400}}},
		{Timeline: []loadgen.Second{{Unix: 1000, Allowed: 500, Denied: 90}, {Unix: 1003, Allowed: 7}}},
	}
	r := Report{Limit: 1000, Window: time.Second, Windows: windows(reps, t0, time.Second, 3*time.Second)}
	r.summarize()
	want := []Window{{0, 1200, 1100}, {time.Second, 400, 400}, {2 * time.Second, 0, 0}}
	for i, w := range want {
		if r.Windows[i] != w {
			t.Errorf("window %d: %+v, want %+v", i, r.Windows[i], w)
		}
	}
	if r.MeanExcessPct != 5 || r.WorstExcessPct != 10 || r.Admitted != 1500 || r.Offered != 1600 {
		t.Errorf("mean %v%% worst %v%% admitted %d offered %d; want 5, 10, 1500, 1600", r.MeanExcessPct, r.WorstExcessPct, r.Admitted, r.Offered)
	}
	if r.MeanShortPct != 0 || r.WorstShortPct != 0 {
		t.Errorf("short %v%%/%v%% where every window admitted its offered traffic or the limit", r.MeanShortPct, r.WorstShortPct)
	}
	// A window offered more than the limit that admitted less is short by
	// the difference; one offered less, by what it denied.
	s := Report{Limit: 1000, Window: time.Second, Windows: []Window{{0, 1200, 300}, {time.Second, 500, 400}, {2 * time.Second, 0, 0}}}
	s.summarize()
	if s.WorstShortPct != 70 || s.MeanShortPct != 40 {
		t.Errorf("short mean %v%% worst %v%%; want 40 (of 70 and 10), 70", s.MeanShortPct, s.WorstShortPct)
	}
}

// TestLabShort runs partition.yaml, one PoP per region, in 15 s on real
// sites — us-east on its redis-server, eu-west on the embedded store — and
// then the burst and the alternating client: the traffic must be limited, both sides must shrink to their share
// during the cut and restore it after, the faults must pass, the measured
// mean excess must stay near the simulator's, and nothing may be left
// behind. It needs root and ip; it skips without them, except under CI=true,
// where it fails.
func TestLabShort(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real sites for about a minute; skipped with -short")
	}
	_, ipErr := exec.LookPath("ip")
	if os.Geteuid() != 0 || ipErr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true: the lab needs root and ip (euid %d, ip: %v)", os.Geteuid(), ipErr)
		}
		t.Skipf("needs root and ip (euid %d, ip: %v)", os.Geteuid(), ipErr)
	}
	redis, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true: the lab's Redis PoPs need redis-server: %v", err)
		}
		t.Skipf("needs redis-server for its Redis PoPs: %v", err)
	}
	sc := Shrink(loadScenario(t, "partition.yaml"), 1, 15*time.Second)
	// us-east on its own Redis, eu-west embedded.
	plan, err := NewPlan(sc, Layout{Store: StoreMixed, Servers: 1})
	if err != nil {
		t.Fatal(err)
	}
	root, _ := filepath.Abs(filepath.Join("..", ".."))
	dir := t.TempDir()
	bin, natsBin, err := Build(context.Background(), root, dir)
	if err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	rep, err := Run(context.Background(), Config{Plan: plan, Root: root, Edgelimit: bin, NATSServer: natsBin, RedisServer: redis,
		Dir: dir, Log: &log, Faults: true, Shapes: []string{ShapeBurst, ShapeAlternate}})
	t.Log(log.String())
	if err != nil {
		t.Fatal(err)
	}
	if left := Leftovers(); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	simRep, err := simulate.Run(sc)
	if err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	rep.WriteTable(&table, &simRep)
	t.Log("\n" + table.String())

	if rep.Admitted == 0 || rep.Admitted >= rep.Offered {
		t.Errorf("admitted %d of %d: want traffic limited (3× the limit offered)", rep.Admitted, rep.Offered)
	}
	for i, w := range rep.Windows {
		if w.Offered == 0 {
			t.Errorf("window %d (%v) had no traffic", i, w.Start)
		}
	}
	for _, p := range rep.Partitions {
		if p.Reduced < 0 || p.Restored < 0 {
			t.Errorf("cut of %s: share reduced after %v, restored after %v; want both", p.Region, p.Reduced, p.Restored)
		}
	}
	for _, f := range rep.Faults {
		if !f.OK {
			t.Errorf("fault %s: %s", f.What, f.Detail)
		}
	}
	// The shapes, graded both ways: every check answered and in the
	// ledger; an eventual global limit offered 3× (the burst) or exactly
	// its limit (the alternating client) admits at most 2% of the limit
	// short of what the exact log admits, on the Redis PoP as on the
	// embedded one. Over-admission is logged beside the simulator's, not asserted:
	// a loaded machine holds news back past the bound's staleness.
	if len(rep.Shapes) != 2 {
		t.Fatalf("shapes %+v, want burst and alternate", rep.Shapes)
	}
	for _, s := range rep.Shapes {
		want := map[string]int{ShapeBurst: BurstChecks, ShapeAlternate: AlternateChecks}[s.Shape]
		var offered, short int64
		for _, r := range s.Rows {
			offered += r.Offered
			short += r.Short()
		}
		if s.Errors > 0 || s.Checks != want || offered != int64(want) {
			t.Errorf("shape %s: %d checks answered, %d errors, %d in the ledger; want %d answered and graded", s.Shape, s.Checks, s.Errors, offered, want)
		}
		if pct(short, ShapeLimit) > 2 {
			t.Errorf("shape %s: admitted %d of %d, %d short of what the exact log admits (%.1f%% of the limit)", s.Shape, s.Admitted, s.Checks, short, pct(short, ShapeLimit))
		}
	}
	var simMean float64
	for _, r := range simRep.Results {
		if r.Strategy == simulate.Edgelimit.String() {
			simMean = 100 * r.MeanWindowExcess / float64(simRep.Limit)
		}
	}
	// Issue 11's goal is ±2 points; a shared CI machine's scheduling adds
	// replication lag the simulator does not have, so the test holds the
	// lab to a looser bound that still catches a broken link or limit.
	if d := math.Abs(rep.MeanExcessPct - simMean); d > 10 {
		t.Errorf("mean excess per window: measured %.2f%%, simulated %.2f%%: %.1f points apart", rep.MeanExcessPct, simMean, d)
	}
}
