package main

import (
	"bytes"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
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

// A command line the binary refuses is one line naming the flag and the form
// its value takes and ending with a pointer to the command's --help — not the
// whole usage — with exit status 2.
func TestFlagRefusalIsOneLineAndAHint(t *testing.T) {
	scenario := filepath.Join("..", "..", "simulate", "scenarios", "spray.yaml")
	for _, c := range []struct {
		args []string
		env  [2]string
		want string
	}{
		{args: []string{"pop", "--nope"}, want: "edgelimit pop: unknown flag --nope"},
		{args: []string{"pop", "--flush-interval", "soon"}, want: `edgelimit pop: invalid value "soon" for --flush-interval: want a duration such as 500ms, 10s or 1m30s`},
		{args: []string{"pop", "--max-keys", "many"}, want: `edgelimit pop: invalid value "many" for --max-keys: want a whole number`},
		{args: []string{"pop", "--listen"}, want: "edgelimit pop: flag --listen needs a value"},
		{args: []string{"pop", "stray"}, want: `edgelimit pop: unexpected argument "stray" (flags only)`},
		{args: []string{"pop"}, env: [2]string{"EDGELIMIT_FLUSH_INTERVAL", "soon"},
			want: `edgelimit pop: environment EDGELIMIT_FLUSH_INTERVAL="soon": want a duration such as 500ms, 10s or 1m30s`},
		{args: []string{"sim", "--seed", "x", scenario}, want: `edgelimit sim: invalid value "x" for --seed: want a whole number, 0 or more`},
		{args: []string{"sim"}, want: "edgelimit sim: want one scenario file, got 0 arguments"},
		{args: []string{"demo", "--pops", "two"}, want: `edgelimit demo: invalid value "two" for --pops: want a whole number`},
		{args: []string{"load", "--nope"}, want: "edgelimit load: unknown flag --nope"},
		{args: []string{"version", "extra"}, want: `edgelimit version: unexpected argument "extra" (flags only)`},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			if c.env[0] != "" {
				t.Setenv(c.env[0], c.env[1])
			}
			var out, errb bytes.Buffer
			code := run(c.args, &out, &errb)
			want := c.want + "; see 'edgelimit " + c.args[0] + " --help'\n"
			if code != 2 || out.Len() != 0 || errb.String() != want {
				t.Fatalf("exit %d, stdout %q, stderr:\n%s\nwant exit 2, no stdout, and the one line:\n%s", code, out.String(), errb.String(), want)
			}
		})
	}
}

// An unknown command is one line pointing at 'edgelimit help', not the whole
// usage.
func TestUnknownCommandIsOneLine(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"bogus"}, &out, &errb)
	want := "edgelimit: unknown command \"bogus\"; see 'edgelimit help'\n"
	if code != 2 || out.Len() != 0 || errb.String() != want {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit 2, no stdout and %q", code, out.String(), errb.String(), want)
	}
}

// Help is asked for, so it goes to stdout and exits 0, for every command and
// for 'edgelimit help <command>'.
func TestHelpGoesToStdout(t *testing.T) {
	for _, args := range [][]string{
		{"pop", "--help"}, {"help", "pop"}, {"pop", "-h"}, {"sim", "--help"}, {"help", "sim"}, {"demo", "--help"},
		{"load", "--help"}, {"probe", "--help"}, {"natsconf", "--help"}, {"baseline", "--help"}, {"version", "--help"},
		{"help"},
	} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 0 || errb.Len() != 0 || !strings.Contains(strings.ToLower(out.String()), "usage") {
			t.Errorf("%v: exit %d, stderr %q, stdout %.80q; want exit 0 and the usage on stdout alone", args, code, errb.String(), out.String())
		}
	}
	var out, errb bytes.Buffer
	run([]string{"pop", "--help"}, &out, &errb)
	if !strings.Contains(out.String(), "-flush-interval duration") {
		t.Errorf("pop --help does not list the flags:\n%s", out.String())
	}
}

func TestVersion(t *testing.T) {
	settings := func(kv ...string) []debug.BuildSetting {
		var s []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			s = append(s, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return s
	}
	for _, c := range []struct {
		name string
		info *debug.BuildInfo
		want string
	}{
		{"release", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.3"},
			Settings: settings("vcs.revision", "59decc8a", "vcs.time", "2026-11-27T21:00:00Z", "vcs.modified", "false")},
			"edgelimit v1.2.3 commit 59decc8a of 2026-11-27T21:00:00Z, go1.26.8"},
		{"checkout with changes", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"},
			Settings: settings("vcs.revision", "59decc8a", "vcs.modified", "true")},
			"edgelimit (devel) commit 59decc8a (modified), go1.26.8"},
		{"no vcs", &debug.BuildInfo{GoVersion: "go1.26.8"},
			"edgelimit (devel) (no commit recorded: built outside a git checkout, or with -buildvcs=false), go1.26.8"},
		{"no build info", nil, "edgelimit (unknown version: built without module information)"},
	} {
		if got := versionLine(c.info); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"version"}, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "edgelimit ") || !strings.Contains(out.String(), runtime.Version()) {
		t.Errorf("edgelimit version: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}

// A demo whose ports are taken says so, and how to choose others, before it
// starts anything or prints a URL.
func TestDemoBusyPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	var out, errb bytes.Buffer
	code := run([]string{"demo", "--regions", "eu", "--pops", "1", "--base-port", strconv.Itoa(port), "--data", t.TempDir()}, &out, &errb)
	if code != 1 || out.Len() != 0 || !strings.Contains(errb.String(), fmt.Sprintf("port %d is taken", port)) ||
		!strings.Contains(errb.String(), "--base-port") || strings.Count(errb.String(), "\n") != 1 {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1, no URL, and one line naming the port and --base-port", code, out.String(), errb.String())
	}
}

// A rule file's syntax error names the line of the mistake, not the line
// where the enclosing block starts, many lines before it.
func TestPopRulesYAMLErrorLine(t *testing.T) {
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	text := "domain: d\ndescriptors:\n  - key: k\n    descriptors:\n" + strings.Repeat("      - key: e\n", 9) +
		"      - key: f\n        value: v\n       shadow_mode: true\n" // line 16: one space short
	if err := os.WriteFile(rules, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"pop", "--rules", rules, "--data", t.TempDir(), "--listen", "127.0.0.1:0"}, &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), rules+":16: invalid YAML") {
		t.Fatalf("exit %d, stderr %q; want the error at %s:16", code, errb.String(), rules)
	}
}
