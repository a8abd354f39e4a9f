package pop

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
	"github.com/edgelimit/edgelimit/pop/store/redistest"
)

const shadowQuotaRules = `domain: d
descriptors:
  - key: five
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: q
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: s
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
`

// With denied hits counted (the Envoy profile), shadow and quota-mode limits
// count every hit, as Envoy's ratelimit increments every descriptor's counter
// before it compares: past their limit, and beside a descriptor that denies.
// Without it, a shadow limit stops counting at its limit. The answers are the
// peer's, on the embedded store and on Redis.
func TestCountDeniedShadowAndQuota(t *testing.T) {
	p := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(p, []byte(shadowQuotaRules), 0o644); err != nil {
		t.Fatal(err)
	}
	set, _, err := rules.LoadWith(rules.Options{DefaultAlgorithm: limit.FixedWindow}, p)
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		code      Code    // the request's
		codes     []Code  // each status's (a shadow limit's is OK)
		remaining []int64 // each status's
	}
	type step struct {
		hits  int64
		descs [][]string
		want  want
	}
	d := func(k, v string) []string { return []string{k, v} }
	w := func(code Code, codes []Code, rem ...int64) want { return want{code, codes, rem} }
	cs := func(c ...Code) []Code { return c }
	counted := []step{
		{2, [][]string{d("s", "u")}, w(OK, cs(OK), 1)},
		{2, [][]string{d("s", "u")}, w(OK, cs(OK), 0)}, // 4 of 3
		{1, [][]string{d("s", "u")}, w(OK, cs(OK), 0)},
		{2, [][]string{d("q", "u")}, w(OK, cs(OK), 1)},
		{2, [][]string{d("q", "u")}, w(OverLimit, cs(OverLimit), 0)}, // 4 of 3
		{1, [][]string{d("q", "u")}, w(OverLimit, cs(OverLimit), 0)},
		{1, [][]string{d("five", "sd"), d("s", "d")}, w(OK, cs(OK, OK), 4, 2)},
		{9, [][]string{d("five", "sd"), d("s", "d")}, w(OverLimit, cs(OverLimit, OK), 0, 0)}, // s: 10 of 3
		{1, [][]string{d("s", "d")}, w(OK, cs(OK), 0)},
		// The same shadow descriptor twice: the first occurrence fits, the
		// second does not, and both are counted (4 of 3).
		{2, [][]string{d("s", "t"), d("s", "t")}, w(OK, cs(OK, OK), 1, 0)},
		{1, [][]string{d("s", "t")}, w(OK, cs(OK), 0)},
		{1, [][]string{d("five", "t"), d("s", "t")}, w(OK, cs(OK, OK), 4, 0)},
	}
	// Without counting denied hits: the shadow limit stays at 2 and then
	// takes the third hit; beside a denial it counts nothing.
	uncounted := []step{
		{2, [][]string{d("s", "u")}, w(OK, cs(OK), 1)},
		{2, [][]string{d("s", "u")}, w(OK, cs(OK), 1)},
		{1, [][]string{d("s", "u")}, w(OK, cs(OK), 0)},
		{1, [][]string{d("five", "sd"), d("s", "d")}, w(OK, cs(OK, OK), 4, 2)},
		{9, [][]string{d("five", "sd"), d("s", "d")}, w(OverLimit, cs(OverLimit, OK), 4, 2)},
		{1, [][]string{d("s", "d")}, w(OK, cs(OK), 1)},
	}
	stores := []struct {
		name string
		open func(t *testing.T) Store
	}{
		{"memory", func(t *testing.T) Store { return store.NewMemory(store.MemoryConfig{}) }},
		{"redis", func(t *testing.T) Store {
			srv := redistest.Start(t)
			s, err := store.OpenRedis(store.RedisConfig{URL: srv.URL(), ClockSource: store.ClockLocal})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}},
	}
	ctx := context.Background()
	now := t0.Add(time.Second)
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			for _, tc := range []struct {
				name  string
				count bool
				steps []step
			}{{"counted", true, counted}, {"uncounted", false, uncounted}} {
				t.Run(tc.name, func(t *testing.T) {
					e := NewEngine(st.open(t), set, nil)
					e.SetCountDenied(tc.count)
					for i, s := range tc.steps {
						r := req(s.hits, s.descs...)
						r.Domain = "d"
						var res Result
						if err := e.CheckAt(ctx, now, r, &res); err != nil {
							t.Fatalf("step %d: %v", i, err)
						}
						got := want{code: res.Code}
						for _, st := range res.Statuses {
							got.codes = append(got.codes, st.Code)
							got.remaining = append(got.remaining, st.Remaining)
						}
						if fmt.Sprint(got) != fmt.Sprint(s.want) {
							t.Errorf("step %d (%d hits on %v): got %v, want %v", i, s.hits, s.descs, got, s.want)
						}
					}
				})
			}
		})
	}
}
