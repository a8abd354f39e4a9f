package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/replication"
)

func testFlags() (*flag.FlagSet, *string, *string, *time.Duration, *listFlag) {
	fs := flag.NewFlagSet("pop", flag.ContinueOnError)
	fs.SetOutput(&bytes.Buffer{})
	listen := fs.String("listen", "127.0.0.1:8080", "")
	interval := fs.Duration("rules-interval", time.Second, "")
	rules := &listFlag{values: []string{"default.yaml"}}
	fs.Var(rules, "rules", "")
	config := fs.String("config", "", "")
	return fs, config, listen, interval, rules
}

func TestFlagPrecedence(t *testing.T) {
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "pop.yaml")
	os.WriteFile(cfgFile, []byte("listen: 0.0.0.0:1\nrules-interval: 5s\nrules: [a.yaml, b.yaml]\n"), 0o644)

	fs, config, listen, interval, rules := testFlags()
	t.Setenv("EDGELIMIT_RULES_INTERVAL", "3s")
	if err := parseFlags(fs, []string{"--config", cfgFile, "--listen", "127.0.0.1:2"}, config); err != nil {
		t.Fatal(err)
	}
	// The command line beats the file; the environment beats the file.
	if *listen != "127.0.0.1:2" || *interval != 3*time.Second || strings.Join(rules.values, ",") != "a.yaml,b.yaml" {
		t.Fatalf("listen %q interval %v rules %v", *listen, *interval, rules.values)
	}
}

func TestFlagErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("listen: x\nlisten_addr: y\n"), 0o644)
	badValue := filepath.Join(dir, "badvalue.yaml")
	os.WriteFile(badValue, []byte("rules-interval: soon\n"), 0o644)
	cases := []struct {
		name string
		args []string
		env  string
		want string
	}{
		{"unknown config key", []string{"--config", bad}, "", `bad.yaml:2: unknown setting "listen_addr"`},
		{"bad config value", []string{"--config", badValue}, "", "badvalue.yaml:1: rules-interval"},
		{"bad env value", nil, "fortnight", "EDGELIMIT_RULES_INTERVAL"},
		{"missing config", []string{"--config", filepath.Join(dir, "nope.yaml")}, "", "config file"},
		{"stray argument", []string{"extra"}, "", `unexpected argument "extra"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs, config, _, _, _ := testFlags()
			if c.env != "" {
				t.Setenv("EDGELIMIT_RULES_INTERVAL", c.env)
			}
			err := parseFlags(fs, c.args, config)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
}

func TestRunPopBadFlags(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"pop", "--max-keys", "-1", "--rules", "x.yaml"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "--max-keys must be > 0") {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	rules := filepath.Join("..", "..", "deploy", "examples", "rules.yaml")
	if code := run([]string{"pop", "--region", "eu", "--pop", "a", "--snapshot-interval", "0s", "--rules", rules, "--data", t.TempDir()}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "--snapshot-interval must be > 0") {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	if code := run([]string{"pop", "--region", "eu", "--pop", "a", "--urgent-interval", "0s", "--rules", rules, "--data", t.TempDir()}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "--urgent-interval must be > 0") {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"pop", "--region", "eu", "--pop", "a", "--unreachable-after", "-1s", "--rules", rules, "--data", t.TempDir()}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "--unreachable-after must be > 0") {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	for _, c := range [][2]string{
		{"--grpc-max-streams=0", "--grpc-max-streams must be between 1 and"},
		{"--grpc-max-conns=0", "--grpc-max-conns must be > 0"},
		{"--client-ip-header=", "--client-ip-header must be a header name"},
		{"--client-ip-header=X-Real-IP:", "--client-ip-header must be a header name"},
	} {
		errb.Reset()
		if code := run([]string{"pop", c[0], "--rules", rules, "--data", t.TempDir()}, &out, &errb); code != 1 || !strings.Contains(errb.String(), c[1]) {
			t.Fatalf("%s: exit %d, stderr %q", c[0], code, errb.String())
		}
	}
	errb.Reset()
	if code := run([]string{"pop", "--listen"}, &out, &errb); code != 2 {
		t.Fatalf("missing flag value: exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"pop", "--rules", filepath.Join(t.TempDir(), "missing.yaml")}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "missing.yaml") {
		t.Fatalf("missing rules: exit %d, stderr %q", code, errb.String())
	}
}

// edgelimit sim prints the same report for the same scenario and seed, and
// a different one for another seed.
func TestSimCommand(t *testing.T) {
	scenario := filepath.Join("..", "..", "simulate", "scenarios", "spray.yaml")
	out := func(args ...string) string {
		var stdout, stderr bytes.Buffer
		if code := run(append([]string{"sim"}, args...), &stdout, &stderr); code != 0 {
			t.Fatalf("sim %v: exit %d: %s", args, code, stderr.String())
		}
		return stdout.String()
	}
	a, b := out(scenario), out(scenario)
	if a != b || !strings.Contains(a, "seed 42") || !strings.Contains(a, "edgelimit") {
		t.Fatalf("two runs differ or miss the seed:\n%s\n%s", a, b)
	}
	if c := out("-seed", "5", scenario); c == a || !strings.Contains(c, "seed 5") {
		t.Fatalf("-seed 5 did not change the run:\n%s", c)
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"sim", "missing.yaml"}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "missing.yaml") {
		t.Fatalf("missing scenario: exit %d, %q", code, stderr.String())
	}
}

// --nats-direct names other regions of --topology, each with server URLs; a
// PoP refuses to start on anything else and says what is wrong.
func TestNatsDirectFlag(t *testing.T) {
	rules := filepath.Join("..", "..", "deploy", "examples", "rules.yaml")
	base := []string{"pop", "--region", "eu", "--pop", "a", "--topology", "eu=a;us=b;ap=c", "--rules", rules, "--data", t.TempDir()}
	for _, c := range []struct {
		direct, want string
	}{
		{"eu=nats://127.0.0.1:4222", `region "eu" is this PoP's own`},
		{"sa=nats://127.0.0.1:4222", `region "sa" is not in --topology (regions: ap, eu, us)`},
		{"us=nats://127.0.0.1:4222;us=nats://127.0.0.1:4223", `region "us" is named twice`},
		{"us=127.0.0.1:4222", `"127.0.0.1:4222" is not a nats:// or tls:// URL`},
		{"us=", `region "us" has no server URL`},
		{"nats://127.0.0.1:4222", "want region=nats://host:4222"},
	} {
		var out, errb bytes.Buffer
		if code := run(append(slices.Clone(base), "--nats-direct", c.direct), &out, &errb); code != 1 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("--nats-direct %q: exit %d, stderr %q, want %q", c.direct, code, errb.String(), c.want)
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"pop", "--nats-direct", "us=nats://127.0.0.1:4222", "--rules", rules}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "needs --region and --pop") {
		t.Errorf("--nats-direct without --region: exit %d, stderr %q", code, errb.String())
	}
	direct, err := parseDirect(" us = nats://h1:4222, tls://h2:4222 ;ap=nats://h3:4222", replication.Topology{Regions: map[string][]string{"eu": {"a"}, "us": {"b"}, "ap": {"c"}}}, "eu")
	if err != nil || len(direct) != 2 || direct["us"] != "nats://h1:4222,tls://h2:4222" || direct["ap"] != "nats://h3:4222" {
		t.Errorf("parseDirect: %v, %v", direct, err)
	}
}
