// Command soak runs edgelimit's soak: 2 regions × 2 PoPs, NATS and Redis on
// loopback, mixed load with PoP kill -9s, Redis and NATS restarts, and a
// ledger of every decision checked against the documented bounds. It exits 1
// when a bound was broken, 2 when the soak could not run. See
// deploy/soak/README.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/edgelimit/edgelimit/deploy/soak"
)

func main() {
	var cfg soak.Config
	flag.StringVar(&cfg.Root, "root", ".", "the edgelimit module's root")
	flag.StringVar(&cfg.Dir, "dir", "", "work directory: data, logs, decisions.csv, faults.csv (default: a new temporary one)")
	flag.DurationVar(&cfg.Duration, "duration", 10*time.Minute, "how long the load runs")
	flag.DurationVar(&cfg.FaultEvery, "fault-every", 20*time.Second, "time between two faults")
	flag.IntVar(&cfg.Limit, "limit", 50, "every limit's quota per window")
	flag.DurationVar(&cfg.Window, "window", 10*time.Second, "every limit's window (whole seconds)")
	flag.IntVar(&cfg.HotKeys, "hot-keys", 4, "keys per limit offered -overload times their limit")
	flag.IntVar(&cfg.TailKeys, "tail-keys", 40, "keys per limit offered 5-50% of their limit")
	flag.Float64Var(&cfg.Overload, "overload", 4, "hot keys' offered load over their limit")
	flag.Uint64Var(&cfg.Seed, "seed", 1, "random seed of the load")
	verbose := flag.Bool("v", false, "also list every window over its limit, with its bound")
	flag.StringVar(&cfg.Edgelimit, "edgelimit", "", "a built edgelimit binary (default: build one into -dir)")
	flag.StringVar(&cfg.NATSServer, "nats-server", "", "a built nats-server binary, 2.10.14 or later (with -edgelimit)")
	recheck := flag.String("ledger", "", "compute the ledger again from a run's directory (decisions.csv, faults.csv) instead of running")
	faults := flag.String("faults", strings.Join(soak.DefaultFaults, ","), "the cycle of faults, comma-separated, of "+strings.Join(soak.FaultKinds, ", ")+"; empty: none")
	flag.Parse()
	cfg.Faults = []string{}
	if *faults != "" {
		cfg.Faults = strings.Split(*faults, ",")
	}
	if *recheck != "" {
		led, err := soak.Recheck(*recheck, cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, "soak:", err)
			os.Exit(2)
		}
		report(led, *verbose)
		return
	}
	if cfg.Dir == "" {
		d, err := os.MkdirTemp("", "edgelimit-soak-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "soak:", err)
			os.Exit(2)
		}
		cfg.Dir = d
	}
	cfg.Log = os.Stderr
	fmt.Fprintln(os.Stderr, "soak: work directory", cfg.Dir)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	led, err := soak.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	report(led, *verbose)
}

// report prints the ledger and exits 1 on a violation.
func report(led *soak.Ledger, verbose bool) {
	led.Print(os.Stdout)
	if verbose {
		led.PrintOverLimit(os.Stdout)
	}
	if len(led.Violations) > 0 {
		os.Exit(1)
	}
}
