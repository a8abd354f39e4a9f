// Command edgelimit is the edge rate limiter: one binary whose subcommands run
// a point of presence (pop) and drive one with load (load). It only parses
// flags and wires packages together.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

const usage = `edgelimit — an edge / multi-region rate limiter

Usage:
  edgelimit pop  [flags]   run a point of presence: the HTTP check API
  edgelimit demo [flags]   a local multi-region deployment: NATS per region, PoPs as processes
  edgelimit sim [-seed N] [--json] [--html FILE] SCENARIO.yaml
                           simulate a multi-region scenario; report overshoot per strategy
  edgelimit load [flags]   drive a PoP's check API with load and report req/s and latency
  edgelimit probe [--listen ADDR] [--path /healthz]
                           ask a PoP on this machine whether it is alive (exit 0 on 200)
  edgelimit natsconf --topology T --keys DIR
                           write one NATS nkey per PoP and the servers' permission blocks
  edgelimit baseline [--listen ADDR]
                           serve a trivial HTTP handler: the machine's ceiling for 'load'
  edgelimit version         print the version and the commit it was built from
  edgelimit help [command] show help

Run 'edgelimit <command> --help' for a command's flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch cmd, rest := args[0], args[1:]; cmd {
	case "pop":
		err = runPop(rest, stdout, stderr)
	case "demo":
		err = runDemo(rest, stdout, stderr)
	case "sim":
		err = runSim(rest, stdout, stderr)
	case "load":
		err = runLoad(rest, stdout)
	case "probe":
		err = runProbe(rest, stdout, stderr)
	case "natsconf":
		err = runNatsconf(rest, stdout, stderr)
	case "baseline":
		err = runBaseline(rest, stderr)
	case "version":
		err = runVersion(rest, stdout)
	case "help", "-h", "--help":
		if len(rest) > 0 {
			return run([]string{rest[0], "--help"}, stdout, stderr)
		}
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "edgelimit: unknown command %q; see 'edgelimit help'\n", cmd)
		return 2
	}
	var help *helpRequest
	var bad *usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &help):
		printUsage(help.fs, stdout)
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &bad):
		fmt.Fprintf(stderr, "edgelimit %s: %s; see 'edgelimit %s --help'\n", args[0], bad.msg, args[0])
		return 2
	case errors.Is(err, errUsage):
		return 2
	}
	fmt.Fprintf(stderr, "edgelimit %s: %v\n", args[0], err)
	return 1
}
