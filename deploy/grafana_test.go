package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/deploy/lab"
	"github.com/edgelimit/edgelimit/pop/store/redistest"
)

// TestDashboardQueries evaluates every query of the Grafana dashboard
// against a real Prometheus — deploy/prometheus/prometheus.yml and
// alerts.yaml, only the targets and intervals replaced — scraping a real
// PoP with a Redis store (a real redis-server) and replication (embedded
// NATS), under traffic that crosses a global limit: each query must return
// series.
func TestDashboardQueries(t *testing.T) {
	prom := requireTool(t, "prometheus", "apt-get install prometheus")
	redis := redistest.Start(t)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rules, []byte(`domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 5, scope: global}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	pop := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	startPoP(t, "pop", pop, nil, "--rules", rules, "--data", filepath.Join(dir, "pop"),
		"--store", redis.URL(),
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
	queries, err := lab.DashboardQueries("grafana/edgelimit.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(queries) < 10 {
		t.Fatalf("the dashboard has %d queries; did its format change?", len(queries))
	}
	for expr, panel := range queries {
		var series []map[string]string
		waitFor(t, patience, fmt.Sprintf("panel %q: %s", panel, expr), func() error {
			var err error
			series, err = lab.PromQuery(promAddr, expr)
			if err == nil && len(series) == 0 {
				err = fmt.Errorf("no series")
			}
			return err
		})
		t.Logf("%-55s %d series, e.g. %v  ← %s", panel, len(series), series[0], expr)
	}
}
