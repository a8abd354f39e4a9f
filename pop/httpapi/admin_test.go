package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/limit/limittest"
	"github.com/edgelimit/edgelimit/pop/quota"
	"github.com/edgelimit/edgelimit/pop/quota/pgtest"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
)

const adminRules = `domain: api_platform
tenants:
  key: api_key
  default_tier: free
  tiers:
    - name: free
      rate_limit: {unit: minute, requests_per_unit: 100, scope: global}
    - name: pro
      rate_limit: {unit: minute, requests_per_unit: 1000, scope: global}
    - name: enterprise
      rate_limit: {unit: minute, requests_per_unit: 5000, scope: global}
descriptors:
  - key: api_key
    descriptors:
      - key: endpoint
        value: "POST /api/v1/orders"
        rate_limit: {unit: minute, requests_per_unit: 20}
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 30}
`

const adminToken = "s3cret-token"

// newAdmin serves the admin API over st with adminRules.
func newAdmin(t *testing.T, st quota.Store) (*httptest.Server, *pop.Engine) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(p, []byte(adminRules), 0o644); err != nil {
		t.Fatal(err)
	}
	set, _, err := rules.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	eng := pop.NewEngine(store.NewMemory(store.MemoryConfig{}), set, nil)
	srv := httptest.NewServer(NewAdmin(AdminConfig{Store: st, Engine: eng, Token: adminToken, Now: func() time.Time { return limittest.T0 }}))
	t.Cleanup(srv.Close)
	return srv, eng
}

func adminStores(t *testing.T) map[string]func(*testing.T) quota.Store {
	return map[string]func(*testing.T) quota.Store{
		"postgres": func(t *testing.T) quota.Store { return pgtest.Store(t) },
		"file":     func(t *testing.T) quota.Store { return mustFile(t) },
	}
}

// openAPI loads the served document, validated (examples included).
func openAPI(t *testing.T) (*openapi3.T, routers.Router) {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(openAPIDoc)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background(), openapi3.EnableExamplesValidation()); err != nil {
		t.Fatalf("the OpenAPI document is not valid: %v", err)
	}
	r, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return doc, r
}

// call sends a request to the admin API and checks the answer against the
// OpenAPI document: the route and status must be documented and the body
// must match its schema. validReq says whether the request itself must
// match the document (bad input is sent on purpose).
func call(t *testing.T, srv *httptest.Server, router routers.Router, method, path, body, token string, validReq bool) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatalf("%s %s: %d, body is not JSON: %q", method, path, resp.StatusCode, raw)
		}
	}
	// Validate against the document: the URL without the test server's host.
	vreq, _ := http.NewRequest(method, path, strings.NewReader(body))
	vreq.Header = req.Header.Clone()
	route, params, err := router.FindRoute(vreq)
	if err != nil {
		t.Fatalf("%s %s is not in the OpenAPI document: %v", method, path, err)
	}
	in := &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, IncludeResponseStatus: true}}
	if validReq {
		if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
			t.Fatalf("%s %s: the request does not match the document: %v", method, path, err)
		}
	}
	rin := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
		Body: io.NopCloser(bytes.NewReader(raw)), Options: in.Options}
	if err := openapi3filter.ValidateResponse(context.Background(), rin); err != nil {
		t.Fatalf("%s %s: the answer %d %s does not match the document: %v", method, path, resp.StatusCode, raw, err)
	}
	return resp.StatusCode, out
}

func errField(out map[string]any) string {
	e, _ := out["error"].(map[string]any)
	f, _ := e["field"].(string)
	return f
}

// Every route the admin API serves is in the OpenAPI document, and every
// path and method of the document is served.
func TestAdminOpenAPIRoutes(t *testing.T) {
	doc, _ := openAPI(t)
	var documented, served []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			documented = append(documented, method+" "+path)
		}
	}
	for _, r := range adminRoutes {
		served = append(served, r.method+" "+r.path)
	}
	slices.Sort(documented)
	slices.Sort(served)
	if !slices.Equal(documented, served) {
		t.Fatalf("the document and the handlers differ:\ndocumented %v\nserved     %v", documented, served)
	}
	// And the mux really serves each of them (not the 404 catch-all).
	srv, _ := newAdmin(t, mustFile(t))
	for _, r := range adminRoutes {
		req, _ := http.NewRequest(r.method, srv.URL+strings.ReplaceAll(r.path, "{api_key}", "k"), nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusMethodNotAllowed || bytes.Contains(b, []byte("no such admin route")) {
			t.Errorf("%s %s is not served: %d %s", r.method, r.path, resp.StatusCode, b)
		}
	}
}

func mustFile(t *testing.T) quota.Store {
	f, err := quota.OpenFile(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// The document's examples are what the handlers answer: the PUT example is
// accepted and answered as the 201 example, and the walk-through of
// docs/tenants.md, bad input included, answers only what the document describes.
func TestAdminWalkThrough(t *testing.T) {
	_, router := openAPI(t)
	doc, _ := openapi3.NewLoader().LoadFromData(openAPIDoc)
	put := doc.Paths.Find("/admin/v1/quotas/{api_key}").Put
	example, _ := json.Marshal(put.RequestBody.Value.Content.Get("application/json").Example)
	want201 := put.Responses.Value("201").Value.Content.Get("application/json").Example.(map[string]any)

	for name, open := range adminStores(t) {
		t.Run(name, func(t *testing.T) {
			srv, _ := newAdmin(t, open(t))
			// 401 without a token, with a wrong one, with another scheme.
			for _, tok := range []string{"", "wrong", adminToken + "x"} {
				if code, out := call(t, srv, router, "GET", "/admin/v1/quotas/abc123", "", tok, false); code != 401 || errField(out) != "Authorization" {
					t.Fatalf("token %q: %d %v, want 401", tok, code, out)
				}
			}
			code, out := call(t, srv, router, "PUT", "/admin/v1/quotas/abc123", string(example), adminToken, true)
			if code != 201 {
				t.Fatalf("PUT example: %d %v", code, out)
			}
			delete(out, "updated_at")
			delete(want201, "updated_at")
			if fmt.Sprint(out) != fmt.Sprint(want201) {
				t.Fatalf("PUT answered %v, the document's example is %v", out, want201)
			}
			if code, _ := call(t, srv, router, "PUT", "/admin/v1/quotas/abc123", `{"tier":"pro"}`, adminToken, true); code != 200 {
				t.Fatalf("second PUT: %d, want 200", code)
			}
			if code, out := call(t, srv, router, "GET", "/admin/v1/quotas/abc123", "", adminToken, true); code != 200 || out["tier"] != "pro" {
				t.Fatalf("GET: %d %v", code, out)
			}
			for i, k := range []string{"p1", "p2", "f1"} {
				tier := []string{"pro", "pro", "free"}[i]
				call(t, srv, router, "PUT", "/admin/v1/quotas/"+k, `{"tier":"`+tier+`"}`, adminToken, true)
			}
			code, out = call(t, srv, router, "GET", "/admin/v1/quotas?tier=pro&limit=2", "", adminToken, true)
			if code != 200 || len(out["quotas"].([]any)) != 2 || out["next"] != "p1" {
				t.Fatalf("list page 1: %d %v", code, out)
			}
			code, out = call(t, srv, router, "GET", "/admin/v1/quotas?tier=pro&limit=2&after=p1", "", adminToken, true)
			if code != 200 || len(out["quotas"].([]any)) != 1 || out["next"] != nil {
				t.Fatalf("list page 2: %d %v", code, out)
			}
			code, out = call(t, srv, router, "GET", "/admin/v1/usage/abc123", "", adminToken, true)
			if code != 200 || len(out["usage"].([]any)) != 2 {
				t.Fatalf("usage: %d %v", code, out)
			}
			if code, out := call(t, srv, router, "GET", "/admin/v1/audit/abc123", "", adminToken, true); code != 200 || len(out["entries"].([]any)) != 2 {
				t.Fatalf("audit: %d %v", code, out)
			}
			if code, _ := call(t, srv, router, "DELETE", "/admin/v1/quotas/abc123", "", adminToken, true); code != 204 {
				t.Fatalf("DELETE: %d", code)
			}
			if code, _ := call(t, srv, router, "GET", "/admin/v1/quotas/abc123", "", adminToken, true); code != 404 {
				t.Fatalf("GET after DELETE: %d", code)
			}
			if code, _ := call(t, srv, router, "DELETE", "/admin/v1/quotas/abc123", "", adminToken, true); code != 404 {
				t.Fatalf("DELETE again: %d", code)
			}
			bad := []struct{ method, path, body, field string }{
				{"PUT", "/admin/v1/quotas/k", `{"tier":"gold"}`, "tier"},
				{"PUT", "/admin/v1/quotas/k", `{"overrides":[{"descriptor":"tier:pro","requests_per_unit":5,"unit":"fortnight"}]}`, "overrides[0].unit"},
				{"PUT", "/admin/v1/quotas/k", `{"overrides":[{"descriptor":"remote_address","requests_per_unit":5,"unit":"minute"}]}`, "overrides[0].descriptor"},
				{"PUT", "/admin/v1/quotas/k", `{"overrides":[{"descriptor":"tier:pro","requests_per_unit":-5,"unit":"minute"}]}`, "overrides[0].requests_per_unit"},
				{"PUT", "/admin/v1/quotas/k", `{"overrides":[{"descriptor":"tier:pro","requests_per_unit":"many","unit":"minute"}]}`, "overrides.requests_per_unit"},
				{"PUT", "/admin/v1/quotas/k", `{"tier":"pro","colour":"red"}`, "colour"},
				{"PUT", "/admin/v1/quotas/k", `{"tier":"pro"`, "body"},
				{"PUT", "/admin/v1/quotas/k", `{"effective_at":"2026-02-01T00:00:00Z","expires_at":"2026-01-01T00:00:00Z"}`, "expires_at"},
				{"PUT", "/admin/v1/quotas/" + strings.Repeat("k", 65), `{}`, "api_key"},
				{"GET", "/admin/v1/quotas?limit=0", "", "limit"},
				{"GET", "/admin/v1/usage/k?domain=nope", "", "domain"},
			}
			for _, b := range bad {
				code, out := call(t, srv, router, b.method, b.path, b.body, adminToken, false)
				if code != 400 || errField(out) != b.field {
					t.Errorf("%s %s %s: %d %v, want 400 naming %s", b.method, b.path, b.body, code, out, b.field)
				}
			}
			// Nothing bad was stored.
			if code, _ := call(t, srv, router, "GET", "/admin/v1/quotas/k", "", adminToken, true); code != 404 {
				t.Fatalf("a rejected PUT stored a quota: %d", code)
			}
		})
	}
}
