package rules

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLoadConcurrency(t *testing.T) {
	dir := t.TempDir()
	p := writeFile(t, dir, "c.yaml", `domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 100}
    concurrency: {max: 20, lease_ttl: 30s}
  - key: endpoint
    concurrency: {max: 3, name: slow_endpoints, fail_closed: true}
`)
	set, warns, err := Load(p)
	if err != nil || len(warns) > 0 {
		t.Fatalf("Load: %v, warnings %v", err, warns)
	}
	d := set.Domain("api")
	ls := d.Match(entries("api_key=abc"))
	if len(ls) != 2 {
		t.Fatalf("api_key matched %d limits, want the rate limit and the concurrency limit", len(ls))
	}
	var c *Limit
	for _, l := range ls {
		if l.Concurrent() {
			c = l
		}
	}
	if c == nil || c.Spec.Limit != 20 || c.LeaseTTL != 30*time.Second || c.Name != "api_key_concurrency" || c.FailClosed {
		t.Fatalf("concurrency limit = %+v, want max 20, lease_ttl 30s, name api_key_concurrency", c)
	}
	e := d.Match(entries("endpoint=x"))
	if len(e) != 1 || !e[0].Concurrent() || e[0].LeaseTTL != DefaultLeaseTTL || e[0].Name != "slow_endpoints" || !e[0].FailClosed {
		t.Fatalf("endpoint = %+v, want the default lease_ttl %v, its name and fail_closed", e[0], DefaultLeaseTTL)
	}
}

func TestLoadConcurrencyErrors(t *testing.T) {
	const head = "domain: d\ndescriptors:\n  - key: k\n"
	for _, c := range []struct {
		name, yaml string
		line       int
		want       string
	}{
		{"no max", head + "    concurrency: {lease_ttl: 10s}\n", 4, "concurrency has no max"},
		{"zero max", head + "    concurrency:\n      max: 0\n", 5, "concurrency.max must be between 1 and"},
		{"max not a number", head + "    concurrency:\n      max: many\n", 5, "concurrency.max must be an integer"},
		{"bad ttl", head + "    concurrency:\n      max: 2\n      lease_ttl: forever\n", 6, "concurrency.lease_ttl: time: invalid duration"},
		{"ttl too short", head + "    concurrency:\n      max: 2\n      lease_ttl: 1ms\n", 6, "concurrency.lease_ttl must be between 100ms and 24h0m0s, got 1ms"},
		{"unknown field", head + "    concurrency:\n      max: 2\n      scope: global\n", 6, `unknown field "scope" in concurrency`},
		{"not a mapping", head + "    concurrency: 20\n", 4, "concurrency must be a mapping"},
		{"shadow", head + "    shadow_mode: true\n    concurrency: {max: 2}\n", 5, "shadow_mode does not apply to a concurrency limit"},
	} {
		t.Run(c.name, func(t *testing.T) {
			file := writeFile(t, t.TempDir(), "r.yaml", c.yaml)
			_, _, err := Load(file)
			if err == nil {
				t.Fatal("Load accepted it")
			}
			where := fmt.Sprintf("%s:%d: ", filepath.Clean(file), c.line)
			if msg := err.Error(); !strings.Contains(msg, where) || !strings.Contains(msg, c.want) {
				t.Errorf("error %q, want %q at %q", msg, c.want, where)
			}
		})
	}
}
