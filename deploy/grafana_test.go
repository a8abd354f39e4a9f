package deploy

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// needBinary returns the path of name, skipping the test when it is
// missing, except under CI=true, where it fails.
func needBinary(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and %s is missing (apt-get install %s)", name, pkg)
		}
		t.Skipf("%s is missing (apt-get install %s)", name, pkg)
	}
	return p
}

// dashboardQueries returns every query of deploy/grafana/edgelimit.json,
// with the panel it belongs to.
func dashboardQueries(t *testing.T) map[string]string {
	t.Helper()
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal([]byte(readRepoFile(t, "deploy/grafana/edgelimit.json")), &d); err != nil {
		t.Fatalf("deploy/grafana/edgelimit.json: %v", err)
	}
	q := map[string]string{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			q[tg.Expr] = p.Title
		}
	}
	return q
}

// promQuery evaluates expr on the Prometheus at addr and returns its
// series' label sets.
func promQuery(addr, expr string) ([]map[string]string, error) {
	resp, err := http.Get("http://" + addr + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string
		Error  string
		Data   struct {
			Result []struct{ Metric map[string]string }
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, err
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s", r.Error)
	}
	var out []map[string]string
	for _, s := range r.Data.Result {
		out = append(out, s.Metric)
	}
	return out, nil
}

// TestDashboardQueries evaluates every query of the Grafana dashboard
// against a real Prometheus — deploy/prometheus/prometheus.yml and
// alerts.yaml, only the targets and intervals replaced — scraping a real
// PoP with a Redis store (a real redis-server) and replication (embedded
// NATS), under traffic that crosses a global limit: each query must return
// series.
func TestDashboardQueries(t *testing.T) {
	prom := needBinary(t, "prometheus", "prometheus")
	redis := needBinary(t, "redis-server", "redis-server")
	dir := t.TempDir()
	redisPort := freePort(t)
	start(t, "redis", redis, nil, "--port", fmt.Sprint(redisPort), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	rules := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rules, []byte(`domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 5, scope: global}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	pop := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	waitFor(t, 10*time.Second, "redis-server", func() error {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", redisPort), time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
	startPoP(t, "pop", pop, nil, "--rules", rules, "--data", filepath.Join(dir, "pop"),
		"--store", fmt.Sprintf("redis://127.0.0.1:%d", redisPort),
		"--region", "eu", "--pop", "eu-1", "--topology", "eu=eu-1")

	promAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cfg := template(t, "deploy/prometheus/prometheus.yml", readRepoFile(t, "deploy/prometheus/prometheus.yml"),
		"scrape_interval: 5s", "scrape_interval: 1s",
		"evaluation_interval: 5s", "evaluation_interval: 1s",
		"[pop-eu-1:8080, pop-eu-2:8080, pop-us-1:8080, pop-us-2:8080, pop-ap-1:8080, pop-ap-2:8080]", "["+pop+"]")
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts.yaml"), []byte(readRepoFile(t, "deploy/prometheus/alerts.yaml")), 0o644); err != nil {
		t.Fatal(err)
	}
	start(t, "prometheus", prom, nil, "--config.file", filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path", filepath.Join(dir, "tsdb"), "--web.listen-address", promAddr)

	// Traffic: keys over their global limit (denials, top keys, mitigation
	// bits) and under it, for long enough that rate() over 1m has samples.
	deadline := time.Now().Add(12 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		check(t, pop, fmt.Sprintf(`{"domain":"edge","descriptors":[{"entries":[{"key":"api_key","value":"k%d"}]}]}`, i%7))
		time.Sleep(20 * time.Millisecond)
	}
	queries := dashboardQueries(t)
	if len(queries) < 10 {
		t.Fatalf("the dashboard has %d queries; did its format change?", len(queries))
	}
	for expr, panel := range queries {
		var series []map[string]string
		waitFor(t, 20*time.Second, fmt.Sprintf("panel %q: %s", panel, expr), func() error {
			var err error
			series, err = promQuery(promAddr, expr)
			if err == nil && len(series) == 0 {
				err = fmt.Errorf("no series")
			}
			return err
		})
		t.Logf("%-55s %d series, e.g. %v  ← %s", panel, len(series), series[0], expr)
	}
}
