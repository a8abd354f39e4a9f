package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/simulate"
)

const simUsage = `Usage: edgelimit sim [-seed N] [--direct] [--json] [--html FILE] SCENARIO.yaml

Runs a scenario (simulate/scenarios/ has examples) on a virtual clock with the
real decision engine, CRDT code, mitigation bits and replication core, once per
strategy (edgelimit; async-sync, the plain asynchronous baseline; local-only;
static split; centralized), and grades every decision against an exact per-key
oracle: overshoot, wrong decisions, denials of well-behaved clients, time to
first denial, bit delay, convergence after a partition, and messages and bytes
on the wire.
The same scenario and seed give a byte-identical report; the report prints
its seed, and -seed N replays another. --html FILE also writes the report as
one self-contained HTML page with charts of the admitted rate against the
limit and of the overshoot per window. While it runs, a progress bar is drawn
on stderr when stderr is a terminal.

Flags:
`

func runSim(args []string, stdout, stderr io.Writer) error {
	return runSimTo(args, stdout, stderr, isTerminal(stderr))
}

// runSimTo is runSim with the decision whether stderr is a terminal, where
// the progress bar goes, made by the caller.
func runSimTo(args []string, stdout, stderr io.Writer, tty bool) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	seed := fs.Uint64("seed", 0, "random seed (0: the scenario's own)")
	asJSON := fs.Bool("json", false, "print the report as JSON instead of a table")
	htmlFile := fs.String("html", "", "also write the report as an HTML page with charts to `FILE`")
	direct := fs.Bool("direct", false, "give edgelimit's PoPs a direct path to the other regions, as edgelimit pop --nats-direct does\n(the scenario's direct: true)")
	consistency := fs.String("consistency", "", "run the replicated strategies' limit as `eventual`, bounded or strong, whatever the scenario's\nlimit.consistency says (empty: the scenario's)")
	var wait optionalDuration
	fs.Var(&wait, "bounded-wait", "how long a check a bounded limit denied waits for allowance on its way, as edgelimit pop\n--bounded-wait (default: the scenario's bounded_wait, else the PoP's default 250ms; 0: never wait)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), simUsage)
		fs.PrintDefaults()
	}
	if err := parseArgs(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return &usageError{fmt.Sprintf("want one scenario file, got %d arguments", fs.NArg())}
	}
	sc, err := simulate.LoadScenario(fs.Arg(0))
	if err != nil {
		return err
	}
	if *seed != 0 {
		sc.Seed = *seed
	}
	sc.Direct = sc.Direct || *direct
	if *consistency != "" {
		sc.Limit.Consistency = *consistency
	}
	if wait.set {
		sc.BoundedWait = &wait.d
	}
	// Open the page's file before the run, so that a path that cannot be
	// written fails at once rather than after the simulation.
	var page *os.File
	if *htmlFile != "" {
		if page, err = os.Create(*htmlFile); err != nil {
			return fmt.Errorf("--html: cannot write the report: %w", err)
		}
		defer page.Close()
	}
	name := sc.Name
	if name == "" {
		name = strings.TrimSuffix(filepath.Base(fs.Arg(0)), filepath.Ext(fs.Arg(0)))
	}
	bar := newProgress(stderr, tty, "sim "+name)
	var opt simulate.Options
	if bar != nil {
		opt.Progress = bar.update
	}
	rep, err := simulate.RunWith(sc, opt)
	bar.finish()
	if err != nil {
		if page != nil {
			page.Close()
			os.Remove(page.Name()) // it was created empty for this run
		}
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = rep.WriteTable(stdout)
	}
	if err != nil || page == nil {
		return err
	}
	if err := rep.WriteHTML(page); err != nil {
		return fmt.Errorf("--html: writing the report: %w", err)
	}
	if err := page.Close(); err != nil {
		return fmt.Errorf("--html: writing the report: %w", err)
	}
	return nil
}

// optionalDuration is a duration flag that knows whether it was set.
type optionalDuration struct {
	d   time.Duration
	set bool
}

func (o *optionalDuration) String() string {
	if !o.set {
		return ""
	}
	return o.d.String()
}

func (o *optionalDuration) Set(v string) error {
	d, err := time.ParseDuration(v)
	if err != nil {
		return err
	}
	if d < 0 {
		return fmt.Errorf("must be >= 0, got %v", d)
	}
	o.d, o.set = d, true
	return nil
}
