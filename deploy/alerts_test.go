package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/edgelimit/edgelimit/pop/store/redistest"
)

// requireTool finds bin on PATH, or skips the test loudly — failing it under
// CI=true, where a missing tool must not turn a test green.
func requireTool(t *testing.T, bin, install string) string {
	t.Helper()
	path, err := exec.LookPath(bin)
	if err == nil {
		return path
	}
	msg := fmt.Sprintf("%s not found on PATH (%v): THIS TEST NEEDS IT; install it (%s)", bin, err, install)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " — failing because CI=true")
	}
	t.Skip("SKIPPED: " + msg)
	return ""
}

// TestAlertsPromtool checks alerts.yaml with promtool and runs its unit
// tests, alerts_test.yaml: every alert fires on the series it is for.
func TestAlertsPromtool(t *testing.T) {
	promtool := requireTool(t, "promtool", "apt-get install prometheus")
	for _, args := range [][]string{
		{"check", "rules", "alerts.yaml"},
		{"test", "rules", "alerts_test.yaml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "prometheus"
		out, err := cmd.CombinedOutput()
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
		if err != nil {
			t.Fatalf("promtool %s: %v", strings.Join(args, " "), err)
		}
	}
}

// alertRule is one rule of alerts.yaml.
type alertRule struct {
	Alert string `yaml:"alert"`
	Expr  string `yaml:"expr"`
}

func loadAlerts(t *testing.T) []alertRule {
	t.Helper()
	var file struct {
		Groups []struct {
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal([]byte(readRepoFile(t, "deploy/prometheus/alerts.yaml")), &file); err != nil {
		t.Fatal(err)
	}
	var out []alertRule
	for _, g := range file.Groups {
		out = append(out, g.Rules...)
	}
	if len(out) == 0 {
		t.Fatal("alerts.yaml has no rules")
	}
	return out
}

// selector is a metric a PromQL expression selects, with its equality
// label matchers.
type selector struct {
	name   string
	labels []string // name, value pairs
}

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promSelector = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?\s*(\()?`)
	promMatcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"`)
	promKeywords = []string{"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "inf", "nan"}
)

// selectors returns the metrics expr selects. It knows enough PromQL for
// alert expressions: functions (a name before '('), aggregation groupings,
// ranges, numbers and keywords are not metrics.
func selectors(expr string) []selector {
	// Keep label matchers' strings, drop every other string, grouping and range.
	expr = promRange.ReplaceAllString(expr, "")
	expr = promGrouping.ReplaceAllString(expr, "")
	var out []selector
	for _, m := range promSelector.FindAllStringSubmatchIndex(expr, -1) {
		name := expr[m[2]:m[3]]
		if m[6] >= 0 || slices.Contains(promKeywords, strings.ToLower(name)) {
			continue // a function or aggregation, or a keyword
		}
		if m[2] > 0 && strings.ContainsRune("0123456789.", rune(expr[m[2]-1])) {
			continue // the tail of a number such as 1e3
		}
		if m[2] > 0 && expr[m[2]-1] == '"' {
			continue
		}
		s := selector{name: name}
		if m[4] >= 0 {
			for _, lm := range promMatcher.FindAllStringSubmatch(expr[m[4]:m[5]], -1) {
				if lm[2] == "=" {
					s.labels = append(s.labels, lm[1], lm[3])
				}
			}
		}
		out = append(out, s)
	}
	return out
}

func TestSelectors(t *testing.T) {
	got := selectors(`edgelimit_a == 1 or sum without (result) (increase(edgelimit_b{result="error", x!="y"}[10m])) > 0.001 and up{job="edgelimit"} == 0 and histogram_quantile(0.99, sum by (instance, le) (rate(c_bucket[5m]))) > 1e3`)
	want := []selector{{name: "edgelimit_a"}, {name: "edgelimit_b", labels: []string{"result", "error"}}, {name: "up", labels: []string{"job", "edgelimit"}}, {name: "c_bucket"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("selectors:\n got %v\nwant %v", got, want)
	}
}

// TestAlertMetricsExist scrapes a real PoP — the edgelimit binary with a
// Redis store and replication on (an embedded NATS server), so that every
// metric the PoP can export is there — and checks that every metric an
// alert selects, with its label values, is one the PoP exports. (up is
// Prometheus' own.) An alert on a metric that does not exist never fires.
func TestAlertMetricsExist(t *testing.T) {
	redis := redistest.Start(t)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rules, []byte("domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 10, scope: global}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	startPoP(t, "pop", listen, nil, "--rules", rules, "--data", filepath.Join(dir, "data"),
		"--store", redis.URL(), "--region", "eu", "--pop", "eu-1")
	var samples []sample
	waitFor(t, patience, "replication metrics", func() error {
		var err error
		if samples, err = scrape(listen); err != nil {
			return err
		}
		_, err = metric(samples, "edgelimit_replication_stalled_sources")
		return err
	})
	for _, rule := range loadAlerts(t) {
		sels := selectors(rule.Expr)
		if len(sels) == 0 {
			t.Errorf("%s: no metric found in %q", rule.Alert, rule.Expr)
		}
		for _, s := range sels {
			if s.name == "up" {
				continue
			}
			if _, err := metric(samples, s.name, s.labels...); err != nil {
				t.Errorf("%s: the PoP exports no %s%v: the alert could never fire", rule.Alert, s.name, s.labels)
			}
		}
	}
}
