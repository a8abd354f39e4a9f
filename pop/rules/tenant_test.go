package rules

import (
	"reflect"
	"strings"
	"testing"
)

const tenantRules = `domain: api
tenants:
  key: api_key
  default_tier: free
  tiers:
    - name: free
      rate_limit: {unit: minute, requests_per_unit: 100}
    - name: pro
      rate_limits:
        - {unit: minute, requests_per_unit: 5000, scope: global}
        - {unit: day, requests_per_unit: 1000000, scope: global, name: pro_daily}
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 10000}
    descriptors:
      - key: endpoint
        value: "POST /orders"
        rate_limit: {unit: minute, requests_per_unit: 20}
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 30}
`

func TestTenantsLoad(t *testing.T) {
	set, _, err := Load(writeFile(t, t.TempDir(), "r.yaml", tenantRules))
	if err != nil {
		t.Fatal(err)
	}
	d := set.Domain("api")
	tn := d.Tenants
	if tn == nil || tn.Key != "api_key" || tn.DefaultTier != "free" || !reflect.DeepEqual(tn.TierNames(), []string{"free", "pro"}) {
		t.Fatalf("tenants: %+v", tn)
	}
	if got := describe(tn.Tier("pro")); !reflect.DeepEqual(got, []string{"pro_daily: 1000000/day sliding_window global", "tier:pro_minute: 5000/minute sliding_window global"}) {
		t.Errorf("pro: %v", got)
	}
	if got := describe(tn.Tier("gold")); !reflect.DeepEqual(got, []string{"tier:free: 100/minute sliding_window pop"}) {
		t.Errorf("an unknown tier is the default tier: %v", got)
	}
	for name, want := range map[string]bool{"tier:free": true, "pro_daily": true, "api_key": true, "api_key.endpoint=POST /orders": true, "remote_address": false} {
		if tn.Overridable(name) != want {
			t.Errorf("Overridable(%q) = %v, want %v", name, !want, want)
		}
	}
	if n := len(set.Limits()); n != 6 {
		t.Errorf("Limits() has %d limits, want 6 (3 tier + 3 descriptor)", n)
	}
	got := d.UsageDescriptors("abc")
	want := [][]Entry{{{"api_key", "abc"}}, {{"api_key", "abc"}, {"endpoint", "POST /orders"}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("UsageDescriptors = %v, want %v", got, want)
	}
	// Tier and descriptor counters never share a key.
	l := d.Match(entries("api_key=abc"))[0]
	if string(l.AppendKey(nil, entries("api_key=abc"))) == string(l.AppendTenantKey(nil, "api_key", "abc")) {
		t.Error("a tier key equals the descriptor key")
	}
}

func TestTenantsErrors(t *testing.T) {
	cases := []struct{ name, text, want string }{
		{"no key", "domain: a\ntenants:\n  default_tier: free\n  tiers:\n    - name: free\n      rate_limit: {unit: minute, requests_per_unit: 1}\n", "r.yaml:2: tenants needs a key"},
		{"unknown default", "domain: a\ntenants:\n  key: k\n  default_tier: gold\n  tiers:\n    - name: free\n      rate_limit: {unit: minute, requests_per_unit: 1}\n", `r.yaml:4: default_tier "gold" is not one of the tiers`},
		{"duplicate tier", "domain: a\ntenants:\n  key: k\n  default_tier: free\n  tiers:\n    - name: free\n      rate_limit: {unit: minute, requests_per_unit: 1}\n    - name: free\n      rate_limit: {unit: minute, requests_per_unit: 2}\n", `r.yaml:8: tier "free" is defined twice (first at line 6)`},
		{"tier without limits", "domain: a\ntenants:\n  key: k\n  default_tier: free\n  tiers:\n    - name: free\n", `r.yaml:6: tier "free" has no rate_limit or rate_limits`},
		{"bad unit", "domain: a\ntenants:\n  key: k\n  default_tier: free\n  tiers:\n    - name: free\n      rate_limit: {unit: fortnight, requests_per_unit: 1}\n", "r.yaml:7: unit: unknown unit"},
		{"unknown field", "domain: a\ntenants:\n  key: k\n  default_tier: free\n  colour: red\n  tiers:\n    - name: free\n      rate_limit: {unit: minute, requests_per_unit: 1}\n", `r.yaml:5: unknown field "colour" in tenants`},
		{"bad tier name", "domain: a\ntenants:\n  key: k\n  default_tier: free\n  tiers:\n    - name: \"a b\"\n      rate_limit: {unit: minute, requests_per_unit: 1}\n", `r.yaml:6: tier name "a b"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := Load(writeFile(t, t.TempDir(), "r.yaml", c.text))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want it to contain %q", err, c.want)
			}
		})
	}
}
