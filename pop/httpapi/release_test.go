package httpapi

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/limit/limittest"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
)

// newLeaseServer serves api_key with 1 request in flight (lease 5 s).
func newLeaseServer(t testing.TB) (*httptest.Server, *clock) {
	root := &rules.Node{}
	root.Child("api_key", "").Add(&rules.Limit{Domain: "api_platform", Path: "api_key", Name: "in_flight",
		LeaseTTL: 5 * time.Second, Spec: limit.Spec{Limit: 1, Window: int64(5 * time.Second)}})
	set, err := rules.NewSet(rules.NewDomain("api_platform", "test", root))
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{t: limittest.T0}
	eng := pop.NewEngine(store.NewMemory(store.MemoryConfig{}), set, nil)
	eng.UseLeases(store.NewLeases())
	srv := httptest.NewServer(New(Config{Engine: eng, Now: c.now}))
	t.Cleanup(srv.Close)
	return srv, c
}

const keyCheck = `{"domain":"api_platform","descriptors":[{"entries":[{"key":"api_key","value":"k"}]}]}`

func TestCheckLeaseAndRelease(t *testing.T) {
	srv, c := newLeaseServer(t)
	resp, body := post(t, srv.URL+"/v1/check", keyCheck)
	lease, _ := body["lease_id"].(string)
	if resp.StatusCode != 200 || lease == "" || resp.Header.Get("X-RateLimit-Lease") != lease {
		t.Fatalf("check: %d %v, header %q; want 200 with the lease in the body and the header", resp.StatusCode, body, resp.Header.Get("X-RateLimit-Lease"))
	}
	if p := resp.Header.Get("RateLimit-Policy"); p != `"in_flight";q=1;qu="concurrent-requests"` {
		t.Errorf("RateLimit-Policy %q", p)
	}
	c.t = c.t.Add(time.Second)
	resp, body = post(t, srv.URL+"/v1/check", keyCheck)
	if resp.StatusCode != 429 || body["lease_id"] != nil || resp.Header.Get("Retry-After") != "4" {
		t.Fatalf("second check: %d %v Retry-After %q; want 429 without a lease, retry in 4", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
	if e := body["error"].(map[string]any); e["window"] != "concurrent" {
		t.Errorf("429 body window %v, want concurrent", e["window"])
	}

	// Idempotent: the first release frees the slot, the second finds nothing.
	for i, want := range []string{`"released":true,"state":"released"`, `"released":false,"state":"unknown"`} {
		raw := bodyOf(t, srv.URL+"/v1/release", `{"lease_ids":["`+lease+`"]}`)
		if want = `{"results":[{"lease_id":"` + lease + `",` + want + `}]}`; raw != want {
			t.Fatalf("release %d: %s, want %s", i, raw, want)
		}
	}
	if resp, body := post(t, srv.URL+"/v1/check", keyCheck); resp.StatusCode != 200 || body["lease_id"] == nil {
		t.Fatalf("after release: %d %v", resp.StatusCode, body)
	}
}

// bodyOf posts body to url and returns the response body; it must be a 200.
func bodyOf(t testing.TB, url, body string) string {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: %d %s", url, resp.StatusCode, raw)
	}
	return string(raw)
}

func TestReleaseExpiredLease(t *testing.T) {
	srv, c := newLeaseServer(t)
	_, body := post(t, srv.URL+"/v1/check", keyCheck)
	c.t = c.t.Add(6 * time.Second)
	raw := bodyOf(t, srv.URL+"/v1/release", `{"lease_id":"`+body["lease_id"].(string)+`"}`)
	if !strings.Contains(raw, `"released":false,"state":"expired"`) {
		t.Fatalf("release after the TTL: %s", raw)
	}
}

func TestReleaseBadInput(t *testing.T) {
	srv, _ := newLeaseServer(t)
	_, body := post(t, srv.URL+"/v1/check", keyCheck)
	good := body["lease_id"].(string)
	for _, c := range []struct{ body, field string }{
		{`{"lease_id":"nope"}`, "lease_id"},
		{`{"lease_ids":["` + good + `","x"]}`, "lease_ids[1]"},
		{`{"lease_ids":[]}`, "lease_ids"},
		{`{}`, "lease_ids"},
		{`{"lease_id":"` + good + `","lease_ids":["` + good + `"]}`, "lease_ids"},
		{`{"lease":"` + good + `"}`, ""},
		{`{"lease_ids":[` + strings.Repeat(`"`+good+`",`, MaxRelease) + `"` + good + `"]}`, "lease_ids"},
	} {
		resp, m := post(t, srv.URL+"/v1/release", c.body)
		e, _ := m["error"].(map[string]any)
		if resp.StatusCode != 400 || e == nil || (c.field != "" && e["field"] != c.field) {
			t.Errorf("%.60s: %d %v, want 400 naming %q", c.body, resp.StatusCode, m, c.field)
		}
	}
	// A batch with a malformed id released nothing: the good lease still holds.
	if resp, _ := post(t, srv.URL+"/v1/check", keyCheck); resp.StatusCode != 429 {
		t.Fatalf("the good lease was released by a rejected request: %d", resp.StatusCode)
	}
	if resp, _ := post(t, srv.URL+"/v1/release", `not json`); resp.StatusCode != 400 {
		t.Fatalf("malformed JSON: %d", resp.StatusCode)
	}
}

// The fast path reads exactly what the strict decoder reads, or steps aside.
func FuzzOneLeaseID(f *testing.F) {
	f.Add([]byte(`{"lease_id":"AQIDBAUGBwgJCgsMDQ4PEAECAwQFBgcICQoLDA0ODxA"}`))
	f.Add([]byte(`{"lease_id":"a\"b"}`))
	f.Add([]byte(`{"lease_id":""}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		id, ok := oneLeaseID(body)
		if !ok {
			return
		}
		var req releaseRequest
		if err := decodeStrict(body, &req); err != nil || req.LeaseID == nil || *req.LeaseID != id || req.LeaseIDs != nil {
			t.Fatalf("fast path read %q from %q; the strict decoder: %v %+v", id, body, err, req)
		}
	})
}
