package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// PartitionAlert is the alert of deploy/prometheus/alerts.yaml that a cut
// region must raise, and the heal resolve.
const PartitionAlert = "EdgelimitGlobalShareReduced"

// DashboardQueries returns every query of a Grafana dashboard file, by
// query, with the title of its panel.
func DashboardQueries(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	q := map[string]string{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			q[tg.Expr] = p.Title
		}
	}
	return q, nil
}

// PromQuery evaluates expr on the Prometheus at addr (host:port) and
// returns the label sets of the series it returned.
func PromQuery(addr, expr string) ([]map[string]string, error) {
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
		return nil, fmt.Errorf("prometheus: %s: %s", expr, r.Error)
	}
	var out []map[string]string
	for _, s := range r.Data.Result {
		out = append(out, s.Metric)
	}
	return out, nil
}

// alertState returns the state (pending, firing) of alert name on the
// Prometheus at addr, "" when it is not active.
func alertState(addr, name string) (string, error) {
	resp, err := http.Get("http://" + addr + "/api/v1/alerts")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var r struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string
				State  string
			}
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return "", err
	}
	state := ""
	for _, a := range r.Data.Alerts {
		if a.Labels["alertname"] == name && (state == "" || a.State == "firing") {
			state = a.State
		}
	}
	return state, nil
}

// QueryResult is one dashboard query evaluated on the lab's Prometheus.
type QueryResult struct {
	Panel, Expr string
	Series      int
	Err         string
}

// AlertResult is the partition alert through a long cut.
type AlertResult struct {
	Region          string
	Fired, Resolved time.Duration // after the cut, after the heal; -1 never
	Detail          string
}

// startPrometheus runs Prometheus in the root namespace with
// deploy/prometheus/prometheus.yml and alerts.yaml as shipped, only the
// targets replaced by the lab's PoPs.
func (l *lab) startPrometheus(ctx context.Context) error {
	dir := filepath.Join(l.cfg.Dir, "prometheus")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(l.cfg.Root, "deploy", "prometheus", "prometheus.yml")
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var targets []string
	for _, h := range l.pops() {
		targets = append(targets, fmt.Sprintf("%s:%d", h.IP, popPort))
	}
	text, err := Replace(path, string(b),
		"[pop-eu-1:8080, pop-eu-2:8080, pop-us-1:8080, pop-us-2:8080, pop-ap-1:8080, pop-ap-2:8080]", "["+strings.Join(targets, ", ")+"]")
	if err != nil {
		return err
	}
	alerts, err := os.ReadFile(filepath.Join(l.cfg.Root, "deploy", "prometheus", "alerts.yaml"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(text), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts.yaml"), alerts, 0o644); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	l.promAddr = ln.Addr().String()
	ln.Close()
	p, err := StartProc(l.cfg.Dir, "", "prometheus", nil, l.cfg.Prometheus, "--config.file", filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path", filepath.Join(dir, "tsdb"), "--web.listen-address", l.promAddr)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.procs["prometheus"] = p
	l.mu.Unlock()
	return l.waitFor(ctx, 30*time.Second, "prometheus scrapes every PoP", func() error {
		return l.alive("prometheus", func() error {
			up, err := PromQuery(l.promAddr, `up{job="edgelimit"} == 1`)
			if err == nil && len(up) != len(targets) {
				err = fmt.Errorf("%d of %d targets up", len(up), len(targets))
			}
			return err
		})
	})
}

// evalDashboard evaluates every query of deploy/grafana/edgelimit.json.
func (l *lab) evalDashboard() ([]QueryResult, error) {
	q, err := DashboardQueries(filepath.Join(l.cfg.Root, "deploy", "grafana", "edgelimit.json"))
	if err != nil {
		return nil, err
	}
	var out []QueryResult
	for expr, panel := range q {
		s, err := PromQuery(l.promAddr, expr)
		r := QueryResult{Panel: panel, Expr: expr, Series: len(s)}
		if err != nil {
			r.Err = err.Error()
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Panel+out[i].Expr < out[j].Panel+out[j].Expr })
	return out, nil
}

// alertPhase cuts the last region for as long as the partition alert takes
// to fire (its `for` included), heals it, and waits for the alert to
// resolve.
func (l *lab) alertPhase(ctx context.Context) AlertResult {
	r := l.plan.Regions[len(l.plan.Regions)-1]
	res := AlertResult{Region: r.Name, Fired: -1, Resolved: -1}
	t := time.Now()
	l.logf("alert: %s's wan link down until %s fires", r.Name, PartitionAlert)
	if err := cut(r); err != nil {
		res.Detail = err.Error()
		return res
	}
	err := l.waitFor(ctx, 3*time.Minute, PartitionAlert+" fires", func() error {
		s, err := alertState(l.promAddr, PartitionAlert)
		if err == nil && s != "firing" {
			err = fmt.Errorf("state %q", s)
		}
		return err
	})
	if err == nil {
		res.Fired = time.Since(t)
	}
	t = time.Now()
	if herr := heal(r); herr != nil {
		res.Detail = herr.Error()
		return res
	}
	if err != nil {
		res.Detail = err.Error()
		return res
	}
	l.logf("alert: fired after %v; healed", res.Fired.Round(time.Second))
	if err := l.waitFor(ctx, 2*time.Minute, PartitionAlert+" resolves", func() error {
		s, err := alertState(l.promAddr, PartitionAlert)
		if err == nil && s != "" {
			err = fmt.Errorf("state %q", s)
		}
		return err
	}); err != nil {
		res.Detail = err.Error()
		return res
	}
	res.Resolved = time.Since(t)
	return res
}
