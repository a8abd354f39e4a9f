package pop

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgelimit/edgelimit/pop/rules"
)

// reloadSeries returns edgelimit_rule_reloads_total by result as reg
// exposes it.
func reloadSeries(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "edgelimit_rule_reloads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" {
					out[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// The failed-reload series exists at 0 before any reload, so an alert on
// increase(edgelimit_rule_reloads_total{result="error"}[10m]) sees the first
// failure (a series born at 1 has no increase to see); and
// edgelimit_rule_reload_failing holds 1 from a failed reload to the next
// good one.
func TestMetricsReloadFailure(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	got := reloadSeries(t, reg)
	if v, ok := got["error"]; !ok || v != 0 {
		t.Fatalf("before any reload: error series %v (present %t), want 0", v, ok)
	}
	if v, ok := got["ok"]; !ok || v != 0 {
		t.Fatalf("before any reload: ok series %v (present %t), want 0", v, ok)
	}
	m.RulesFailed()
	if v := reloadSeries(t, reg)["error"]; v != 1 {
		t.Fatalf("after a failed reload the error series is %v, want 1", v)
	}
	if v := gauge(t, reg, "edgelimit_rule_reload_failing"); v != 1 {
		t.Fatalf("after a failed reload edgelimit_rule_reload_failing is %v, want 1", v)
	}
	m.RulesLoaded(&rules.Set{})
	if v := gauge(t, reg, "edgelimit_rule_reload_failing"); v != 0 {
		t.Fatalf("after a good reload edgelimit_rule_reload_failing is %v, want 0", v)
	}
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}
