// Command lab runs a scenario of `edgelimit sim` on real sites in network
// namespaces (package deploy/lab) and prints what it measured beside what
// the simulator predicts for the same scenario. It needs root.
//
//	go run ./deploy/lab/cmd/lab [-scenario simulate/scenarios/partition.yaml] [-pops-per-region N] [-duration D] [-direct]
//	    [-store redis|embedded|mixed] [-servers N] [-shapes paced,burst,alternate] [-consistency eventual|bounded]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/edgelimit/edgelimit/deploy/lab"
	"github.com/edgelimit/edgelimit/simulate"
)

const usage = `usage: go run ./deploy/lab/cmd/lab [flags]   (as root; make lab)

Runs an edgelimit sim scenario on real sites: every NATS server (3 per
region, from deploy/nats) and every PoP (from deploy/systemd/pop.yaml) a
host in its own network namespace, the links between regions delayed,
jittered and lossy as the scenario says, its partitions made by taking a
region's link down. Every PoP counts in its own redis-server, its servers
(-servers, 2) sharing it under the PoP's name, as deploy/ ships it; -store
embedded gives every PoP the embedded store, -store mixed puts every other
PoP on Redis. With -direct (or the scenario's direct: true) every PoP
also runs --nats-direct to the other regions' servers, each connection
through a relay of its own with the scenario's link. Traffic comes from
edgelimit load inside the PoPs' namespaces. Then the traffic shapes
(-shapes): paced checks, a burst of 300 in 0.1 s over every PoP server, and
one client alternating two PoPs of two regions, on a global limit of 100 per
hour of consistency -consistency, each decision graded against the exact
sliding log (over-admission, beyond the stated bound, under-admission) beside
the simulator's run of the same shape. Then, with -faults, a PoP is killed with kill -9 and restarted,
and a hub NATS server stopped. Everything is torn down at the end, on error
and on Ctrl-C. The report sets the measured windows and figures beside
edgelimit sim's for the same scenario (written to DIR/scenario.yaml).

flags:
`

func main() {
	scenario := flag.String("scenario", "simulate/scenarios/partition.yaml", "scenario file (simulate/scenarios/*.yaml)")
	perRegion := flag.Int("pops-per-region", 0, "keep at most this many PoPs per region (0: all)")
	duration := flag.Duration("duration", 0, "scale the scenario's times to this length (0: as written)")
	faults := flag.Bool("faults", true, "after the scenario, kill -9 and restart a PoP and stop a hub NATS server")
	dir := flag.String("dir", "", "directory for configs, data and logs (default: a new one under the system's temp dir)")
	prom := flag.String("prometheus", "", "prometheus `binary`: scrape the PoPs with deploy/prometheus's files, evaluate the Grafana dashboard's queries, and cut a region until the partition alert fires and resolves (about 2 minutes more)")
	teardown := flag.Bool("teardown", false, "only remove what an earlier run left behind, and exit")
	direct := flag.Bool("direct", false, "give every PoP direct paths to the other regions' NATS servers (--nats-direct), each through relays of its own\nwith the scenario's links, and simulate them (--direct); -direct=false turns off a scenario's direct: true (default: the scenario's direct)")
	store := flag.String("store", lab.StoreRedis, "PoPs' store: redis (each PoP its own redis-server, as deploy/ ships), embedded, or mixed (every other PoP on Redis)")
	servers := flag.Int("servers", 2, "servers per Redis PoP, under the PoP's name on its one Redis, all taking traffic")
	shapes := flag.String("shapes", "all", "traffic shapes after the scenario: paced, burst, alternate (comma-separated), all, or \"\" for none")
	consistency := flag.String("consistency", "eventual", "the shapes' global limit's consistency: eventual, or bounded (embedded PoPs only: -store embedded)")
	gap := flag.Duration("alternate-gap", 0, "the alternating client's wait after each answer, standing for its round trip to a PoP (0: back to back)")
	flag.Usage = func() { fmt.Fprint(os.Stderr, usage); flag.PrintDefaults() }
	flag.Parse()
	// -direct, when given, overrides the scenario's field either way.
	var forceDirect *bool
	flag.Visit(func(f *flag.Flag) {
		if f.Name == "direct" {
			forceDirect = direct
		}
	})
	lay := lab.Layout{Store: *store, Servers: *servers}
	sh, err := lab.ParseShapes(*shapes)
	if err == nil && *consistency != "eventual" && *consistency != "bounded" {
		err = fmt.Errorf("-consistency %q: want eventual or bounded", *consistency)
	}
	if err == nil {
		err = lab.BoundedOn(lay, *consistency)
	}
	if err == nil {
		err = run(*scenario, *perRegion, *duration, forceDirect, lay, sh, *consistency, *gap, *faults, *prom, *dir, *teardown)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lab:", err)
		os.Exit(1)
	}
}

// run runs the lab; direct, when not nil, sets the scenario's Direct.
func run(scenario string, perRegion int, duration time.Duration, direct *bool, lay lab.Layout, shapes []string, consistency string, gap time.Duration, faults bool, prom, dir string, teardownOnly bool) error {
	if teardownOnly {
		return lab.Teardown()
	}
	if perRegion < 0 || duration < 0 {
		return fmt.Errorf("-pops-per-region and -duration must be ≥ 0, got %d and %v", perRegion, duration)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" || strings.TrimSpace(string(out)) == os.DevNull {
		return fmt.Errorf("run from inside the edgelimit module (go env GOMOD: %q, %v)", out, err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	sc, err := simulate.LoadScenario(scenario)
	if err != nil {
		return err
	}
	sc = lab.Shrink(sc, perRegion, duration)
	if direct != nil {
		sc.Direct = *direct
	}
	// The simulator runs the network the lab builds: through the hub.
	if sc, err = lab.HubRouted(sc); err != nil {
		return err
	}
	plan, err := lab.NewPlan(sc, lay)
	if err != nil {
		return err
	}
	if dir == "" {
		if dir, err = os.MkdirTemp("", "edgelimit-lab-"); err != nil {
			return err
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	scFile := filepath.Join(dir, "scenario.yaml")
	if err := lab.WriteScenario(scFile, sc); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "lab: building edgelimit and nats-server into %s\n", dir)
	bin, natsBin, err := lab.Build(ctx, root, dir)
	if err != nil {
		return err
	}
	redis, _ := exec.LookPath("redis-server") // Run says so when the layout needs it
	rep, err := lab.Run(ctx, lab.Config{Plan: plan, Root: root, Edgelimit: bin, NATSServer: natsBin, RedisServer: redis,
		Shapes: shapes, Consistency: consistency, AlternateGap: gap,
		Dir: dir, Log: os.Stderr, Faults: faults, Prometheus: prom, AlertPhase: prom != ""})
	if err != nil {
		return fmt.Errorf("%w (logs in %s)", err, dir)
	}
	fmt.Fprintf(os.Stderr, "lab: simulating the same scenario (%s %s)\n", bin, "sim "+scFile)
	simRep, err := simulate.Run(sc)
	if err != nil {
		return err
	}
	fmt.Printf("same scenario in the simulator: edgelimit sim %s\n", scFile)
	if err := rep.WriteTable(os.Stdout, &simRep); err != nil {
		return err
	}
	for _, f := range rep.Faults {
		if !f.OK {
			return fmt.Errorf("fault %q: %s", f.What, f.Detail)
		}
	}
	return nil
}
