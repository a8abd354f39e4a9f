package pop

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/quota"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
)

const tenantRuleFile = `domain: api
tenants:
  key: api_key
  default_tier: free
  tiers:
    - name: free
      rate_limit: {unit: minute, requests_per_unit: 3}
    - name: pro
      rate_limit: {unit: minute, requests_per_unit: 5}
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: endpoint
        value: "POST /orders"
        rate_limit: {unit: minute, requests_per_unit: 50}
`

func tenantEngine(t *testing.T) (*Engine, *quota.Index) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "r.yaml")
	if err := os.WriteFile(p, []byte(tenantRuleFile), 0o644); err != nil {
		t.Fatal(err)
	}
	set, _, err := rules.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	e := NewEngine(store.NewMemory(store.MemoryConfig{}), set, nil)
	idx := &quota.Index{}
	e.UseQuotas(idx)
	return e, idx
}

// admitted counts how many single hits of key (on descriptor extra…) pass
// out of n at instant at.
func admitted(t *testing.T, e *Engine, at time.Time, n int, desc ...string) int {
	t.Helper()
	var res Result
	ok := 0
	for range n {
		if err := e.CheckAt(context.Background(), at, req(1, desc), &res); err != nil {
			t.Fatal(err)
		}
		if res.Code == OK {
			ok++
		}
	}
	return ok
}

// A key's tier comes from the quota store (the default tier without one);
// an override replaces the quota of the limit it names and keeps the counts
// already spent; every matching limit is checked and the most restrictive
// decides.
func TestTenantTiersAndOverrides(t *testing.T) {
	e, idx := tenantEngine(t)
	at := t0.Add(10 * time.Second)
	if got := admitted(t, e, at, 10, "api_key", "anon"); got != 3 {
		t.Fatalf("a key without a quota got %d hits, want the free tier's 3", got)
	}
	idx.Replace([]*quota.Quota{(&quota.Quota{APIKey: "acme", Tier: "pro"}).Prepare()}, 1)
	if got := admitted(t, e, at, 10, "api_key", "acme"); got != 5 {
		t.Fatalf("a pro key got %d hits, want 5", got)
	}
	// Raise the pro tier limit for acme to 8: the 5 hits spent still count.
	idx.Apply([]quota.Change{{APIKey: "acme", Quota: &quota.Quota{APIKey: "acme", Tier: "pro",
		Overrides: []quota.Override{{Descriptor: "tier:pro", RequestsPerUnit: 8, Unit: rules.Minute}}}}}, 2)
	if got := admitted(t, e, at, 10, "api_key", "acme"); got != 3 {
		t.Fatalf("after raising acme to 8, %d more hits passed, want 3 (the counts were kept)", got)
	}
	// Moving acme back to the free tier (3) keeps its count of 8 too: denied.
	idx.Apply([]quota.Change{{APIKey: "acme", Quota: &quota.Quota{APIKey: "acme"}}}, 3)
	if got := admitted(t, e, at, 1, "api_key", "acme"); got != 0 {
		t.Fatal("a key moved to a smaller tier got a fresh count")
	}
	// An override lowering a descriptor limit below the tier: it decides.
	idx.Apply([]quota.Change{{APIKey: "bolt", Quota: &quota.Quota{APIKey: "bolt", Tier: "pro",
		Overrides: []quota.Override{{Descriptor: "api_key.endpoint=POST /orders", RequestsPerUnit: 2, Unit: rules.Minute}}}}}, 4)
	var res Result
	if err := e.CheckAt(context.Background(), at, req(1, []string{"api_key", "bolt", "endpoint", "POST /orders"}), &res); err != nil {
		t.Fatal(err)
	}
	if st := res.Statuses[0]; res.Code != OK || st.Limit == nil || st.Limit.Name != "api_key.endpoint=POST /orders" || st.Limit.Spec.Limit != 2 {
		t.Fatalf("the decisive status names %+v, want the overridden endpoint limit of 2", st.Limit)
	}
	if got := admitted(t, e, at, 5, "api_key", "bolt", "endpoint", "POST /orders"); got != 1 {
		t.Fatalf("bolt's endpoint got %d more hits, want 1 (its override's 2, one spent)", got)
	}
	// A quota not yet in force, or expired, does not apply.
	later := &quota.Quota{APIKey: "soon", Tier: "pro", EffectiveAt: quota.TimeOf(at.Add(time.Hour))}
	idx.Apply([]quota.Change{{APIKey: "soon", Quota: later}}, 5)
	if got := admitted(t, e, at, 10, "api_key", "soon"); got != 3 {
		t.Fatalf("a quota effective in an hour applied now: %d hits, want the free tier's 3", got)
	}
	// Usage reads the counts without spending any.
	us, err := e.UsageAt(context.Background(), at, "api", "acme")
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]Usage{}
	for _, u := range us {
		byName[u.Limit.Name] = u
	}
	// Used is capped at the limit: acme counted 8 under a larger tier, and
	// the free tier's 3 are all spent.
	if u := byName["tier:free"]; u.Used != 3 || u.Remaining != 0 || u.Tier != "free" {
		t.Fatalf("acme's tier usage %+v, want all 3 of the free tier used", u)
	}
	if u := byName["api_key"]; u.Used != 8 || u.Remaining != 92 {
		t.Fatalf("acme's api_key usage %+v, want 8 used, 92 remaining", u)
	}
	again, _ := e.UsageAt(context.Background(), at, "api", "acme")
	for i := range again {
		if again[i].Used != us[i].Used {
			t.Fatal("reading usage counted a hit")
		}
	}
}

// Quotas add no allocation to a check: a key with a quota and an override
// costs what a key without one costs (the store's own allocations aside).
func TestTenantCheckAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are the race detector's under -race; run without it")
	}
	e, idx := tenantEngine(t)
	idx.Replace([]*quota.Quota{{APIKey: "acme", Tier: "pro", Overrides: []quota.Override{{Descriptor: "tier:pro", RequestsPerUnit: 1 << 30, Unit: rules.Minute}}}}, 1)
	at := t0.Add(time.Second)
	allocs := func(key string) float64 {
		r := req(1, []string{"api_key", key, "endpoint", "POST /orders"})
		var res Result
		check := func() {
			if err := e.CheckAt(context.Background(), at, r, &res); err != nil {
				t.Fatal(err)
			}
		}
		check()
		return testing.AllocsPerRun(100, check)
	}
	without, with := allocs("anon"), allocs("acme")
	if with != without {
		t.Fatalf("a check allocates %v times with a quota and override, %v without", with, without)
	}
}

// A request's own limit (Envoy's RateLimitOverride) replaces the limits its
// descriptor matches, but not the key's tier, whose override still applies.
func TestTenantTierWithRequestOverride(t *testing.T) {
	e, idx := tenantEngine(t)
	idx.Replace([]*quota.Quota{{APIKey: "acme", Tier: "pro", Overrides: []quota.Override{{Descriptor: "tier:pro", RequestsPerUnit: 2, Unit: rules.Minute}}}}, 1)
	r := req(1, []string{"api_key", "acme"})
	r.Descriptors[0].Limit = &Override{RequestsPerUnit: 1000, Unit: rules.Minute}
	var res Result
	ok := 0
	for range 5 {
		if err := e.CheckAt(context.Background(), t0.Add(time.Second), r, &res); err != nil {
			t.Fatal(err)
		}
		if res.Code == OK {
			ok++
		}
	}
	if ok != 2 {
		t.Fatalf("%d hits passed, want the tier override's 2 despite the request's own limit of 1000", ok)
	}
}
