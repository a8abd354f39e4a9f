package grpcapi

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/httpapi"
	"github.com/edgelimit/edgelimit/pop/limit/limittest"
	"github.com/edgelimit/edgelimit/pop/store"
)

// jsonServer serves /json and /v1/check (with DecodeProto) over one engine
// on testRules, as a PoP wires them.
func jsonServer(t *testing.T) *httptest.Server {
	eng := pop.NewEngine(store.NewMemory(store.MemoryConfig{}), testRules(t), nil)
	now := limittest.T0.Add(18e9)
	mux := http.NewServeMux()
	mux.Handle("/json", NewJSONHandler(Config{Engine: eng, Now: func() time.Time { return now }}))
	mux.Handle("/", httpapi.New(httpapi.Config{Engine: eng, DecodeProto: DecodeJSON, Now: func() time.Time { return now }}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func postRaw(t *testing.T, url, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// strict parses b as Envoy's RateLimitResponse the strict way: unknown fields
// are errors (protojson's DiscardUnknown false).
func strict(t *testing.T, b []byte) *rlsv3.RateLimitResponse {
	t.Helper()
	var out rlsv3.RateLimitResponse
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(b, &out); err != nil {
		t.Fatalf("not a strict RateLimitResponse (%v): %s", err, b)
	}
	return &out
}

// TestJSONEndpoint: /json takes Envoy's protobuf JSON in either spelling and
// answers a RateLimitResponse that protojson parses strictly — camelCase,
// 200 or 429 as Envoy's ratelimit answers — with the rate limit headers as
// HTTP headers; unlimited descriptors report 4294967295.
func TestJSONEndpoint(t *testing.T) {
	srv := jsonServer(t)
	camel := `{"domain":"api","hitsAddend":1,"descriptors":[{"entries":[{"key":"remote_address","value":"1.2.3.4"}]},{"entries":[{"key":"internal","value":"x"}]}]}`
	snake := `{"domain":"api","hits_addend":1,"descriptors":[{"entries":[{"key":"remote_address","value":"1.2.3.4"}]},{"entries":[{"key":"internal","value":"x"}]}]}`
	for i, body := range []string{camel, snake, camel} { // remote_address is 3/min
		resp, b := postRaw(t, srv.URL+"/json", body)
		if resp.StatusCode != 200 {
			t.Fatalf("check %d: %d %s", i, resp.StatusCode, b)
		}
		if strings.Contains(string(b), "overall_code") || strings.Contains(string(b), "limit_remaining") {
			t.Fatalf("check %d: snake_case in the answer: %s", i, b)
		}
		r := strict(t, b)
		if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != uint32(2-i) || r.Statuses[0].CurrentLimit.RequestsPerUnit != 3 {
			t.Fatalf("check %d: %v", i, r)
		}
		if r.Statuses[1].LimitRemaining != 4294967295 || r.Statuses[1].CurrentLimit != nil {
			t.Fatalf("check %d: unlimited status %v", i, r.Statuses[1])
		}
		if len(r.ResponseHeadersToAdd) != 0 || resp.Header.Get("RateLimit") == "" {
			t.Fatalf("check %d: headers belong in HTTP headers: %v / %v", i, r.ResponseHeadersToAdd, resp.Header)
		}
	}
	resp, b := postRaw(t, srv.URL+"/json", camel)
	if r := strict(t, b); resp.StatusCode != 429 || r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("4th: %d %s", resp.StatusCode, b)
	}
	for _, bad := range []string{`{"domain":"api","descriptors":[{"entries":[{"key":"k","value":"v"}]}],"hit_addend":1}`, `{"descriptors":[]}`, `not json`} {
		resp, b := postRaw(t, srv.URL+"/json", bad)
		if resp.StatusCode != 400 || !strings.HasPrefix(string(b), `{"error":{"code":"BAD_REQUEST","message":`) {
			t.Errorf("%s: %d %s, want a 400 JSON error", bad, resp.StatusCode, b)
		}
	}
}

// TestCheckAcceptsProtoJSON: /v1/check takes Envoy's protobuf JSON too
// (camelCase, integers as strings, units by number) and gives it the same
// meaning as the snake_case form; an unknown field is still a 400 naming it.
func TestCheckAcceptsProtoJSON(t *testing.T) {
	srv := jsonServer(t)
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"api_key","value":"k"}],"hitsAddend":"5","limit":{"requestsPerUnit":7,"unit":2}}]}`
	resp, b := postRaw(t, srv.URL+"/v1/check", body)
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"requests_per_unit":7,"unit":"MINUTE"},"limit_remaining":2`) {
		t.Fatalf("camelCase check: %d %s", resp.StatusCode, b)
	}
	resp, b = postRaw(t, srv.URL+"/v1/check", `{"domain":"api","descriptors":[{"entries":[{"key":"api_key","value":"k"}]}],"hitAddend":1}`)
	if resp.StatusCode != 400 || !strings.Contains(string(b), "hitAddend") {
		t.Fatalf("unknown field: %d %s", resp.StatusCode, b)
	}
}
