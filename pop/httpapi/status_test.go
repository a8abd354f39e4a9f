package httpapi

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
	"github.com/edgelimit/edgelimit/pop/topkeys"
)

// sampleStatus is a replicated PoP on Redis in fallback, one region cut
// off, rules whose last reload failed with an error that quotes HTML.
func sampleStatus() *Status {
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	failing, errAt := t0.Add(time.Minute), t0.Add(2*time.Minute)
	heard, counts := 0.4, 1.2
	return &Status{
		PoP: "eu-1", Region: "eu", Listen: "127.0.0.1:8080", Version: "edgelimit v1.2.3",
		Started: t0, Now: t0.Add(3 * time.Hour), UptimeSeconds: 3 * 3600,
		Ready: false, NotReady: "store: dial tcp 10.0.0.9:6379: connection refused",
		Store: StoreStatus{Kind: "redis", Address: "redis://10.0.0.9:6379", Error: "dial tcp 10.0.0.9:6379: connection refused",
			FailingSince: &failing, Breaker: "open", FallbackDecisions: 42, Keys: 7},
		Rules: RulesStatus{Files: []string{"/etc/edgelimit/<b>rules</b>.yaml"}, Domains: 2, Limits: 5, LoadedAt: t0,
			Loads: 3, Failures: 1, LastError: `rules.yaml:3: unknown unit "<script>alert(1)</script>"`, LastErrorAt: &errAt},
		Repl: &ReplicationStatus{NATS: "CONNECTED", NATSURL: "nats://127.0.0.1:4222", Connected: true, GlobalShare: 0.5,
			Unreachable: []string{"us"},
			Peers: []PeerStatus{
				{PoP: "eu-2", Region: "eu", BeaconAgoSeconds: &heard, DataAgoSeconds: &counts},
				{PoP: "us-1", Region: "us", RegionUnreachable: true},
			}},
		Traffic: TrafficStatus{RateSeconds: 10, RequestsPerSecond: 1234.5, DecisionsPerSecond: 2000, DeniedPerSecond: 12.5,
			Requests: 100000, Decisions: 150000, Denied: 900, Mitigated: 40, MitigationBits: 3},
	}
}

func statusServer(t *testing.T, st *Status) *httptest.Server {
	t.Helper()
	set, err := rules.NewSet(rules.NewDomain("d", "test", &rules.Node{}))
	if err != nil {
		t.Fatal(err)
	}
	eng := pop.NewEngine(store.NewMemory(store.MemoryConfig{}), set, nil)
	cfg := Config{Engine: eng}
	if st != nil {
		cfg.Status = func() *Status { return st }
	}
	srv := httptest.NewServer(New(cfg))
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, url string, header ...string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultTransport.RoundTrip(req) // no redirects followed
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// The page states each fact of the status, escapes what comes from files
// and errors, loads nothing from anywhere and runs no script.
func TestStatusPage(t *testing.T) {
	srv := statusServer(t, sampleStatus())
	resp, page := get(t, srv.URL+"/status", "Accept", "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8")
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /status: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("Content-Security-Policy %q does not forbid scripts and remote assets", csp)
	}
	for _, want := range []string{
		"PoP eu-1", "in region eu", "not ready", "connection refused", "edgelimit v1.2.3", "up 3 h 0 min",
		"redis://10.0.0.9:6379", "unreachable", "open", "fallback", "42 checks",
		"5 limits in 2 domains", "/etc/edgelimit/&lt;b&gt;rules&lt;/b&gt;.yaml", "3 ok, 1 failed", "failed",
		"&lt;script&gt;alert(1)&lt;/script&gt;",
		"CONNECTED", "50%", "partitioned", ">us<", "eu-2", "0.4 s ago", "1.2 s ago", "us-1", "never", "region cut off",
		"1235/s", "13/s", "900 since start", "40 of them by a mitigation bit", "mitigation bits in force</th><td>3",
		`http-equiv="refresh"`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page does not show %q", want)
		}
	}
	for _, bad := range []string{"<script", "<b>rules", "src=", "http://", "https://"} {
		if strings.Contains(page, bad) {
			t.Errorf("the page holds %q", bad)
		}
	}
}

// ?format=json, or a client that accepts JSON and not HTML, gets the same
// facts as JSON.
func TestStatusJSON(t *testing.T) {
	srv := statusServer(t, sampleStatus())
	for _, c := range []struct{ url, accept string }{
		{"/status?format=json", "text/html"},
		{"/status", "application/json"},
	} {
		resp, body := get(t, srv.URL+c.url, "Accept", c.accept)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("%s (Accept %s): %d %s", c.url, c.accept, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		var got Status
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Fatal(err)
		}
		if got.PoP != "eu-1" || got.Rules.Limits != 5 || got.Repl == nil || len(got.Repl.Peers) != 2 ||
			*got.Repl.Peers[0].BeaconAgoSeconds != 0.4 || got.Repl.Peers[1].BeaconAgoSeconds != nil || got.Store.Breaker != "open" {
			t.Fatalf("%s: %+v", c.url, got)
		}
	}
	if _, body := get(t, srv.URL+"/status?format=html", "Accept", "application/json"); !strings.HasPrefix(body, "<!DOCTYPE html>") {
		t.Errorf("?format=html did not win over Accept")
	}
}

// GET / leads to the status page; other unknown paths stay the API's JSON
// 404, and without a status source / is one too.
func TestStatusRoot(t *testing.T) {
	srv := statusServer(t, sampleStatus())
	resp, _ := get(t, srv.URL+"/")
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "/status" {
		t.Fatalf("GET /: %d, Location %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if resp, _ := get(t, srv.URL+"/nope"); resp.StatusCode != 404 {
		t.Fatalf("GET /nope: %d", resp.StatusCode)
	}
	bare := statusServer(t, nil)
	for _, path := range []string{"/", "/status"} {
		if resp, body := get(t, bare.URL+path); resp.StatusCode != 404 || !strings.Contains(body, "NOT_FOUND") {
			t.Fatalf("without Status, GET %s: %d %s", path, resp.StatusCode, body)
		}
	}
}

// A PoP that does not replicate says so; one alone in its topology too.
func TestStatusWithoutReplication(t *testing.T) {
	st := sampleStatus()
	st.Repl = nil
	_, page := get(t, statusServer(t, st).URL+"/status")
	if !strings.Contains(page, "runs without <code>--region</code>") {
		t.Errorf("a PoP without replication: the page does not say replication is off")
	}
	st = sampleStatus()
	st.Repl.Peers = nil
	_, page = get(t, statusServer(t, st).URL+"/status")
	if !strings.Contains(page, "alone in its topology") {
		t.Errorf("a PoP alone in its topology: the page does not say so")
	}
}

func TestHumanSeconds(t *testing.T) {
	for v, want := range map[float64]string{0.04: "0.0 s", 2.25: "2.2 s", 42.4: "42 s", 65: "1 min 5 s", 7260: "2 h 1 min", 90000: "1 d 1 h", -1: "–"} {
		if got := humanSeconds(v); got != want {
			t.Errorf("humanSeconds(%v) = %q, want %q", v, got, want)
		}
	}
}

// The page lists the most limited keys, escaped, as /v1/top would; not when
// /v1/top is hidden (they may be API keys).
func TestStatusTopKeys(t *testing.T) {
	set, err := rules.NewSet(rules.NewDomain("d", "test", &rules.Node{}))
	if err != nil {
		t.Fatal(err)
	}
	eng := pop.NewEngine(store.NewMemory(store.MemoryConfig{}), set, nil)
	top := topkeys.New(10)
	top.Add([]byte("key<b>1</b>"), 7)
	top.Add([]byte("key2"), 2)
	for _, hide := range []bool{false, true} {
		srv := httptest.NewServer(New(Config{Engine: eng, TopKeys: top, HideMitigations: hide, Status: sampleStatus}))
		_, page := get(t, srv.URL+"/status")
		_, body := get(t, srv.URL+"/status?format=json")
		srv.Close()
		var st Status
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatal(err)
		}
		if hide {
			if strings.Contains(page, "Most limited keys") || st.Top != nil {
				t.Errorf("with /v1/top hidden, the status lists the most limited keys")
			}
			continue
		}
		want := "key&lt;b&gt;1&lt;/b&gt;" // within rules.DescribeKey's rendering
		if !strings.Contains(page, want) || !strings.Contains(page, "Of 9 denials counted") || strings.Contains(page, "<b>1") {
			t.Errorf("the page does not list the most limited key %q, escaped, of 9 denials", want)
		}
		if st.Top == nil || st.Top.Total != 9 || len(st.Top.Keys) != 2 || st.Top.Keys[0].Count != 7 {
			t.Errorf("JSON top_limited_keys: %+v", st.Top)
		}
	}
}
