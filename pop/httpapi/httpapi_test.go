package httpapi

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/limit/limittest"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
	"github.com/edgelimit/edgelimit/pop/topkeys"
)

// clock is a settable test clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func lim(path string, n int64, u rules.Unit, name string) *rules.Limit {
	return &rules.Limit{Domain: "api_platform", Path: path, Name: name, Unit: u,
		Spec: limit.Spec{Algorithm: limit.SlidingWindow, Limit: n, Window: int64(u.Duration())}}
}

// newTestServer serves the seed's rules: api_key 100/min ("default"), the
// orders endpoint of a key 20/min ("writes"), remote_address 30/min, with a
// forward_auth section.
func newTestServer(t testing.TB, denyStatus int) (*httptest.Server, *clock) {
	root := &rules.Node{}
	root.Child("api_key", "").Add(lim("api_key", 100, rules.Minute, "default"))
	root.Child("api_key", "").Child("endpoint", "POST /api/v1/orders").Add(lim("api_key.endpoint", 20, rules.Minute, "writes"))
	root.Child("remote_address", "").Add(lim("remote_address", 30, rules.Minute, "per_ip"))
	dom := rules.NewDomain("api_platform", "test", root)
	dom.ForwardAuth = &rules.ForwardAuth{DenyStatus: denyStatus, Descriptors: [][]rules.AuthEntry{
		{{Key: "remote_address", From: "client_ip"}},
		{{Key: "api_key", From: "header:X-API-Key"}, {Key: "endpoint", From: "method_path"}},
	}}
	set, err := rules.NewSet(dom)
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{t: limittest.T0.Add(18 * time.Second)}
	eng := pop.NewEngine(store.NewMemory(store.MemoryConfig{}), set, nil)
	srv := httptest.NewServer(New(Config{Engine: eng, Now: c.now}))
	t.Cleanup(srv.Close)
	return srv, c
}

func post(t testing.TB, url, body string) (*http.Response, map[string]any) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("response is not JSON (%v): %s", err, raw)
	}
	return resp, m
}

const ordersCheck = `{"domain":"api_platform","descriptors":[` +
	`{"entries":[{"key":"api_key","value":"abc123"},{"key":"endpoint","value":"POST /api/v1/orders"}]},` +
	`{"entries":[{"key":"api_key","value":"abc123"}]}],"hits_addend":1}`

func TestCheckAllowedThenDenied(t *testing.T) {
	srv, _ := newTestServer(t, 0)
	for i := range 20 {
		resp, body := post(t, srv.URL+"/v1/check", ordersCheck)
		if resp.StatusCode != 200 || body["overall_code"] != "OK" {
			t.Fatalf("check %d: %d %v", i, resp.StatusCode, body)
		}
		if i == 0 {
			// 20/min writes, 1 spent: the writes limit is the most restrictive.
			want := map[string]string{
				"X-Ratelimit-Limit":     "20",
				"X-Ratelimit-Remaining": "19",
				"X-Ratelimit-Reset":     strconv.FormatInt(limittest.T0.Unix()+60, 10),
				"Ratelimit-Policy":      `"writes";q=20;w=60, "default";q=100;w=60`,
				"Ratelimit":             `"writes";r=19;t=42`,
			}
			for h, v := range want {
				if got := resp.Header.Get(h); got != v {
					t.Errorf("%s: %q, want %q", h, got, v)
				}
			}
			if resp.Header.Get("Retry-After") != "" {
				t.Error("Retry-After on an allowed check")
			}
			st := body["statuses"].([]any)
			first := st[0].(map[string]any)
			cl := first["current_limit"].(map[string]any)
			if first["code"] != "OK" || cl["requests_per_unit"] != 20.0 || cl["unit"] != "MINUTE" || first["limit_remaining"] != 19.0 || first["duration_until_reset"] != "42s" {
				t.Errorf("status 0: %v", first)
			}
		}
	}
	resp, body := post(t, srv.URL+"/v1/check", ordersCheck)
	if resp.StatusCode != 429 || body["overall_code"] != "OVER_LIMIT" {
		t.Fatalf("21st order: %d %v", resp.StatusCode, body)
	}
	ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	rl := resp.Header.Get("RateLimit")
	if ra <= 0 || rl != fmt.Sprintf(`"writes";r=0;t=%d`, ra) {
		t.Fatalf("Retry-After %q, RateLimit %q: Retry-After must equal t", resp.Header.Get("Retry-After"), rl)
	}
	e := body["error"].(map[string]any)
	if e["code"] != "RATE_LIMITED" || e["retry_after"] != float64(ra) || e["limit"] != 20.0 || e["window"] != "1m" ||
		e["scope"] != "api_key:abc123:endpoint:POST /api/v1/orders" || !strings.Contains(e["message"].(string), "Retry after") {
		t.Fatalf("429 error body: %v", e)
	}
	st := body["statuses"].([]any)
	if st[0].(map[string]any)["code"] != "OVER_LIMIT" || st[1].(map[string]any)["code"] != "OK" {
		t.Fatalf("statuses: %v", st)
	}
}

func TestBadRequests(t *testing.T) {
	srv, _ := newTestServer(t, 0)
	big := strings.Repeat("x", DefaultMaxBody+1)
	cases := []struct{ name, body, want string }{
		{"empty", ``, "empty"},
		{"not json", `hello`, "malformed JSON"},
		{"truncated", `{"domain":"api_platform","descriptors":[`, "malformed JSON"},
		{"trailing", `{"domain":"d","descriptors":[{"entries":[{"key":"k"}]}]} {}`, "data after"},
		{"unknown field", `{"domain":"d","descriptors":[],"hit_addend":1}`, `unknown field "hit_addend"`},
		{"wrong type", `{"domain":"d","descriptors":[{"entries":[{"key":"k"}]}],"hits_addend":"1"}`, "hits_addend"},
		{"missing domain", `{"descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`, "domain: is required"},
		{"no descriptors", `{"domain":"d","descriptors":[]}`, "descriptors"},
		{"descriptor hits_addend negative", `{"domain":"d","descriptors":[{"entries":[{"key":"k"}],"hits_addend":-1}]}`, "descriptors[0].hits_addend"},
		{"override unit unknown", `{"domain":"d","descriptors":[{"entries":[{"key":"k"}],"limit":{"requests_per_unit":1,"unit":"FORTNIGHT"}}]}`, "unit"},
		{"negative hits", `{"domain":"d","descriptors":[{"entries":[{"key":"k"}]}],"hits_addend":-1}`, "hits_addend"},
		{"huge hits", `{"domain":"d","descriptors":[{"entries":[{"key":"k"}]}],"hits_addend":99999999999}`, "hits_addend"},
		{"long key", `{"domain":"d","descriptors":[{"entries":[{"key":"` + strings.Repeat("k", pop.MaxKeyBytes+1) + `"}]}]}`, "descriptors[0].entries[0].key"},
		{"oversized body", `{"domain":"` + big + `"}`, "limit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, body := post(t, srv.URL+"/v1/check", c.body)
			if resp.StatusCode != 400 {
				t.Fatalf("status %d, want 400: %v", resp.StatusCode, body)
			}
			e, _ := body["error"].(map[string]any)
			if e == nil || e["code"] != "BAD_REQUEST" || !strings.Contains(fmt.Sprint(e["message"]), c.want) {
				t.Fatalf("error body %v, want a message containing %q", body, c.want)
			}
		})
	}
	resp, err := http.Get(srv.URL + "/v1/check")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Fatalf("GET /v1/check: %d", resp.StatusCode)
	}
}

func TestBatch(t *testing.T) {
	srv, _ := newTestServer(t, 0)
	var checks []string
	for i := range 35 {
		checks = append(checks, fmt.Sprintf(`{"domain":"api_platform","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.%d"}]}]}`, i%2))
	}
	checks = append(checks, `{"domain":"","descriptors":[]}`)
	resp, body := post(t, srv.URL+"/v1/check/batch", `{"checks":[`+strings.Join(checks, ",")+`]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("batch: %d %v", resp.StatusCode, body)
	}
	results := body["results"].([]any)
	if len(results) != 36 {
		t.Fatalf("%d results", len(results))
	}
	ok := 0
	for _, r := range results[:35] {
		if r.(map[string]any)["overall_code"] == "OK" {
			ok++
		}
	}
	if ok != 35 { // 18 and 17 checks against two IPs of 30/min each
		t.Fatalf("%d of 35 allowed", ok)
	}
	if e := results[35].(map[string]any)["error"].(map[string]any); e["field"] != "checks[35].domain" {
		t.Fatalf("bad check in batch: %v", e)
	}
	resp, _ = post(t, srv.URL+"/v1/check/batch", `{"checks":[]}`)
	if resp.StatusCode != 400 {
		t.Fatalf("empty batch: %d", resp.StatusCode)
	}
}

func TestAuthz(t *testing.T) {
	for _, deny := range []int{0, 403} {
		t.Run(fmt.Sprint("deny=", deny), func(t *testing.T) {
			srv, _ := newTestServer(t, deny)
			get := func(h map[string]string) *http.Response {
				req, _ := http.NewRequest("GET", srv.URL+"/v1/authz", nil)
				for k, v := range h {
					req.Header.Set(k, v)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp
			}
			h := map[string]string{"X-Forwarded-For": "203.0.113.7", "X-Original-Method": "GET", "X-Original-URI": "/x?y=1"}
			for i := range 30 {
				if resp := get(h); resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Remaining") != strconv.Itoa(29-i) {
					t.Fatalf("authz %d: %d remaining %q", i, resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"))
				}
			}
			resp := get(h)
			want := 429
			if deny != 0 {
				want = deny
			}
			if resp.StatusCode != want || resp.Header.Get("Retry-After") == "" {
				t.Fatalf("31st: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
			}
			// Another client (by the last X-Forwarded-For hop) is not held.
			if resp := get(map[string]string{"X-Forwarded-For": "203.0.113.7, 198.51.100.1"}); resp.StatusCode != 200 {
				t.Fatalf("other client: %d", resp.StatusCode)
			}
			// A client cannot choose its address by sending X-Real-IP, which
			// some proxies (Caddy's forward_auth) pass through.
			forged := maps.Clone(h)
			forged["X-Real-IP"] = "10.8.8.1"
			if resp := get(forged); resp.StatusCode != want {
				t.Fatalf("forged X-Real-IP: %d, want %d", resp.StatusCode, want)
			}
			// The API key descriptor applies when its header is present.
			hk := map[string]string{"X-Forwarded-For": "192.0.2.1", "X-API-Key": "k1", "X-Forwarded-Method": "POST", "X-Forwarded-Uri": "/api/v1/orders"}
			for range 20 {
				get(hk)
			}
			if resp := get(hk); resp.StatusCode != want || resp.Header.Get("RateLimit") == "" || !strings.HasPrefix(resp.Header.Get("RateLimit"), `"writes"`) {
				t.Fatalf("21st order via authz: %d %q", resp.StatusCode, resp.Header.Get("RateLimit"))
			}
		})
	}
}

// TestClientIP: client_ip is the last address of the one header the
// operator names (the hop its proxy appended or wrote), else the peer; no
// other header counts, whatever a client sends.
func TestClientIP(t *testing.T) {
	for _, c := range []struct {
		name, header string
		hdr          [][2]string
		want         string
	}{
		{"last X-Forwarded-For hop", "", [][2]string{{"X-Forwarded-For", "10.0.0.1, 203.0.113.7"}}, "203.0.113.7"},
		{"last of several X-Forwarded-For lines", "", [][2]string{{"X-Forwarded-For", "10.0.0.1"}, {"X-Forwarded-For", "198.51.100.2 , 203.0.113.7 "}}, "203.0.113.7"},
		{"X-Real-IP ignored by default", "", [][2]string{{"X-Real-IP", "10.8.8.1"}, {"X-Forwarded-For", "10.8.8.1, 203.0.113.7"}}, "203.0.113.7"},
		{"X-Real-IP alone: the peer", "", [][2]string{{"X-Real-IP", "10.8.8.1"}}, "192.0.2.9"},
		{"no header: the peer", "", nil, "192.0.2.9"},
		{"empty header: the peer", "", [][2]string{{"X-Forwarded-For", " "}}, "192.0.2.9"},
		{"X-Real-IP named", "x-real-ip", [][2]string{{"X-Real-IP", "203.0.113.7"}, {"X-Forwarded-For", "10.8.8.1"}}, "203.0.113.7"},
		{"X-Real-IP named, absent: the peer, not X-Forwarded-For", "X-Real-IP", [][2]string{{"X-Forwarded-For", "10.8.8.1"}}, "192.0.2.9"},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := New(Config{ClientIPHeader: c.header})
			r := httptest.NewRequest("GET", "/v1/authz", nil)
			r.RemoteAddr = "192.0.2.9:4711"
			for _, h := range c.hdr {
				r.Header.Add(h[0], h[1])
			}
			if got := srv.authValue(r, "client_ip"); got != c.want {
				t.Errorf("client_ip %q, want %q", got, c.want)
			}
		})
	}
}

func TestHealthAndNotFound(t *testing.T) {
	srv, _ := newTestServer(t, 0)
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/nope": 404} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: %d %s", path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
	}
}

// FuzzCheck drives the handler with arbitrary bodies: it never panics and
// always answers 200, 429 or 400 with a JSON body of the matching shape.
func FuzzCheck(f *testing.F) {
	f.Add([]byte(ordersCheck))
	f.Add([]byte(`{"domain":"api_platform","descriptors":[{"entries":[{"key":"remote_address","value":"\u0000\"\\"}]}],"hits_addend":40}`))
	f.Add([]byte(`{"domain":"x","descriptors":[{"entries":[{"key":"k"}]}]}`))
	f.Add([]byte(`{"domain":"api_platform","descriptors":[{"entries":[{"key":"api_key","value":"\xff\xfe"}]}]}`))
	f.Add([]byte(`[1,2,3]`))
	f.Add([]byte(`{"domain":null}`))
	root := &rules.Node{}
	root.Child("api_key", "").Add(lim("api_key", 5, rules.Second, "de\"fault"))
	root.Child("remote_address", "").Add(lim("remote_address", 30, rules.Minute, "per_ip"))
	set, _ := rules.NewSet(rules.NewDomain("api_platform", "fuzz", root))
	h := New(Config{Engine: pop.NewEngine(store.NewMemory(store.MemoryConfig{}), set, nil)})
	f.Fuzz(func(t *testing.T, body []byte) {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", "/v1/check", strings.NewReader(string(body))))
		var m map[string]json.RawMessage
		if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil {
			t.Fatalf("status %d with a body that is not a JSON object: %q", w.Code, w.Body.Bytes())
		}
		switch w.Code {
		case 200, 429:
			if m["overall_code"] == nil || m["statuses"] == nil {
				t.Fatalf("%d without overall_code/statuses: %s", w.Code, w.Body.Bytes())
			}
			if (w.Code == 429) != (string(m["overall_code"]) == `"OVER_LIMIT"`) || (w.Code == 429) != (m["error"] != nil) {
				t.Fatalf("status %d does not match body %s", w.Code, w.Body.Bytes())
			}
		case 400:
			if m["error"] == nil {
				t.Fatalf("400 without an error object: %s", w.Body.Bytes())
			}
		default:
			t.Fatalf("unexpected status %d: %s", w.Code, w.Body.Bytes())
		}
	})
}

// BenchmarkHandler is the whole HTTP handler in process (decode, decide,
// headers, encode), without the network: hot key and 100k keys.
func BenchmarkHandler(b *testing.B) {
	root := &rules.Node{}
	root.Child("api_key", "").Add(lim("api_key", 1000, rules.Second, "default"))
	set, _ := rules.NewSet(rules.NewDomain("edge", "bench", root))
	h := New(Config{Engine: pop.NewEngine(store.NewMemory(store.MemoryConfig{}), set, nil)})
	for _, keys := range []int{1, 100000} {
		bodies := make([]string, min(keys, 4096))
		for i := range bodies {
			bodies[i] = fmt.Sprintf(`{"domain":"edge","descriptors":[{"entries":[{"key":"api_key","value":"k%d"}]}],"hits_addend":1}`, i*(keys/len(bodies)))
		}
		b.Run(fmt.Sprint("keys=", keys), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				w := &discard{h: http.Header{}}
				r := httptest.NewRequest("POST", "/v1/check", nil)
				i := 0
				for pb.Next() {
					r.Body = io.NopCloser(strings.NewReader(bodies[i%len(bodies)]))
					r.ContentLength = int64(len(bodies[i%len(bodies)]))
					clear(w.h)
					h.ServeHTTP(w, r)
					i++
				}
			})
		})
	}
}

type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(int)             {}

// FuzzDecodeFast holds the fast decoder to encoding/json: whenever it accepts
// a body, encoding/json (strict) accepts it too and decodes the same request.
func FuzzDecodeFast(f *testing.F) {
	f.Add([]byte(ordersCheck))
	f.Add([]byte(` { "hits_addend" : 3 , "descriptors" : [ { "entries" : [ ] } ] , "domain" : "" } `))
	f.Add([]byte(`{"domain":"d","descriptors":[{"entries":[{"value":"v"},{"key":"k"},{}]}]}`))
	f.Add([]byte(`{"domain":"d\u00e9","descriptors":[],"hits_addend":-0}`))
	f.Add([]byte(`{"domain":"é","descriptors":[{"entries":[{"key":"k","value":"v","key":"x"}]}],"hits_addend":01}`))
	f.Add([]byte(`{"checks":[` + ordersCheck + `,{"domain":"d","descriptors":[]}]}`))
	f.Add([]byte(`{"checks":[]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var batch []pop.Request
		if decodeBatchFast(body, &batch) {
			var slow batchRequest
			if err := decodeStrict(body, &slow); err != nil {
				t.Fatalf("fast batch accepted what encoding/json rejects (%v): %q", err, body)
			}
			if len(batch) != len(slow.Checks) {
				t.Fatalf("batch: %d checks, encoding/json %d: %q", len(batch), len(slow.Checks), body)
			}
			for i := range batch {
				if fmt.Sprintf("%#v", normalize(batch[i])) != fmt.Sprintf("%#v", normalize(slow.Checks[i])) {
					t.Fatalf("batch check %d differs on %q", i, body)
				}
			}
		}
		var fast pop.Request
		if !decodeFast(body, &fast) {
			return
		}
		var slow pop.Request
		if err := decodeStrict(body, &slow); err != nil {
			t.Fatalf("fast accepted what encoding/json rejects (%v): %q", err, body)
		}
		if fmt.Sprintf("%#v", normalize(fast)) != fmt.Sprintf("%#v", normalize(slow)) {
			t.Fatalf("fast and encoding/json differ on %q:\n%#v\n%#v", body, fast, slow)
		}
	})
}

// normalize makes empty and nil slices compare equal.
func normalize(r pop.Request) pop.Request {
	if len(r.Descriptors) == 0 {
		r.Descriptors = nil
	}
	for i := range r.Descriptors {
		if len(r.Descriptors[i].Entries) == 0 {
			r.Descriptors[i].Entries = nil
		}
	}
	return r
}

// BenchmarkBatch is the batch endpoint in process: 100 checks per request
// over 100k keys, reported as decisions per second.
func BenchmarkBatch(b *testing.B) {
	root := &rules.Node{}
	root.Child("api_key", "").Add(lim("api_key", 1000, rules.Second, "default"))
	set, _ := rules.NewSet(rules.NewDomain("edge", "bench", root))
	h := New(Config{Engine: pop.NewEngine(store.NewMemory(store.MemoryConfig{}), set, nil)})
	const perBatch = 100
	bodies := make([]string, 256)
	for i := range bodies {
		var cs []string
		for j := range perBatch {
			cs = append(cs, fmt.Sprintf(`{"domain":"edge","descriptors":[{"entries":[{"key":"api_key","value":"k%d"}]}]}`, (i*perBatch+j)*4%100000))
		}
		bodies[i] = `{"checks":[` + strings.Join(cs, ",") + `]}`
	}
	b.ReportAllocs()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		w := &discard{h: http.Header{}}
		r := httptest.NewRequest("POST", "/v1/check/batch", nil)
		i := 0
		for pb.Next() {
			r.Body = io.NopCloser(strings.NewReader(bodies[i%len(bodies)]))
			r.ContentLength = int64(len(bodies[i%len(bodies)]))
			h.ServeHTTP(w, r)
			i++
		}
	})
	b.ReportMetric(float64(b.N*perBatch)/time.Since(start).Seconds(), "decisions/s")
}

// newMitigatingServer serves a PoP eu-1 with mitigation bits and one
// global limit of 1 per minute per ip, on a clock 30 s into a minute; top,
// when set, counts its denied keys.
func newMitigatingServer(t *testing.T, top *topkeys.Sketch) (*httptest.Server, *pop.Engine) {
	root := &rules.Node{}
	l := lim("ip", 1, rules.Minute, "per_ip")
	l.Scope = rules.ScopeGlobal
	root.Child("ip", "").Add(l)
	set, _ := rules.NewSet(rules.NewDomain("api_platform", "test", root))
	c := &clock{t: limittest.T0.Add(30 * time.Second)}
	m := pop.NewMitigations("eu-1")
	eng := pop.NewEngine(store.NewMemory(store.MemoryConfig{Replica: "eu-1"}), set, nil)
	eng.UseMitigations(m)
	if top != nil {
		eng.UseTopKeys(top)
	}
	srv := httptest.NewServer(New(Config{Engine: eng, Mitigations: m, TopKeys: top, Now: c.now}))
	t.Cleanup(srv.Close)
	return srv, eng
}

func TestMitigationsEndpoint(t *testing.T) {
	srv, _ := newMitigatingServer(t, nil)
	body := `{"domain":"api_platform","descriptors":[{"entries":[{"key":"ip","value":"1.2.3.4"}]}]}`
	post(t, srv.URL+"/v1/check", body)
	if resp, _ := post(t, srv.URL+"/v1/check", body); resp.StatusCode != 429 {
		t.Fatalf("2nd check: %d", resp.StatusCode)
	}
	resp, err := http.Get(srv.URL + "/v1/mitigations")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct {
		Mitigations []struct {
			Key, Scope, Until, Origin string
			RetryAfter                int64 `json:"retry_after"`
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if len(got.Mitigations) != 1 {
		t.Fatalf("mitigations %+v", got)
	}
	g := got.Mitigations[0]
	if g.Key != "api_platform ip=1.2.3.4 (minute sliding_window global)" || g.Scope != "global" || g.Origin != "eu-1" || g.RetryAfter <= 0 {
		t.Fatalf("mitigation %+v", g)
	}
	// A third check is denied by the bit, with Retry-After to its end.
	resp2, _ := post(t, srv.URL+"/v1/check", body)
	if ra, _ := strconv.ParseInt(resp2.Header.Get("Retry-After"), 10, 64); resp2.StatusCode != 429 || ra != g.RetryAfter {
		t.Fatalf("3rd check: %d Retry-After %q, want the bit's %d", resp2.StatusCode, resp2.Header.Get("Retry-After"), g.RetryAfter)
	}
}
