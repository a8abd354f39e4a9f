package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type checkRequest struct {
	Domain      string `json:"domain"`
	Descriptors []struct {
		Entries []struct {
			Key   string `json:"key"`
			Value string `json:"value"`
		} `json:"entries"`
	} `json:"descriptors"`
	HitsAddend int `json:"hits_addend"`
}

// checkServer is a deterministic stand-in for a PoP: 429 for values k0..k9
// and for every 3rd request on "hot", 200 otherwise; every 7th response is
// chunked and every 11th carries Connection: close. It records what it saw.
type checkServer struct {
	mu     sync.Mutex
	n      int
	checks int
	values map[string]int
	status map[int]int64
	conns  atomic.Int64
}

func newCheckServer(t *testing.T) (*checkServer, *httptest.Server) {
	s := &checkServer{values: map[string]int{}, status: map[int]int64{}}
	srv := httptest.NewUnstartedServer(s)
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return s, srv
}

func (s *checkServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var checks []checkRequest
	switch r.URL.Path {
	case "/v1/check":
		var c checkRequest
		if err := json.NewDecoder(r.Body).Decode(&c); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		checks = append(checks, c)
	case "/v1/check/batch":
		var b struct{ Checks []checkRequest }
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		checks = b.Checks
	default:
		http.NotFound(w, r)
		return
	}
	s.mu.Lock()
	s.n++
	n := s.n
	status := http.StatusOK
	for _, c := range checks {
		if c.Domain != "edge" || c.HitsAddend != 1 || len(c.Descriptors) != 1 ||
			len(c.Descriptors[0].Entries) != 1 || c.Descriptors[0].Entries[0].Key != "api_key" {
			status = http.StatusBadRequest
			break
		}
		v := c.Descriptors[0].Entries[0].Value
		s.values[v]++
		s.checks++
		if len(checks) == 1 && ((len(v) == 2 && v[0] == 'k') || (v == "hot" && n%3 == 0)) {
			status = http.StatusTooManyRequests
		}
	}
	s.status[status]++
	s.mu.Unlock()

	w.Header().Set("Content-Type", "application/json")
	if n%11 == 0 {
		w.Header().Set("Connection", "close")
	}
	w.WriteHeader(status)
	if n%7 == 0 { // flushing before the end forces chunked encoding
		fmt.Fprint(w, `{"allowed":`)
		w.(http.Flusher).Flush()
	}
	fmt.Fprintf(w, `{"code":%d,"remaining":%d}`, status, n)
}

func (s *checkServer) snapshot() (values map[string]int, status map[int]int64, checks int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.values, s.status, s.checks
}

func runBounded(t *testing.T, cfg Config) Report {
	t.Helper()
	if cfg.Duration == 0 {
		cfg.Duration = 20 * time.Second // a safety net; Requests ends the run
	}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", rep)
	return rep
}

func checkReport(t *testing.T, rep Report, s *checkServer, requests int64) {
	t.Helper()
	_, status, _ := s.snapshot()
	if rep.Requests != requests || rep.Errors != 0 {
		t.Errorf("Requests = %d, Errors = %d (%s), want %d and 0", rep.Requests, rep.Errors, rep.LastError, requests)
	}
	if fmt.Sprint(rep.Status) != fmt.Sprint(status) {
		t.Errorf("status mix %v, server produced %v", rep.Status, status)
	}
	if !(0 < rep.P50 && rep.P50 <= rep.P99 && rep.P99 <= rep.P999 && rep.P999 <= rep.Max) {
		t.Errorf("percentiles not ordered and positive: p50 %v p99 %v p99.9 %v max %v", rep.P50, rep.P99, rep.P999, rep.Max)
	}
	if rep.Elapsed <= 0 || rep.RequestsPerSecond() <= 0 {
		t.Errorf("Elapsed = %v, req/s = %v", rep.Elapsed, rep.RequestsPerSecond())
	}
	if c := s.conns.Load(); c <= 8+1 {
		t.Errorf("server saw %d connections; Connection: close should have forced reconnects", c)
	}
}

func TestRunHotKey(t *testing.T) {
	s, srv := newCheckServer(t)
	rep := runBounded(t, Config{URL: srv.URL, Concurrency: 8, Requests: 2000})
	checkReport(t, rep, s, 2000)
	values, status, _ := s.snapshot()
	if len(values) != 1 || values["hot"] != 2000 || rep.DistinctKeys != 1 || rep.KeySpace != 1 {
		t.Errorf("values seen %v, want only hot x2000; report: %d distinct of %d", values, rep.DistinctKeys, rep.KeySpace)
	}
	if status[429] != 666 || rep.Decisions != 2000 {
		t.Errorf("429s = %d (want 666), Decisions = %d (want 2000)", status[429], rep.Decisions)
	}
}

func TestRunUniform(t *testing.T) {
	s, srv := newCheckServer(t)
	rep := runBounded(t, Config{URL: srv.URL, Concurrency: 8, Requests: 2000, Dist: Uniform, Keys: 50, Seed: 42})
	checkReport(t, rep, s, 2000)
	values, status, _ := s.snapshot()
	if len(values) < 48 || len(values) > 50 || rep.DistinctKeys != int64(len(values)) || rep.Seed != 42 {
		t.Errorf("%d distinct values, want close to 50; report: %d distinct, seed %d", len(values), rep.DistinctKeys, rep.Seed)
	}
	for v, n := range values {
		var i int
		if _, err := fmt.Sscanf(v, "k%d", &i); err != nil || i < 0 || i >= 50 {
			t.Errorf("unexpected value %q", v)
		}
		if n < 10 || n > 80 { // mean 40
			t.Errorf("value %q seen %d times, not uniform-looking", v, n)
		}
	}
	if status[429] < 250 || status[429] > 550 { // 10 of 50 values → ~400
		t.Errorf("429s = %d, want ~400", status[429])
	}
}

func TestRunZipf(t *testing.T) {
	s, srv := newCheckServer(t)
	rep := runBounded(t, Config{URL: srv.URL, Concurrency: 8, Requests: 2000, Dist: Zipf, Keys: 1000, ZipfS: 1.2, Seed: 7})
	checkReport(t, rep, s, 2000)
	values, _, _ := s.snapshot()
	for v, n := range values {
		if v != "k0" && n >= values["k0"] {
			t.Errorf("%q seen %d times, k0 only %d: rank 0 should be the most frequent", v, n, values["k0"])
		}
	}
	if rep.DistinctKeys != int64(len(values)) || rep.KeySpace != 1000 {
		t.Errorf("report: %d distinct of %d, the server saw %d", rep.DistinctKeys, rep.KeySpace, len(values))
	}
	if values["k0"] <= values["k1"] || values["k1"] <= values["k9"] || len(values) < 50 {
		t.Errorf("k0 %d, k1 %d, k9 %d, distinct %d: not Zipf-shaped", values["k0"], values["k1"], values["k9"], len(values))
	}
}

func TestRunBatch(t *testing.T) {
	s, srv := newCheckServer(t)
	rep := runBounded(t, Config{URL: srv.URL + "/", Concurrency: 4, Requests: 300, Batch: 5, Dist: Uniform, Keys: 1000})
	checkReport(t, rep, s, 300)
	_, status, checks := s.snapshot()
	if checks != 1500 || rep.Decisions != 1500 || status[200] != 300 {
		t.Errorf("server checks %d, Decisions %d, 200s %d; want 1500, 1500, 300", checks, rep.Decisions, status[200])
	}
	if rep.DecisionsPerSecond() <= rep.RequestsPerSecond() {
		t.Errorf("decisions/s %v <= req/s %v", rep.DecisionsPerSecond(), rep.RequestsPerSecond())
	}
}

// A server that answers one request per connection and hangs up without
// saying Connection: close: the next request on each connection fails, and
// the generator must reconnect, count the error and go on.
func TestRunServerCloses(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return // the probe connection, or a closed one
					}
					if line == "\r\n" {
						break
					}
				}
				c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
			}()
		}
	}()
	rep := runBounded(t, Config{URL: "http://" + ln.Addr().String(), Concurrency: 4, Requests: 200})
	if rep.Requests+rep.Errors != 200 || rep.Requests < 80 || rep.Errors == 0 || rep.LastError == "" {
		t.Errorf("Requests %d + Errors %d (last %q): want 200 in all, about half errors", rep.Requests, rep.Errors, rep.LastError)
	}
	if rep.Status[200] != rep.Requests {
		t.Errorf("status mix %v", rep.Status)
	}
}

func TestRunDurationAndCancel(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select { // hang until the client goes away
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release)

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	rep, err := Run(ctx, Config{URL: srv.URL, Concurrency: 4, Duration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Run took %v after cancellation", d)
	}
	if rep.Requests != 0 || rep.Errors != 0 {
		t.Errorf("interrupted requests must be neither counted nor errors: %+v", rep)
	}

	srv2 := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv2.Close()
	rep, err = Run(context.Background(), Config{URL: srv2.URL, Concurrency: 2, Duration: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Requests == 0 || rep.Errors != 0 || rep.Elapsed < 200*time.Millisecond || rep.Elapsed > 3*time.Second {
		t.Errorf("duration-bounded run: %+v", rep)
	}
}

func TestConfigErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	const u = "http://127.0.0.1:1"
	tests := []struct {
		cfg  Config
		want string
	}{
		{Config{}, `URL is required`},
		{Config{URL: "https://127.0.0.1:8443"}, `"https"`},
		{Config{URL: "127.0.0.1:8080"}, `URL "127.0.0.1:8080"`},
		{Config{URL: "http://h:1/?q=1"}, `URL "http://h:1/?q=1"`},
		{Config{URL: u, Concurrency: -3}, "Concurrency must be in [1, 10000], got -3"},
		{Config{URL: u, Concurrency: 20000}, "got 20000"},
		{Config{URL: u, Duration: -time.Second}, "Duration must be > 0, got -1s"},
		{Config{URL: u, Requests: -1}, "Requests must be >= 0, got -1"},
		{Config{URL: u, Dist: 7}, "Dist must be HotKey, Uniform or Zipf, got Distribution(7)"},
		{Config{URL: u, Keys: -5}, "Keys must be > 0, got -5"},
		{Config{URL: u, ZipfS: 0.5}, "ZipfS must be a finite number > 1, got 0.5"},
		{Config{URL: u, ZipfS: 1}, "got 1"},
		{Config{URL: u, Batch: -1}, "Batch must be in [0, 1000], got -1"},
		{Config{URL: u, Rate: -1}, "Rate must be a finite number ≥ 0, got -1"},
		{Config{URL: u, Rate: 10, Batch: 5}, "Rate and Timeline need HTTP single checks"},
		{Config{URL: u, Timeline: true, GRPC: "127.0.0.1:1"}, "Rate and Timeline need HTTP single checks"},
		{Config{GRPC: "127.0.0.1:1", Concurrency: 4, GRPCConns: 5}, "GRPCConns must be in [0, Concurrency 4] and needs GRPC, got 5"},
		{Config{GRPC: "127.0.0.1:1", GRPCConns: -1}, "got -1"},
		{Config{URL: u, GRPCConns: 2}, `needs GRPC, got 2 and GRPC ""`},
		{Config{URL: u, RawGRPC: true}, `RawGRPC needs GRPC`},
		{Config{URL: closed}, "cannot connect to " + strings.TrimPrefix(closed, "http://")},
	}
	for _, tc := range tests {
		_, err := Run(context.Background(), tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Run(%+v) error %v, want one containing %q", tc.cfg, err, tc.want)
		}
	}
}

func TestParseDistribution(t *testing.T) {
	for _, d := range []Distribution{HotKey, Uniform, Zipf} {
		got, err := ParseDistribution(strings.ToUpper(d.String()))
		if err != nil || got != d {
			t.Errorf("ParseDistribution(%q) = %v, %v", d, got, err)
		}
	}
	if _, err := ParseDistribution("pareto"); err == nil || !strings.Contains(err.Error(), `"pareto"`) {
		t.Errorf("ParseDistribution(pareto) error %v", err)
	}
}

// BenchmarkRun measures the whole client against a trivial in-process
// server: net/http (realistic, but the server's own allocations show in
// allocs/op) and a minimal allocation-free HTTP/1.1 responder (so allocs/op
// is the client's, setup amortized).
func BenchmarkRun(b *testing.B) {
	body := []byte(`{"allowed":true,"remaining":99}`)
	nethttp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}))
	defer nethttp.Close()
	raw := startRawServer(b, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "+
		fmt.Sprint(len(body))+"\r\n\r\n"+string(body))

	for _, bc := range []struct{ name, url string }{{"nethttp", nethttp.URL}, {"raw", raw}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			rep, err := Run(context.Background(), Config{URL: bc.url, Concurrency: 8, Requests: int64(b.N),
				Duration: time.Minute, Dist: Uniform, Keys: 1000})
			if err != nil {
				b.Fatal(err)
			}
			if rep.Errors != 0 || rep.Requests != int64(b.N) {
				b.Fatalf("report: %+v", rep)
			}
			b.ReportMetric(rep.RequestsPerSecond(), "req/s")
			b.ReportMetric(float64(rep.P99.Microseconds()), "p99-µs")
		})
	}
}

// startRawServer serves resp to every request, reading requests with the
// package's own line helpers so that it allocates nothing per request.
func startRawServer(tb testing.TB, resp string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	out := []byte(resp)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReaderSize(c, readBufSize)
				for {
					clen := int64(0)
					for {
						line, err := readLine(br)
						if err != nil {
							return
						}
						if len(line) == 0 {
							break
						}
						if i := bytes.IndexByte(line, ':'); i > 0 && equalFold(line[:i], "content-length") {
							clen, _ = parseUint(trimSpace(line[i+1:]), 10)
						}
					}
					if discard(br, clen) != nil {
						return
					}
					if _, err := c.Write(out); err != nil {
						return
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}
