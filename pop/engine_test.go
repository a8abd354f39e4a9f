package pop

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/limit/limittest"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
)

var t0 = limittest.T0

func lim(domain, path string, n int64, u rules.Unit) *rules.Limit {
	return &rules.Limit{Domain: domain, Path: path, Name: path, Unit: u,
		Spec: limit.Spec{Algorithm: limit.SlidingWindow, Limit: n, Window: int64(u.Duration())}}
}

// testRules is the seed's rule file, built by hand:
// api_key 100/min, api_key+endpoint "POST /api/v1/orders" 20/min,
// remote_address 30/min, plus a shadow and an unlimited descriptor.
func testRules(t testing.TB) *rules.Set {
	root := &rules.Node{}
	root.Child("api_key", "").Add(lim("api", "api_key", 100, rules.Minute))
	root.Child("api_key", "").Child("endpoint", "POST /api/v1/orders").Add(lim("api", "api_key.endpoint=POST /api/v1/orders", 20, rules.Minute))
	root.Child("remote_address", "").Add(lim("api", "remote_address", 30, rules.Minute))
	sh := lim("api", "user", 1, rules.Minute)
	sh.Shadow = true
	root.Child("user", "").Add(sh)
	root.Child("internal", "").Add(&rules.Limit{Domain: "api", Path: "internal", Name: "internal", Unlimited: true})
	set, err := rules.NewSet(rules.NewDomain("api", "test", root))
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func req(hits int64, descs ...[]string) *Request {
	r := &Request{Domain: "api", HitsAddend: hits}
	for _, d := range descs {
		var es []rules.Entry
		for i := 0; i+1 < len(d); i += 2 {
			es = append(es, rules.Entry{Key: d[i], Value: d[i+1]})
		}
		r.Descriptors = append(r.Descriptors, Descriptor{Entries: es})
	}
	return r
}

func newTestEngine(t testing.TB) *Engine {
	return NewEngine(store.NewMemory(store.MemoryConfig{}), testRules(t), nil)
}

func TestMostRestrictiveDecides(t *testing.T) {
	e := newTestEngine(t)
	ctx := context.Background()
	var res Result
	orders := []string{"api_key", "abc", "endpoint", "POST /api/v1/orders"}
	ip := []string{"remote_address", "1.2.3.4"}
	for i := range 20 {
		if err := e.CheckAt(ctx, t0, req(1, orders, ip), &res); err != nil {
			t.Fatal(err)
		}
		if res.Code != OK {
			t.Fatalf("check %d denied: %+v", i, res)
		}
	}
	// The nested endpoint limit (20/min) is the strictest and is now spent.
	if err := e.CheckAt(ctx, t0.Add(time.Second), req(1, orders, ip), &res); err != nil {
		t.Fatal(err)
	}
	if res.Code != OverLimit || res.Statuses[0].Code != OverLimit || res.Statuses[1].Code != OK {
		t.Fatalf("21st order: want OVER_LIMIT on the endpoint descriptor only, got %+v", res)
	}
	if got := res.Statuses[0].Limit.Name; got != "api_key.endpoint=POST /api/v1/orders" {
		t.Fatalf("decisive limit %q", got)
	}
	if res.Decisive != 0 || req(1, orders).Descriptors[0].Describe() != "api_key:abc:endpoint:POST /api/v1/orders" {
		t.Fatalf("decisive %d", res.Decisive)
	}
	if res.Statuses[0].RetryAfter <= 0 {
		t.Fatalf("denial without RetryAfter: %+v", res.Statuses[0])
	}
	// The denied request spent nothing of the IP limit: 30 − 20 = 10 left.
	if got := res.Statuses[1].Remaining; got != 10 {
		t.Fatalf("remote_address remaining %d after a denied request, want 10", got)
	}
	// Another endpoint of the same key is held only by api_key's 100/min.
	if err := e.CheckAt(ctx, t0.Add(time.Second), req(1, []string{"api_key", "abc", "endpoint", "GET /x"}), &res); err != nil {
		t.Fatal(err)
	}
	if res.Code != OK || res.Statuses[0].Limit != nil {
		t.Fatalf("GET /x leaves the tree at endpoint: want OK with no limit, got %+v", res.Statuses[0])
	}
	if err := e.CheckAt(ctx, t0.Add(time.Second), req(1, []string{"api_key", "abc"}), &res); err != nil {
		t.Fatal(err)
	}
	// Envoy semantics: a descriptor gets the limits of the node its last entry
	// reaches, so the nested order checks did not count against api_key alone.
	if res.Code != OK || res.Statuses[0].Remaining != 99 {
		t.Fatalf("api_key alone: %+v", res.Statuses[0])
	}
	if len(res.Policies) != 1 || res.Policies[0].Name != "api_key" {
		t.Fatalf("policies %v", res.Policies)
	}
}

func TestShadowUnlimitedUnknown(t *testing.T) {
	e := newTestEngine(t)
	ctx := context.Background()
	var res Result
	for range 3 { // the shadow limit is 1/min and never denies
		if err := e.CheckAt(ctx, t0, req(1, []string{"user", "u1"}), &res); err != nil || res.Code != OK {
			t.Fatalf("shadow: %v %+v", err, res)
		}
	}
	if err := e.CheckAt(ctx, t0, req(1000, []string{"internal", "x"}), &res); err != nil || res.Code != OK || res.Decisive != -1 {
		t.Fatalf("unlimited: %v %+v", err, res)
	}
	r := req(1, []string{"api_key", "abc"})
	r.Domain = "nope"
	if err := e.CheckAt(ctx, t0, r, &res); err != nil || res.Code != OK || len(res.Statuses) != 1 {
		t.Fatalf("unknown domain: %v %+v", err, res)
	}
}

// countingStore counts the store steps a check takes.
type countingStore struct {
	Store
	calls int
}

func (c *countingStore) CheckAt(ctx context.Context, now, hits int64, items []limit.Item, out []limit.Decision) error {
	c.calls++
	return c.Store.CheckAt(ctx, now, hits, items, out)
}

// TestRepeatedDescriptorCountsEach: a descriptor sent three times is charged
// three times, each occurrence seeing the ones before it, as Envoy's
// ratelimit charges them — in one store step, so all or nothing.
func TestRepeatedDescriptorCountsEach(t *testing.T) {
	st := &countingStore{Store: store.NewMemory(store.MemoryConfig{})}
	e := NewEngine(st, testRules(t), nil)
	var res Result
	ip := []string{"remote_address", "9.9.9.9"}
	if err := e.CheckAt(context.Background(), t0, req(1, ip, ip, ip), &res); err != nil {
		t.Fatal(err)
	}
	for i, want := range []int64{29, 28, 27} {
		if s := res.Statuses[i]; s.Code != OK || s.Limit == nil || s.Remaining != want {
			t.Fatalf("status %d: %+v, want OK with %d remaining", i, s, want)
		}
	}
	if res.Decisive != 2 || st.calls != 1 {
		t.Fatalf("decisive %d, %d store steps; want 2 and 1", res.Decisive, st.calls)
	}
	if err := e.CheckAt(context.Background(), t0, req(1, ip), &res); err != nil || res.Statuses[0].Remaining != 26 {
		t.Fatalf("after: %v %+v", err, res.Statuses[0])
	}
	// 26 left: 25 and 2 do not fit together; nothing is spent.
	r := req(0, ip, ip)
	r.Descriptors[0].HitsAddend, r.Descriptors[1].HitsAddend = ptr(int64(25)), ptr(int64(2))
	if err := e.CheckAt(context.Background(), t0, r, &res); err != nil || res.Code != OverLimit ||
		res.Statuses[0].Code != OK || res.Statuses[0].Remaining != 26 || res.Statuses[1].Code != OverLimit || res.Decisive != 1 {
		t.Fatalf("25 and 2: %v %+v", err, res)
	}
}

// TestRepeatedKeyDeniedFirst: a repeated key makes the items count different
// hits (2 and 1), which takes a store step per group; the peek before them
// puts the group that denies first, so the request spends nothing.
func TestRepeatedKeyDeniedFirst(t *testing.T) {
	st := &countingStore{Store: store.NewMemory(store.MemoryConfig{})}
	e := NewEngine(st, testRules(t), nil)
	ctx := context.Background()
	var res Result
	ip, key := []string{"remote_address", "8.8.8.8"}, []string{"api_key", "k"}
	if err := e.CheckAt(ctx, t0, req(30, ip), &res); err != nil || res.Code != OK {
		t.Fatalf("fill: %v %+v", err, res)
	}
	st.calls = 0
	if err := e.CheckAt(ctx, t0, req(1, key, key, ip), &res); err != nil || res.Code != OverLimit ||
		res.Statuses[0].Remaining != 100 || res.Statuses[1].Remaining != 100 || res.Statuses[2].Code != OverLimit {
		t.Fatalf("denied: %v %+v", err, res)
	}
	if st.calls != 3 { // the peek, the denying group, the other group peeked at
		t.Fatalf("%d store steps, want 3", st.calls)
	}
	if err := e.CheckAt(ctx, t0, req(1, key), &res); err != nil || res.Statuses[0].Remaining != 99 {
		t.Fatalf("api_key after: %v %+v", err, res.Statuses[0])
	}
}

// TestRepeatedShadowCountDenied: with denied hits counted, a denied request
// counts a repeated key's hits after the decision — a shadow limit's too,
// as Envoy's ratelimit counts every descriptor's hits.
func TestRepeatedShadowCountDenied(t *testing.T) {
	e := newTestEngine(t)
	e.SetCountDenied(true)
	ctx := context.Background()
	var res Result
	ip, user := []string{"remote_address", "7.7.7.7"}, []string{"user", "u"}
	if err := e.CheckAt(ctx, t0, req(30, ip), &res); err != nil || res.Code != OK {
		t.Fatalf("fill: %v %+v", err, res)
	}
	r := req(1, user, user, ip)
	r.Descriptors[0].HitsAddend = ptr(int64(0))
	if err := e.CheckAt(ctx, t0, r, &res); err != nil || res.Code != OverLimit ||
		!res.Statuses[0].Shadow || res.Statuses[0].Remaining != 1 || res.Statuses[1].Remaining != 0 {
		t.Fatalf("denied: %v %+v", err, res)
	}
	peek := req(1, user)
	peek.Descriptors[0].HitsAddend = ptr(int64(0))
	if err := e.CheckAt(ctx, t0, peek, &res); err != nil || res.Statuses[0].Remaining != 0 {
		t.Fatalf("shadow after: %v %+v, want none remaining: the denied request counted its hit on it", err, res.Statuses[0])
	}
}

func TestHitsAddend(t *testing.T) {
	e := newTestEngine(t)
	var res Result
	ip := []string{"remote_address", "5.5.5.5"}
	ctx := context.Background()
	if err := e.CheckAt(ctx, t0, req(25, ip), &res); err != nil || res.Code != OK || res.Statuses[0].Remaining != 5 {
		t.Fatalf("25 hits: %v %+v", err, res.Statuses[0])
	}
	if err := e.CheckAt(ctx, t0, req(6, ip), &res); err != nil || res.Code != OverLimit || res.Statuses[0].Remaining != 5 {
		t.Fatalf("6 more hits: %v %+v", err, res.Statuses[0])
	}
}

func TestRequestValidation(t *testing.T) {
	long := string(make([]byte, MaxValueBytes+1))
	many := make([]Descriptor, MaxDescriptors+1)
	for i := range many {
		many[i] = Descriptor{Entries: []rules.Entry{{Key: "k", Value: strconv.Itoa(i)}}}
	}
	cases := []struct {
		name, field string
		r           Request
	}{
		{"no domain", "domain", Request{Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "k"}}}}}},
		{"no descriptors", "descriptors", Request{Domain: "api"}},
		{"too many descriptors", "descriptors", Request{Domain: "api", Descriptors: many}},
		{"descriptor hits", "descriptors[0].hits_addend", Request{Domain: "api", Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "k"}}, HitsAddend: ptr(int64(-1))}}}},
		{"override limit", "descriptors[0].limit.requests_per_unit", Request{Domain: "api", Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "k"}}, Limit: &Override{RequestsPerUnit: -1}}}}},
		{"override unit", "descriptors[0].limit.unit", Request{Domain: "api", Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "k"}}, Limit: &Override{RequestsPerUnit: 1, Unit: 99}}}}},
		{"empty key", "descriptors[0].entries[0].key", Request{Domain: "api", Descriptors: []Descriptor{{Entries: []rules.Entry{{Value: "v"}}}}}},
		{"long value", "descriptors[0].entries[0].value", Request{Domain: "api", Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "k", Value: long}}}}}},
		{"negative hits", "hits_addend", Request{Domain: "api", HitsAddend: -1, Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "k"}}}}}},
		{"huge hits", "hits_addend", Request{Domain: "api", HitsAddend: MaxHits + 1, Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "k"}}}}}},
	}
	e := newTestEngine(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var res Result
			err := e.CheckAt(context.Background(), t0, &c.r, &res)
			var re *RequestError
			if !errors.As(err, &re) || re.Field != c.field {
				t.Fatalf("got %v, want a RequestError on %s", err, c.field)
			}
		})
	}
}

func TestRulesSwap(t *testing.T) {
	e := newTestEngine(t)
	var res Result
	ip := []string{"remote_address", "7.7.7.7"}
	ctx := context.Background()
	_ = e.CheckAt(ctx, t0, req(10, ip), &res)
	root := &rules.Node{}
	root.Child("remote_address", "").Add(lim("api", "remote_address", 12, rules.Minute))
	set, _ := rules.NewSet(rules.NewDomain("api", "test", root))
	e.SetRules(set)
	// The counts survive the reload; only the quota changed.
	if err := e.CheckAt(ctx, t0, req(1, ip), &res); err != nil || res.Statuses[0].Remaining != 1 {
		t.Fatalf("after reload: %v %+v", err, res.Statuses[0])
	}
}

func benchEngine(b *testing.B, keys int, parallel bool) {
	e := newTestEngine(b)
	ctx := context.Background()
	reqs := make([]*Request, min(keys, 1<<16))
	for i := range reqs {
		reqs[i] = req(1, []string{"remote_address", fmt.Sprint("10.0.", i/256, ".", i%256)})
	}
	if keys > len(reqs) {
		// Spread over keys by varying a second hidden component: use api_key values.
		reqs = make([]*Request, 1<<16)
		for i := range reqs {
			reqs[i] = req(1, []string{"api_key", strconv.Itoa(i * (keys / len(reqs)))})
		}
		var res Result
		for k := range keys { // pre-populate every key
			_ = e.CheckAt(ctx, t0, req(1, []string{"api_key", strconv.Itoa(k)}), &res)
		}
	}
	now := t0.Add(time.Second)
	b.ReportAllocs()
	b.ResetTimer()
	if parallel {
		b.RunParallel(func(pb *testing.PB) {
			var res Result
			i := 0
			for pb.Next() {
				_ = e.CheckAt(ctx, now, reqs[i%len(reqs)], &res)
				i++
			}
		})
		return
	}
	var res Result
	for i := 0; b.Loop(); i++ {
		_ = e.CheckAt(ctx, now, reqs[i%len(reqs)], &res)
	}
}

// BenchmarkEngineCheck is the whole in-process decision: validation, rule
// matching, key building and the embedded store.
func BenchmarkEngineCheck(b *testing.B) {
	for _, keys := range []int{1, 1 << 20} {
		b.Run(fmt.Sprintf("keys=%d/serial", keys), func(b *testing.B) { benchEngine(b, keys, false) })
		b.Run(fmt.Sprintf("keys=%d/parallel", keys), func(b *testing.B) { benchEngine(b, keys, true) })
	}
}
