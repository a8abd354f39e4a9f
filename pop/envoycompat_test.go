package pop

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
)

// profileEngine loads text with opts into an engine on the embedded store.
func profileEngine(t *testing.T, opts rules.Options, text string, m *Metrics) *Engine {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	set, _, err := rules.LoadWith(opts, p)
	if err != nil {
		t.Fatal(err)
	}
	return NewEngine(store.NewMemory(store.MemoryConfig{}), set, m)
}

const oneAMinute = `domain: api
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: q
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: s
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// Shadow mode (SHADOW_MODE): a request a limit denies is answered OK, its
// status still OVER_LIMIT, and the answer is counted; off, it is denied.
func TestShadowMode(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := profileEngine(t, rules.Options{}, oneAMinute, NewMetrics(reg))
	ctx := context.Background()
	r := req(1, []string{"k", "a"})
	var res Result
	if err := e.CheckAt(ctx, t0, r, &res); err != nil || res.Code != OK {
		t.Fatalf("1st: %v %+v", err, res)
	}
	if err := e.CheckAt(ctx, t0, r, &res); err != nil || res.Code != OverLimit {
		t.Fatalf("2nd, shadow mode off: %v %+v, want OVER_LIMIT", err, res)
	}
	e.SetShadowMode(true)
	if err := e.CheckAt(ctx, t0, r, &res); err != nil || res.Code != OK || res.Statuses[0].Code != OverLimit {
		t.Fatalf("3rd, shadow mode on: %v %+v, want OK with the status OVER_LIMIT", err, res)
	}
	m, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := -1.0
	for _, f := range m {
		if f.GetName() == "edgelimit_shadow_mode_answers_total" {
			n = f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if n != 1 {
		t.Errorf("edgelimit_shadow_mode_answers_total = %v, want 1", n)
	}
}

// Quota mode for every limit (QUOTA_MODE): a request is over only when
// every descriptor is over a limit, so one that matches no limit keeps it
// within its quotas, as Envoy's ratelimit counts such a descriptor as a
// quota descriptor that passed.
func TestQuotaModeEverywhere(t *testing.T) {
	e := profileEngine(t, rules.Options{QuotaMode: true}, oneAMinute, nil)
	e.SetQuotaMode(true)
	ctx := context.Background()
	var res Result
	both := req(1, []string{"k", "a"}, []string{"q", "a"})
	if err := e.CheckAt(ctx, t0, both, &res); err != nil || res.Code != OK {
		t.Fatalf("1st: %v %+v", err, res)
	}
	withOther := req(1, []string{"k", "a"}, []string{"nothing", "a"})
	if err := e.CheckAt(ctx, t0, withOther, &res); err != nil || res.Code != OK || res.Statuses[0].Code != OverLimit {
		t.Fatalf("k over beside a descriptor that matches nothing: %v %+v, want OK with k OVER_LIMIT", err, res)
	}
	if err := e.CheckAt(ctx, t0, both, &res); err != nil || res.Code != OverLimit {
		t.Fatalf("both over: %v %+v, want OVER_LIMIT", err, res)
	}
	// The same descriptor twice, both occurrences over: the second is no
	// descriptor that matched nothing, so the request is over, as the peer
	// answers it.
	twice := req(1, []string{"q", "a"}, []string{"q", "a"})
	if err := e.CheckAt(ctx, t0, twice, &res); err != nil || res.Code != OverLimit {
		t.Fatalf("the same descriptor twice, over: %v %+v, want OVER_LIMIT", err, res)
	}
	// A shadow limit is never over: its descriptor keeps the request within
	// its quotas, as the peer answers a shadow descriptor OK.
	shadow := req(1, []string{"s", "a"})
	for i := range 2 {
		if err := e.CheckAt(ctx, t0, shadow, &res); err != nil || res.Code != OK {
			t.Fatalf("shadow, check %d: %v %+v, want OK", i, err, res)
		}
	}
}

// The header sets: ParseHeaderSet reads the groups, and the envoy set
// reports the descriptor with the least remaining, or the last one over its
// limit, under the configured names, with the reset in seconds.
func TestHeaderSets(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want HeaderSet
		err  string
	}{
		{"edgelimit", DefaultHeaders, ""},
		{"none", 0, ""},
		{"envoy", HeadersEnvoy, ""},
		{"x-ratelimit, retry-after", HeadersXRateLimit | HeadersRetryAfter, ""},
		{"ietf,envoy", HeadersIETF | HeadersEnvoy, ""},
		{"none,envoy", 0, "cannot be combined"},
		{"x-rate", 0, `unknown header group "x-rate"`},
		{"", 0, "no header groups"},
	} {
		got, err := ParseHeaderSet(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseHeaderSet(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseHeaderSet(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}

	e := profileEngine(t, rules.Options{}, `domain: api
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: fixed_window}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: fixed_window}
`, nil)
	ctx := context.Background()
	var res Result
	r := req(1, []string{"a", "x"}, []string{"b", "x"})
	if err := e.CheckAt(ctx, t0, r, &res); err != nil {
		t.Fatal(err)
	}
	h := &Headers{Set: HeadersEnvoy, EnvoyNames: [3]string{"", "X-Left", ""}}
	got := h.AppendFields(nil, t0, &res)
	reset := Seconds(res.Statuses[1].Reset)
	want := []Field{{"RateLimit-Limit", "3"}, {"X-Left", "2"}, {"RateLimit-Reset", strconv.FormatInt(reset, 10)}}
	if len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("envoy fields %v, want %v (b has the least remaining)", got, want)
	}
	if reset < 1 || reset > 60 {
		t.Errorf("reset %d s, want seconds until the minute ends", reset)
	}
	// b spent: the request is denied, and b is the one over.
	for range 2 {
		_ = e.CheckAt(ctx, t0, req(1, []string{"b", "x"}), &res)
	}
	if err := e.CheckAt(ctx, t0, r, &res); err != nil || res.Code != OverLimit {
		t.Fatalf("%v %+v", err, res)
	}
	if got := h.AppendFields(nil, t0, &res); len(got) != 3 || got[0].Value != "3" || got[1].Value != "0" {
		t.Fatalf("envoy fields %v, want b's limit 3 and remaining 0", got)
	}
	// The default set is HeaderValues' fields, in order; none is none.
	def := (*Headers)(nil).AppendFields(nil, t0, &res)
	vals := HeaderValues(t0, &res)
	if len(def) != len(vals) {
		t.Fatalf("default fields %v, want HeaderValues' %v", def, vals)
	}
	if got := (&Headers{}).AppendFields(nil, t0, &res); len(got) != 0 {
		t.Fatalf("no set: %v, want none", got)
	}
	if got := (&Headers{Set: HeadersRetryAfter}).AppendFields(nil, t0, &res); len(got) != 1 || got[0].Name != "Retry-After" {
		t.Fatalf("retry-after alone: %v", got)
	}
}

// A request's own limit on a descriptor that matches no limit counts with
// SetOverrideAlgorithm's algorithm: with fixed windows (the profile's), a
// denial waits until the window ends, as Envoy's ratelimit's does, not into
// the next window as the sliding window's would.
func TestOverrideAlgorithm(t *testing.T) {
	for _, tc := range []struct {
		alg      limit.Algorithm
		longest  time.Duration
		shortest time.Duration
	}{
		{limit.FixedWindow, time.Minute, 0},
		{limit.SlidingWindow, 2 * time.Minute, time.Minute + time.Nanosecond},
	} {
		t.Run(tc.alg.String(), func(t *testing.T) {
			e := profileEngine(t, rules.Options{}, oneAMinute, nil)
			e.SetOverrideAlgorithm(tc.alg)
			r := req(1, []string{"nothing", "a"})
			r.Descriptors[0].Limit = &Override{RequestsPerUnit: 1, Unit: rules.Minute}
			var res Result
			ctx := context.Background()
			if err := e.CheckAt(ctx, t0, r, &res); err != nil || res.Code != OK {
				t.Fatalf("1st: %v %+v", err, res)
			}
			if err := e.CheckAt(ctx, t0, r, &res); err != nil || res.Code != OverLimit {
				t.Fatalf("2nd: %v %+v", err, res)
			}
			if w := res.Statuses[0].RetryAfter; w > tc.longest || w < tc.shortest {
				t.Errorf("a denial waits %v, want between %v and %v", w, tc.shortest, tc.longest)
			}
		})
	}
}

// With denied hits counted (SetCountDenied, on with --envoy-compat), the
// descriptors a request names after the one that denies it count their hits
// too, as Envoy's ratelimit counts every descriptor's: when they count other
// hits than the denying one (a descriptor's own hits_addend) and when a key
// named twice makes them count other hits (the peer's f2fb157 answers b's
// remaining 7 after the second request below, and 6 after the third), and a
// key named twice after the denying one.
func TestCountDeniedAfterTheDenial(t *testing.T) {
	const text = `domain: api
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 10}
`
	ctx := context.Background()
	hits := func(n int64) *int64 { return &n }
	remaining := func(t *testing.T, e *Engine, key string) int64 {
		t.Helper()
		var res Result
		if err := e.CheckAt(ctx, t0, req(1, []string{key, "x"}), &res); err != nil || res.Code != OK {
			t.Fatalf("%s: %v %+v", key, err, res)
		}
		return res.Statuses[0].Remaining
	}
	t.Run("own hits", func(t *testing.T) {
		e := profileEngine(t, rules.Options{}, text, nil)
		e.SetCountDenied(true)
		r := req(1, []string{"a", "x"}, []string{"b", "x"})
		r.Descriptors[0].HitsAddend, r.Descriptors[1].HitsAddend = hits(6), hits(2)
		var res Result
		if err := e.CheckAt(ctx, t0, r, &res); err != nil || res.Code != OverLimit || res.Statuses[1].Remaining != 8 {
			t.Fatalf("a over, b after it: %v %+v, want OVER_LIMIT and b's remaining 8", err, res)
		}
		if got := remaining(t, e, "b"); got != 7 {
			t.Errorf("b's remaining after 2+1 hits = %d, want 7", got)
		}
	})
	t.Run("a key twice", func(t *testing.T) {
		e := profileEngine(t, rules.Options{}, text, nil)
		e.SetCountDenied(true)
		three := func(h int64) *Request { return req(h, []string{"a", "x"}, []string{"b", "x"}, []string{"a", "x"}) }
		var res Result
		if err := e.CheckAt(ctx, t0, three(1), &res); err != nil || res.Code != OK {
			t.Fatalf("1st: %v %+v", err, res)
		}
		if err := e.CheckAt(ctx, t0, three(2), &res); err != nil || res.Code != OverLimit || res.Statuses[1].Remaining != 7 {
			t.Fatalf("2nd, a's second occurrence over: %v %+v, want OVER_LIMIT and b's remaining 7", err, res)
		}
		if got := remaining(t, e, "b"); got != 6 {
			t.Errorf("b's remaining after 1+2+1 hits = %d, want 6", got)
		}
	})
	t.Run("a key twice after the denial", func(t *testing.T) {
		e := profileEngine(t, rules.Options{}, text, nil)
		e.SetCountDenied(true)
		var res Result
		if err := e.CheckAt(ctx, t0, req(9, []string{"b", "x"}), &res); err != nil || res.Code != OK {
			t.Fatalf("1st: %v %+v", err, res)
		}
		r := req(2, []string{"b", "x"}, []string{"a", "x"}, []string{"a", "x"})
		if err := e.CheckAt(ctx, t0, r, &res); err != nil || res.Code != OverLimit || res.Statuses[1].Remaining != 3 || res.Statuses[2].Remaining != 1 {
			t.Fatalf("2nd, b over: %v %+v, want OVER_LIMIT and a's remaining 3 and 1", err, res)
		}
		if got := remaining(t, e, "a"); got != 0 {
			t.Errorf("a's remaining after 2+2+1 hits = %d, want 0", got)
		}
	})
}
