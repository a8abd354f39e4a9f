package grpcapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
)

// metadataRules is Envoy's ratelimit's test/config/metadata.yaml, in the
// domain the fixture asks about.
const metadataRules = `domain: api
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
        metadata:
          name: service_1
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata:
      service_with_quota:
        name: service_2
`

func loadText(t *testing.T, text string) *rules.Set {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	set, _, err := rules.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// With Envoy's ratelimit's settings the gRPC answer is the peer's: a
// malformed request fails with Unknown, response_headers_to_add holds the
// envoy set alone, and dynamic_metadata the request and the metadata of the
// limits of the descriptors within them.
func TestEnvoyCompatGRPC(t *testing.T) {
	f := start(t, func(c *Config) {
		c.EnvoyCompat, c.DynamicMetadata = true, true
		c.Headers = &pop.Headers{Set: pop.HeadersEnvoy}
	})
	f.engine.SetRules(loadText(t, metadataRules))
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()

	_, err := f.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("key2", "x")}})
	if status.Code(err) != codes.Unknown {
		t.Fatalf("empty domain: %v, want Unknown as Envoy's ratelimit answers", err)
	}

	d1 := desc("key1", "value1", "subkey1", "a")
	d1.HitsAddend = wrapperspb.UInt64(2)
	r := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{d1, desc("key2", "b")}}
	resp := check(t, f, r)
	if resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("1st: %v", resp)
	}
	h := headers(resp.ResponseHeadersToAdd)
	if len(h) != 3 || h["RateLimit-Limit"] != "1" || h["RateLimit-Remaining"] != "0" || h["RateLimit-Reset"] != "50" {
		t.Errorf("headers %v, want key2's RateLimit-Limit 1, -Remaining 0, -Reset 50 alone", h)
	}
	md := resp.GetDynamicMetadata().AsMap()
	want := map[string]any{
		"domain": "api",
		"descriptors": []any{
			map[string]any{"entries": []any{"key1=value1", "subkey1=a"}, "hitsAddend": 2.0},
			map[string]any{"entries": []any{"key2=b"}},
		},
		"metadata": map[string]any{"name": "service_1", "service_with_quota": map[string]any{"name": "service_2"}},
	}
	if !reflect.DeepEqual(md, want) {
		t.Errorf("dynamic metadata %v, want %v", md, want)
	}

	// key2 over: its metadata is left out, as the peer leaves out a
	// descriptor that did not pass.
	resp = check(t, f, r)
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("2nd: %v", resp)
	}
	if got := resp.GetDynamicMetadata().AsMap()["metadata"]; !reflect.DeepEqual(got, map[string]any{"name": "service_1"}) {
		t.Errorf("2nd: metadata %v, want key1's alone", got)
	}

	// A descriptor with its own limit (an override) brings no metadata: the
	// peer's override is a limit of its own, without the rule's metadata.
	d2 := desc("key1", "value1", "subkey1", "c")
	d2.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 9, Unit: typev3.RateLimitUnit_HOUR}
	resp = check(t, f, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{d2}})
	if got, ok := resp.GetDynamicMetadata().AsMap()["metadata"]; resp.OverallCode != rlsv3.RateLimitResponse_OK || ok {
		t.Errorf("override: %v, metadata %v; want OK and no metadata", resp.OverallCode, got)
	}

	// Without the settings: InvalidArgument, edgelimit's fields, no metadata.
	g := start(t)
	g.engine.SetRules(loadText(t, metadataRules))
	_, err = g.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("key2", "x")}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("empty domain, defaults: %v, want InvalidArgument", err)
	}
	resp = check(t, g, r)
	if h := headers(resp.ResponseHeadersToAdd); h["X-Ratelimit-Limit"] == "" || h["RateLimit-Limit"] != "" || resp.DynamicMetadata != nil {
		t.Errorf("defaults: headers %v, metadata %v; want edgelimit's fields and no metadata", h, resp.DynamicMetadata)
	}
}

// /json with Envoy's ratelimit's settings keeps response_headers_to_add in
// the body, as the peer's /json does, and sends no HTTP rate limit fields.
func TestEnvoyCompatJSON(t *testing.T) {
	eng := pop.NewEngine(store.NewMemory(store.MemoryConfig{}), loadText(t, metadataRules), nil)
	h := NewJSONHandler(Config{Engine: eng, Now: func() time.Time { return t0 }, EnvoyCompat: true,
		Headers: &pop.Headers{Set: pop.HeadersEnvoy}})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	resp, body := postRaw(t, srv.URL, `{"domain":"api","descriptors":[{"entries":[{"key":"key2","value":"j"}]}]}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	out := strict(t, body)
	if got := headers(out.ResponseHeadersToAdd); got["RateLimit-Remaining"] != "0" || got["RateLimit-Limit"] != "1" {
		t.Errorf("body's headers %v, want key2's", got)
	}
	if resp.Header.Get("RateLimit-Limit") != "" || resp.Header.Get("X-Ratelimit-Limit") != "" {
		t.Errorf("HTTP headers %v, want no rate limit fields", resp.Header)
	}
}

// BenchmarkShouldRateLimitProfile is BenchmarkShouldRateLimit's hot key with
// edgelimit's fields, with the envoy fields instead, and with dynamic
// metadata too: what Envoy's ratelimit's settings cost a call.
func BenchmarkShouldRateLimitProfile(b *testing.B) {
	for _, p := range []struct {
		name string
		set  func(*Config)
	}{
		{"default", func(*Config) {}},
		{"envoy-headers", func(c *Config) { c.Headers = &pop.Headers{Set: pop.HeadersEnvoy} }},
		{"envoy-headers+metadata", func(c *Config) { c.Headers, c.DynamicMetadata = &pop.Headers{Set: pop.HeadersEnvoy}, true }},
	} {
		b.Run(p.name, func(b *testing.B) {
			eng := pop.NewEngine(store.NewMemory(store.MemoryConfig{}), testRules(b), nil)
			cfg := Config{Engine: eng}
			p.set(&cfg)
			s, reqs := New(cfg), benchRequests(1)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.ShouldRateLimit(ctx, reqs[0]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// With Envoy's ratelimit's settings current_limit carries a name only where
// the rule gives one, and none for a descriptor with its own limit, as the
// peer answers (its integration test compares whole responses); without
// them every limit is named.
func TestEnvoyCompatNames(t *testing.T) {
	const text = `domain: api
descriptors:
  - key: named
    rate_limit: {unit: minute, requests_per_unit: 5, name: gold}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 5}
`
	over := desc("named", "b")
	over.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 9, Unit: typev3.RateLimitUnit_HOUR}
	r := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("named", "a"), desc("plain", "a"), over}}
	names := func(resp *rlsv3.RateLimitResponse) []string {
		var out []string
		for _, st := range resp.GetStatuses() {
			out = append(out, st.GetCurrentLimit().GetName())
		}
		return out
	}
	f := start(t, func(c *Config) { c.EnvoyCompat = true })
	f.engine.SetRules(loadText(t, text))
	if got, want := names(check(t, f, r)), []string{"gold", "", ""}; !reflect.DeepEqual(got, want) {
		t.Errorf("with the profile: names %q, want %q", got, want)
	}
	g := start(t)
	g.engine.SetRules(loadText(t, text))
	for i, n := range names(check(t, g, r)) {
		if n == "" {
			t.Errorf("without the profile: status %d has no name", i)
		}
	}
}
