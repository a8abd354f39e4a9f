package pop

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
)

// envoyEngine loads the rule file text (Envoy ratelimit's format) into an
// engine on the embedded store.
func envoyEngine(t *testing.T, text string) *Engine {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	set, _, err := rules.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	return NewEngine(store.NewMemory(store.MemoryConfig{}), set, nil)
}

// replacesRules is examples/ratelimit/config/example.yaml of Envoy's
// ratelimit, cut to the limits its replaces cases touch.
const replacesRules = `domain: rl
descriptors:
  - key: category
    value: account
    rate_limit:
      replaces: [{name: bkthomps}, {name: fake_name}]
      unit: minute
      requests_per_unit: 4
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 2}
    descriptors:
      - key: bar
        value: bkthomps
        rate_limit: {name: bkthomps, unit: minute, requests_per_unit: 1}
`

// TestReplaces: a limit named in the replaces of another limit the request
// matches does not apply to it — in another descriptor too — and applies as
// usual to a request that does not match the replacing limit.
func TestReplaces(t *testing.T) {
	e := envoyEngine(t, replacesRules)
	ctx := context.Background()
	var res Result
	both := &Request{Domain: "rl", Descriptors: []Descriptor{
		{Entries: []rules.Entry{{Key: "category", Value: "account"}}},
		{Entries: []rules.Entry{{Key: "foo", Value: "x"}, {Key: "bar", Value: "bkthomps"}}},
	}}
	for i := range 4 { // bkthomps (1/min) is replaced: the 4/min account limit decides
		if err := e.CheckAt(ctx, t0, both, &res); err != nil || res.Code != OK {
			t.Fatalf("check %d: %v %+v", i, err, res)
		}
		if st := res.Statuses[1]; st.Limit != nil || st.Code != OK {
			t.Fatalf("check %d: the replaced descriptor reports %+v, want no limit", i, st)
		}
	}
	if err := e.CheckAt(ctx, t0, both, &res); err != nil || res.Code != OverLimit || res.Statuses[0].Code != OverLimit {
		t.Fatalf("5th: %v %+v, want the account limit over", err, res)
	}
	alone := &Request{Domain: "rl", Descriptors: both.Descriptors[1:]}
	if err := e.CheckAt(ctx, t0, alone, &res); err != nil || res.Code != OK || res.Statuses[0].Limit.Name != "bkthomps" {
		t.Fatalf("alone, 1st: %v %+v", err, res)
	}
	if err := e.CheckAt(ctx, t0, alone, &res); err != nil || res.Code != OverLimit {
		t.Fatalf("alone, 2nd: %v %+v, want bkthomps (1/min) over", err, res)
	}
}

// TestEnvoyStatuses: an unlimited descriptor is reported with remaining
// 4294967295's flag and no limit; a shadow limit is reported (limit and
// remaining, code OK, never in the headers) when the descriptor matched no
// enforced limit, and gives way to an enforced one.
func TestEnvoyStatuses(t *testing.T) {
	e := envoyEngine(t, `domain: d
descriptors:
  - key: free
    rate_limit: {unlimited: true}
  - key: shady
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: strict
    rate_limit: {unit: minute, requests_per_unit: 5}
`)
	ctx := context.Background()
	var res Result
	r := &Request{Domain: "d", Descriptors: []Descriptor{
		{Entries: []rules.Entry{{Key: "free", Value: "x"}}},
		{Entries: []rules.Entry{{Key: "shady", Value: "x"}}},
	}}
	for i, wantRemaining := range []int64{1, 0, 0, 0} {
		if err := e.CheckAt(ctx, t0, r, &res); err != nil || res.Code != OK {
			t.Fatalf("check %d: %v %+v", i, err, res)
		}
		free, shady := res.Statuses[0], res.Statuses[1]
		if !free.Unlimited || free.Limit != nil {
			t.Fatalf("check %d: unlimited status %+v", i, free)
		}
		if !shady.Shadow || shady.Limit == nil || shady.Limit.Spec.Limit != 2 || shady.Code != OK || shady.Remaining != wantRemaining {
			t.Fatalf("check %d: shadow status %+v, want limit 2, OK, remaining %d", i, shady, wantRemaining)
		}
		if res.Decisive != -1 || HeaderValues(t0, &res) != nil {
			t.Fatalf("check %d: a shadow limit decided the headers (%d)", i, res.Decisive)
		}
	}
	r.Descriptors = append(r.Descriptors, Descriptor{Entries: []rules.Entry{{Key: "strict", Value: "x"}}})
	if err := e.CheckAt(ctx, t0, r, &res); err != nil || res.Code != OK || res.Decisive != 2 {
		t.Fatalf("with an enforced limit: %v %+v, want it to decide the headers", err, res)
	}
}

// TestQuotaMode: quota-mode limits (Envoy's quota_mode, as in its
// example.yaml) deny only together: a request is over when every descriptor
// with a quota-mode limit is over one, or an ordinary limit denies it; over
// quota statuses say OVER_LIMIT either way; a request denied for its quotas
// spends nothing.
func TestQuotaMode(t *testing.T) {
	e := envoyEngine(t, `domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 5}
`)
	ctx := context.Background()
	d := func(k, v string) Descriptor { return Descriptor{Entries: []rules.Entry{{Key: k, Value: v}}} }
	check := func(want Code, wantCodes []Code, wantRemaining []int64, ds ...Descriptor) {
		t.Helper()
		var res Result
		if err := e.CheckAt(ctx, t0, &Request{Domain: "rl", Descriptors: ds}, &res); err != nil {
			t.Fatal(err)
		}
		if res.Code != want {
			t.Fatalf("overall %v, want %v: %+v", res.Code, want, res.Statuses)
		}
		for i := range wantCodes {
			if st := res.Statuses[i]; st.Code != wantCodes[i] || st.Remaining != wantRemaining[i] {
				t.Fatalf("status %d: %v remaining %d, want %v remaining %d", i, st.Code, st.Remaining, wantCodes[i], wantRemaining[i])
			}
		}
	}
	one, two, foo := d("service", "service_1"), d("service", "service_2"), d("foo", "x")
	check(OK, []Code{OK}, []int64{0}, one)
	check(OverLimit, []Code{OverLimit}, []int64{0}, one) // its only quota is over
	// service_2 still has room: the request passes, service_1 says over.
	check(OK, []Code{OverLimit, OK, OK}, []int64{0, 1, 4}, one, two, foo)
	check(OK, []Code{OverLimit, OK, OK}, []int64{0, 0, 3}, one, two, foo)
	// Now both quotas are over: denied, and foo spends nothing.
	check(OverLimit, []Code{OverLimit, OverLimit, OK}, []int64{0, 0, 3}, one, two, foo)
	check(OverLimit, []Code{OverLimit, OverLimit, OK}, []int64{0, 0, 3}, one, two, foo)
	check(OK, []Code{OK}, []int64{2}, foo)

	// A request's own limit on a quota-mode descriptor is an ordinary limit,
	// as Envoy's ratelimit builds one: it denies although service_2 has room.
	e = envoyEngine(t, `domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5}
`)
	own := d("service", "service_1")
	own.Limit = &Override{RequestsPerUnit: 1, Unit: rules.Minute}
	check(OK, nil, nil, own, two)
	check(OverLimit, []Code{OverLimit, OK}, []int64{0, 4}, own, two)
}

// TestCountDenied: with SetCountDenied a pop-scope limit counts denied hits
// as Envoy's ratelimit does (the parity cases "hits 2, 2, then 1 on 3/min"
// and "two descriptors, one over"); without it a denied request spends
// nothing; a check-only descriptor counts nothing either way.
func TestCountDenied(t *testing.T) {
	const text = "domain: d\ndescriptors:\n  - key: foo\n    rate_limit: {unit: minute, requests_per_unit: 2}\n    descriptors:\n      - key: bar\n        rate_limit: {unit: minute, requests_per_unit: 3}\n"
	ctx := context.Background()
	foo := Descriptor{Entries: []rules.Entry{{Key: "foo", Value: "a"}}}
	bar := Descriptor{Entries: []rules.Entry{{Key: "foo", Value: "a"}, {Key: "bar", Value: "x"}}}
	run := func(count bool) (third Code, barRemaining int64) {
		e := envoyEngine(t, text)
		e.SetCountDenied(count)
		var res Result
		for i, h := range []int64{2, 2, 1} {
			if err := e.CheckAt(ctx, t0, &Request{Domain: "d", HitsAddend: h, Descriptors: []Descriptor{bar}}, &res); err != nil {
				t.Fatal(err)
			}
			if i == 2 {
				third = res.Code
			}
		}
		peek := bar
		peek.HitsAddend = ptr(int64(0))
		for range 3 {
			if err := e.CheckAt(ctx, t0.Add(5*time.Minute), &Request{Domain: "d", Descriptors: []Descriptor{peek}}, &res); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 3 { // foo (2/min) denies the third; bar (3/min) had room
			if err := e.CheckAt(ctx, t0.Add(5*time.Minute), &Request{Domain: "d", Descriptors: []Descriptor{bar, foo}}, &res); err != nil {
				t.Fatal(err)
			}
			if want := OK; i < 2 && (res.Code != want || res.Statuses[0].Remaining != int64(2-i)) {
				t.Fatalf("count %v: request %d after the check-only ones: %v, bar remaining %d; the checks counted", count, i, res.Code, res.Statuses[0].Remaining)
			}
		}
		return third, res.Statuses[0].Remaining
	}
	if third, rem := run(false); third != OK || rem != 1 {
		t.Errorf("default: third request %v (want OK), bar remaining %d (want 1: the denial spent nothing)", third, rem)
	}
	if third, rem := run(true); third != OverLimit || rem != 0 {
		t.Errorf("counting denied hits: third request %v (want OVER_LIMIT), bar remaining %d (want 0)", third, rem)
	}
}
