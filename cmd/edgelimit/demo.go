package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/edgelimit/edgelimit/replication"
)

const demoUsage = `Usage: edgelimit demo [flags]

Starts a local multi-region deployment on loopback: one NATS server with
JetStream per region (the first region is the hub; the others connect to it as
leaf nodes, each region its own JetStream domain, as deploy/nats/ configures
production), and PoPs as separate 'edgelimit pop' processes, each connected to
its region's NATS server. Once every PoP is ready, prints one line per PoP:

  <region> <pop> <check URL> [<admin URL>]

The default rules, deploy/examples/demo.yaml, hold a limit counted across
every PoP (user, 10 an hour) and one across a region's (team, 5 an hour); the
README's "A local multi-region demo" walks through them.

With --quotas postgres://…, every PoP follows the same PostgreSQL quota store
(each region's PoPs read it directly; see docs/tenants.md).

Ctrl-C stops everything cleanly.

Flags:
`

func runDemo(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var rules listFlag
	rules.values = []string{"deploy/examples/demo.yaml"}
	fs.Var(&rules, "rules", "rule `files or directories`, as for pop")
	regions := fs.String("regions", "eu,us,ap", "regions, comma-separated; the first is the NATS hub")
	perRegion := fs.Int("pops", 2, "PoPs per region")
	basePort := fs.Int("base-port", 8081, "the first PoP's HTTP port; the others count up")
	dataDir := fs.String("data", "./data/demo", "data `directory` (a sub-directory per NATS server and PoP)")
	flush := fs.Duration("flush-interval", 100*time.Millisecond, "how often each PoP publishes what it counted")
	level := fs.String("log-level", "warn", "log level of the PoPs and NATS servers")
	quotas := fs.String("quotas", "embedded", "tenant quota store of every PoP: embedded (each PoP its own) or a PostgreSQL `URL` they share")
	adminToken := fs.String("admin-token-file", "", "with it, every PoP serves the admin API (on a free port, printed after its check URL) with the bearer token in this `file`")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), demoUsage)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, nil); err != nil {
		return err
	}
	names := strings.Split(*regions, ",")
	if len(names) == 0 || names[0] == "" || *perRegion < 1 {
		return errors.New("want at least one region and one PoP per region")
	}
	log, err := newLogger(stderr, *level, "text")
	if err != nil {
		return err
	}
	if err := checkPorts(*basePort, len(names)**perRegion); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}

	// The topology every PoP shares.
	var topo []string
	for _, r := range names {
		var pops []string
		for i := 1; i <= *perRegion; i++ {
			pops = append(pops, fmt.Sprintf("%s-%d", r, i))
		}
		topo = append(topo, r+"="+strings.Join(pops, ","))
	}
	topology := strings.Join(topo, ";")

	// One NATS server per region: the hub accepts leaf connections.
	var servers []*server.Server
	defer func() {
		for _, s := range servers {
			s.Shutdown()
		}
	}()
	urls := map[string]string{}
	var hubLeaf string
	for i, r := range names {
		// The PoPs are other processes: the demo's servers take
		// anonymous clients, on loopback (a demo, not a deployment).
		cfg := replication.ServerConfig{Name: "nats-" + r, Dir: filepath.Join(*dataDir, "nats-"+r), Port: -1, Domain: r,
			Anonymous: true, Logger: log.With("nats", r)}
		if i == 0 {
			leafPort, err := freePort()
			if err != nil {
				return err
			}
			cfg.Leaf = &replication.LeafConfig{Port: leafPort}
			hubLeaf = fmt.Sprintf("nats-leaf://127.0.0.1:%d", leafPort)
		} else {
			cfg.Leaf = &replication.LeafConfig{Remotes: [][]string{{hubLeaf}}}
		}
		s, err := replication.StartServer(cfg)
		if err != nil {
			return fmt.Errorf("NATS for %s: %w", r, err)
		}
		servers = append(servers, s)
		if err := replication.WaitReady(s, 10*time.Second); err != nil {
			return fmt.Errorf("NATS for %s: %w", r, err)
		}
		urls[r] = s.ClientURL()
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	type child struct {
		cmd  *exec.Cmd
		done chan error
	}
	var children []child
	var lines []string // "<region> <pop> <check URL> [<admin URL>]", printed once every PoP is ready
	port := *basePort
	for _, r := range names {
		for i := 1; i <= *perRegion; i++ {
			pop := fmt.Sprintf("%s-%d", r, i)
			addr := fmt.Sprintf("127.0.0.1:%d", port)
			port++
			cmd := exec.Command(self, "pop",
				"--listen", addr, "--rules", strings.Join(rules.values, ","),
				"--data", filepath.Join(*dataDir, pop),
				"--region", r, "--pop", pop, "--topology", topology,
				"--nats", urls[r], "--flush-interval", flush.String(), "--log-level", *level, "--quotas", *quotas)
			adminURL := ""
			if *adminToken != "" {
				ap, err := freePort()
				if err != nil {
					return err
				}
				adminAddr := fmt.Sprintf("127.0.0.1:%d", ap)
				cmd.Args = append(cmd.Args, "--admin-listen", adminAddr, "--admin-token-file", *adminToken)
				adminURL = " http://" + adminAddr
			}
			cmd.Stdout, cmd.Stderr = stderr, stderr
			cmd.Env = demoEnv()
			if err := cmd.Start(); err != nil {
				return fmt.Errorf("PoP %s: %w", pop, err)
			}
			c := child{cmd, make(chan error, 1)}
			go func() { c.done <- cmd.Wait() }()
			children = append(children, c)
			lines = append(lines, fmt.Sprintf("%s %s http://%s%s", r, pop, addr, adminURL))
		}
	}
	exited := firstExit(children, func(c child) chan error { return c.done })
	var firstErr error
	for _, l := range lines {
		url := strings.Fields(l)[2]
		if err := waitReadyz(ctx, url, exited, time.Minute); err != nil {
			firstErr = err
			break
		}
	}
	if firstErr == nil && ctx.Err() == nil {
		for _, l := range lines {
			fmt.Fprintln(stdout, l)
		}
		log.Info("demo running; Ctrl-C stops it")
		select {
		case <-ctx.Done():
		case err := <-exited:
			firstErr = fmt.Errorf("a PoP exited: %v", err)
		}
	}
	for _, c := range children {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.After(15 * time.Second)
	for _, c := range children {
		select {
		case <-c.done:
		case <-deadline:
			_ = c.cmd.Process.Kill()
		}
	}
	slog.Debug("demo stopped")
	return firstErr
}

// checkPorts says which of the n loopback ports from base a PoP of the demo
// could not listen on, and how to choose others, before anything starts.
func checkPorts(base, n int) error {
	for port := base; port < base+n; port++ {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			return fmt.Errorf("the demo's PoPs listen on ports %d to %d, and port %d is taken (%v): "+
				"choose free ones with --base-port, e.g. --base-port %d", base, base+n-1, port, err, base+1000)
		}
		ln.Close()
	}
	return nil
}

// waitReadyz waits until url's /readyz answers 200: a PoP that has loaded
// its rules and restored its state. It gives up when a PoP exits, ctx ends,
// or after patience.
func waitReadyz(ctx context.Context, url string, exited <-chan error, patience time.Duration) error {
	deadline := time.Now().Add(patience)
	client := &http.Client{Timeout: time.Second}
	for {
		if resp, err := client.Get(url + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the PoP at %s was not ready after %v", url, patience)
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-exited:
			return fmt.Errorf("a PoP exited before it was ready: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// demoEnv is the environment of the PoPs: the demo's, without EDGELIMIT_*
// settings, which would override the flags the demo gives each PoP.
func demoEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "EDGELIMIT_") {
			env = append(env, kv)
		}
	}
	return env
}

// firstExit returns a channel that receives the error of the first child to exit.
func firstExit[T any](children []T, done func(T) chan error) <-chan error {
	out := make(chan error, len(children))
	for _, c := range children {
		go func() {
			err := <-done(c)
			done(c) <- err // put it back for the shutdown wait
			out <- err
		}()
	}
	return out
}
