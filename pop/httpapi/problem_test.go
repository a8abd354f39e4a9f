package httpapi

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"
)

// TestAuthzDenialIsProblemDetails: a forward-auth denial, which the proxy
// passes to the client, is problem details of the ratelimit-headers draft's
// quota-exceeded type, naming the violated policy, and keeps the error object.
func TestAuthzDenialIsProblemDetails(t *testing.T) {
	srv, _ := newTestServer(t, 0)
	get := func() *http.Response {
		req, _ := http.NewRequest("GET", srv.URL+"/v1/authz", nil)
		req.Header.Set("X-Real-IP", "192.0.2.44")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for i := range 30 { // per_ip is 30/min
		resp := get()
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("check %d: %d", i, resp.StatusCode)
		}
	}
	resp := get()
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var p struct {
		Type     string   `json:"type"`
		Title    string   `json:"title"`
		Status   int      `json:"status"`
		Violated []string `json:"violated-policies"`
		Error    struct {
			Code       string `json:"code"`
			RetryAfter int    `json:"retry_after"`
		} `json:"error"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		t.Fatalf("not JSON (%v): %s", err, raw)
	}
	if resp.StatusCode != 429 || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("%d %q, want 429 application/problem+json", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if p.Type != quotaExceeded || p.Title == "" || p.Status != 429 || len(p.Violated) != 1 || p.Violated[0] != "per_ip" {
		t.Fatalf("problem %+v, want quota-exceeded, status 429, violated [per_ip]: %s", p, raw)
	}
	if p.Error.Code != "RATE_LIMITED" || p.Error.RetryAfter < 1 {
		t.Fatalf("error member %+v: %s", p.Error, raw)
	}
}
