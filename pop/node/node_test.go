package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store/redistest"
)

func rulesFile(n string) string {
	return "domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: " + n + "}\n"
}

func check(t *testing.T, base string) (int, string) {
	t.Helper()
	resp, err := http.Post(base+"/v1/check", "application/json",
		strings.NewReader(`{"domain":"d","descriptors":[{"entries":[{"key":"ip","value":"1.2.3.4"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("X-RateLimit-Limit")
}

// start runs a PoP with cfg (Listen and Ready filled in, Logger and
// ShutdownTimeout when unset) until the returned cancel is called, and returns its base URL and
// the channel Run's result arrives on.
func start(t *testing.T, cfg Config) (base string, cancel func(), done <-chan error) {
	t.Helper()
	ready := make(chan net.Addr, 1)
	cfg.Listen, cfg.Ready = "127.0.0.1:0", ready
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	errc := make(chan error, 1)
	go func() { errc <- Run(ctx, cfg) }()
	select {
	case a := <-ready:
		return "http://" + a.String(), stop, errc
	case err := <-errc:
		t.Fatal(err)
	}
	return "", nil, nil
}

// A PoP serves checks, reloads its rules when the file changes, keeps the last
// good rules when the new file is broken, and shuts down when its context ends.
func TestRunServesAndReloads(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	os.WriteFile(file, []byte(rulesFile("2")), 0o644)
	base, cancel, done := start(t, Config{Rules: []string{file}, RulesInterval: 10 * time.Millisecond, DataDir: filepath.Join(dir, "data")})
	for _, want := range []int{200, 200, 429} {
		if got, _ := check(t, base); got != want {
			t.Fatalf("status %d, want %d", got, want)
		}
	}
	os.WriteFile(file, []byte(rulesFile("5")), 0o644)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if code, lim := check(t, base); code == 200 && lim == "5" {
			break // the counts survived the reload: 3 of 5 used
		}
		if time.Now().After(deadline) {
			t.Fatal("new rules not in force after 5s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	os.WriteFile(file, []byte("domain: d\ndescriptors: [{key: ip, rate_limit: {unit: fortnight}}]\n"), 0o644)
	time.Sleep(100 * time.Millisecond)
	if _, lim := check(t, base); lim != "5" {
		t.Fatalf("a broken rule file replaced the last good rules: limit %q", lim)
	}
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := http.Get(base + p)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %v %v", p, err, resp)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if p == "/metrics" && (!strings.Contains(string(body), `edgelimit_rule_reloads_total{result="error"}`) ||
			strings.Contains(string(body), `edgelimit_rule_reloads_total{result="error"} 0`)) {
			t.Fatal("/metrics does not count the failed reload")
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no shutdown within 5s")
	}
}

func TestRunRejectsBadRules(t *testing.T) {
	file := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(file, []byte("domain: d\ndescriptors: [{key: ip, rate_limit: {unit: minute, request_per_unit: 1}}]\n"), 0o644)
	err := Run(context.Background(), Config{Listen: "127.0.0.1:0", Rules: []string{file}, Logger: slog.New(slog.DiscardHandler)})
	if err == nil || !strings.Contains(err.Error(), "rules.yaml:2") || !strings.Contains(err.Error(), "request_per_unit") {
		t.Fatalf("got %v, want an error naming rules.yaml:2 and the field", err)
	}
	if err := Run(context.Background(), Config{Listen: "127.0.0.1:0"}); err == nil {
		t.Fatal("no rules: want an error")
	}
}

// A PoP on a Redis store answers checks, counts in Redis, and exports the
// breaker's metrics.
func TestRunWithRedisStore(t *testing.T) {
	srv := redistest.Start(t)
	file := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(file, []byte(rulesFile("2")), 0o644)
	base, _, _ := start(t, Config{Rules: []string{file}, Store: srv.URL(), RedisTimeout: 100 * time.Millisecond})
	for _, want := range []int{200, 200, 429} {
		if got, _ := check(t, base); got != want {
			t.Fatalf("status %d, want %d", got, want)
		}
	}
	body := metricsText(t, base)
	if !strings.Contains(string(body), "edgelimit_store_breaker_state 0") || !strings.Contains(string(body), "edgelimit_store_fallback_decisions_total 0") {
		t.Fatalf("Redis did not decide the checks:\n%s", body)
	}
}

func TestRunRejectsBadStore(t *testing.T) {
	file := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(file, []byte(rulesFile("2")), 0o644)
	err := Run(context.Background(), Config{Listen: "127.0.0.1:0", Rules: []string{file}, Store: "mysql://x", Logger: slog.New(slog.DiscardHandler)})
	if err == nil || !strings.Contains(err.Error(), "store") {
		t.Fatalf("got %v, want a store error", err)
	}
}

// metric returns the text of /metrics.
func metricsText(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// Emptying the rules directory of a running PoP must not let everything
// through: the reload fails (counted as result="error"), the last good rules
// stay, and a key over its limit keeps being denied. A PoP does not start on
// an empty rule set either, unless AllowEmptyRules says that is intended.
func TestRunKeepsRulesWhenDirectoryEmptied(t *testing.T) {
	dir := t.TempDir()
	rulesDir := filepath.Join(dir, "rules")
	os.Mkdir(rulesDir, 0o755)
	file := filepath.Join(rulesDir, "rules.yaml")
	os.WriteFile(file, []byte(rulesFile("2")), 0o644)
	base, _, _ := start(t, Config{Rules: []string{rulesDir}, RulesInterval: 10 * time.Millisecond, DataDir: filepath.Join(dir, "data")})
	for _, want := range []int{200, 200, 429} {
		if got, _ := check(t, base); got != want {
			t.Fatalf("status %d, want %d", got, want)
		}
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(metricsText(t, base), `edgelimit_rule_reloads_total{result="error"} 1`) {
		if time.Now().After(deadline) {
			t.Fatalf("emptying the rules directory was not counted as a failed reload:\n%s", metricsText(t, base))
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // several more polls
	for range 3 {
		if got, lim := check(t, base); got != 429 || lim != "2" {
			t.Fatalf("after emptying the rules: status %d limit %q, want 429 under the last good limit 2", got, lim)
		}
	}

	// At start, an empty directory is an error unless allowed.
	empty := t.TempDir()
	err := Run(context.Background(), Config{Listen: "127.0.0.1:0", Rules: []string{empty}, Logger: slog.New(slog.DiscardHandler)})
	if !errors.Is(err, rules.ErrNoLimits) {
		t.Fatalf("start on an empty directory: %v, want ErrNoLimits", err)
	}
	base2, _, _ := start(t, Config{Rules: []string{empty}, AllowEmptyRules: true, DataDir: filepath.Join(dir, "data2")})
	if got, _ := check(t, base2); got != 200 {
		t.Fatalf("allowed empty rules: status %d, want 200", got)
	}
}

// A reload that drops a rule drops that rule's decision series from /metrics;
// the rules that stay keep theirs.
func TestRunDropsMetricsOfRemovedRules(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	two := "domain: d\ndescriptors:\n" +
		"  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 5, name: keep}\n" +
		"  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5, name: gone}\n"
	os.WriteFile(file, []byte(two), 0o644)
	base, _, _ := start(t, Config{Rules: []string{file}, RulesInterval: 10 * time.Millisecond, DataDir: filepath.Join(dir, "data")})
	check(t, base)
	m := metricsText(t, base)
	for _, want := range []string{`rule="keep"`, `rule="gone"`} {
		if !strings.Contains(m, want) {
			t.Fatalf("no %s series before the reload:\n%s", want, m)
		}
	}
	os.WriteFile(file, []byte("domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 5, name: keep}\n"), 0o644)
	deadline := time.Now().Add(5 * time.Second)
	for {
		m = metricsText(t, base)
		if strings.Contains(m, `edgelimit_rule_reloads_total{result="ok"} 3`) { // start, first watch, reload
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reload within 5s:\n%s", m)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if strings.Contains(m, `rule="gone"`) {
		t.Errorf("series of the removed rule survive the reload:\n%s", grep(m, "edgelimit_decisions_total"))
	}
	if !strings.Contains(m, `edgelimit_decisions_total{domain="d",outcome="allowed",rule="keep"} 1`) {
		t.Errorf("the kept rule lost its series or count:\n%s", grep(m, "edgelimit_decisions_total"))
	}
}

func grep(text, substr string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A PoP without replication warns once per region or global limit, however
// often the rules are loaded; a limit that appears later gets its own warning.
func TestWarnScopesOncePerLimit(t *testing.T) {
	load := func(yaml string) *rules.Set {
		t.Helper()
		f := filepath.Join(t.TempDir(), "rules.yaml")
		if err := os.WriteFile(f, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		set, _, err := rules.Load(f)
		if err != nil {
			t.Fatal(err)
		}
		return set
	}
	one := "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 10, scope: global}\n" +
		"  - key: p\n    rate_limit: {unit: second, requests_per_unit: 10}\n"
	two := one + "  - key: b\n    rate_limit: {unit: second, requests_per_unit: 10, scope: region}\n"
	var buf strings.Builder
	log := slog.New(slog.NewTextHandler(&buf, nil))
	warned := map[string]bool{}
	warnScopes(log, load(one), warned) // the start
	warnScopes(log, load(one), warned) // the watcher's first read of the same files
	if n := strings.Count(buf.String(), "does not replicate yet"); n != 1 {
		t.Fatalf("%d warnings for one global limit loaded twice, want 1:\n%s", n, buf.String())
	}
	warnScopes(log, load(two), warned)
	if n := strings.Count(buf.String(), "does not replicate yet"); n != 2 || !strings.Contains(buf.String(), "scope region") {
		t.Fatalf("%d warnings after a region limit was added, want 2:\n%s", n, buf.String())
	}
}
