package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
)

// TestRunDistinctKeys: the values sent are drawn as the requests go out, so
// the distinct values a uniform run over K keys sends in n checks are the
// coupon collector's K·(1−e^(−n/K)), however large n is. The pre-rendered
// ring this replaced cycled each worker's first 4,096 requests at most
// (fewer to fit 32 MiB): here 8,192 single checks (the server received
// 7,846 distinct where 9,516 are due) and 256,000 checks in batches of 500
// (92,421 where 99,326 are). A real HTTP server counts the distinct values
// it received, and the report must say as many.
func TestRunDistinctKeys(t *testing.T) {
	const keys = 100000
	for _, tc := range []struct {
		name        string
		conc, batch int
		requests    int64
	}{
		{"single", 2, 0, 10000},
		{"batch500", 4, 500, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &valueCounter{seen: make([]bool, keys)}
			srv := httptest.NewServer(s)
			defer srv.Close()
			rep := runBounded(t, Config{URL: srv.URL, Concurrency: tc.conc, Requests: tc.requests, Batch: tc.batch, Dist: Uniform, Keys: keys, Seed: 5})
			s.mu.Lock()
			defer s.mu.Unlock()
			n := tc.requests * int64(max(tc.batch, 1))
			if rep.Requests != tc.requests || rep.Errors != 0 || s.checks != n || s.bad != 0 {
				t.Fatalf("Requests %d, Errors %d (%s), server checks %d (%d bad requests); want %d, 0, %d", rep.Requests, rep.Errors, rep.LastError, s.checks, s.bad, tc.requests, n)
			}
			want := keys * (1 - math.Exp(-float64(n)/keys))
			if rep.DistinctKeys != s.distinct || rep.DistinctEstimated || rep.KeySpace != keys {
				t.Errorf("report: %d distinct of %d (estimated %v), the server received %d distinct", rep.DistinctKeys, rep.KeySpace, rep.DistinctEstimated, s.distinct)
			}
			if got := float64(s.distinct); math.Abs(got-want) > 0.01*want {
				t.Errorf("%d checks over %d keys: %.0f distinct values, want %.0f ± 1%%", n, keys, got, want)
			}
			if !strings.Contains(rep.String(), fmt.Sprintf("distinct keys sent: %d of %d", s.distinct, keys)) {
				t.Errorf("report does not say the distinct keys sent:\n%s", rep)
			}
		})
	}
}

// valueCounter is an HTTP check endpoint that counts the checks and the
// distinct values "k<i>" it receives, reading the values straight out of
// the JSON (TestRenderHTTP decodes it whole) to keep up with the generator
// under the race detector; every answer is 200.
type valueCounter struct {
	mu       sync.Mutex
	seen     []bool
	distinct int64
	checks   int64
	bad      int
}

func (s *valueCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	const marker = `"value":"k`
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		i := bytes.Index(body, []byte(marker))
		if i < 0 {
			break
		}
		body = body[i+len(marker):]
		end := bytes.IndexByte(body, '"')
		v, err := strconv.Atoi(string(body[:max(end, 0)]))
		if err != nil || v < 0 || v >= len(s.seen) {
			s.bad++
			http.Error(w, "bad value", http.StatusBadRequest)
			return
		}
		s.checks++
		if !s.seen[v] {
			s.seen[v] = true
			s.distinct++
		}
	}
	w.Write([]byte(`{"overall_code":"OK"}`))
}

// TestRenderHTTP: rendered requests are well-formed HTTP/1.1 requests whose
// JSON carries the values the worker's seeded drawer draws, the same in
// every run of the seed; rendering allocates nothing.
func TestRenderHTTP(t *testing.T) {
	for _, batch := range []int{0, 1, 7} {
		cfg := Config{URL: "http://example.test:8080/base/", Dist: Zipf, Keys: 1000, Batch: batch, Seed: 9, Domain: `d"é`, Key: "k\\"}
		tg, err := cfg.validate()
		if err != nil {
			t.Fatal(err)
		}
		r := newRenderer(&tg, 2, newKeySet(keySpace(&tg.cfg)))
		d := newDrawer(&tg.cfg, 2)
		for range 50 {
			raw := r.render()
			req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
			if err != nil {
				t.Fatalf("batch %d: %v in %q", batch, err, raw)
			}
			body, err := io.ReadAll(req.Body)
			if err != nil || int64(len(body)) != req.ContentLength || req.Host != "example.test:8080" || req.Method != "POST" {
				t.Fatalf("batch %d: %s %s host %q, body %d of %d bytes (%v)", batch, req.Method, req.URL, req.Host, len(body), req.ContentLength, err)
			}
			var checks []checkRequest
			wantPath := "/base/v1/check"
			if batch > 0 {
				var b struct{ Checks []checkRequest }
				err = json.Unmarshal(body, &b)
				checks, wantPath = b.Checks, wantPath+"/batch"
			} else {
				checks = make([]checkRequest, 1)
				err = json.Unmarshal(body, &checks[0])
			}
			if err != nil || req.URL.Path != wantPath || len(checks) != max(batch, 1) {
				t.Fatalf("batch %d: %s, %d checks (%v) in %s", batch, req.URL.Path, len(checks), err, body)
			}
			for _, c := range checks {
				want := fmt.Sprintf("k%d", d.next())
				e := c.Descriptors[0].Entries[0]
				if c.Domain != cfg.Domain || e.Key != cfg.Key || e.Value != want || c.HitsAddend != 1 {
					t.Fatalf("batch %d: check %+v, want value %s", batch, c, want)
				}
			}
		}
		if a := testing.AllocsPerRun(100, func() { r.render(); r.sent() }); a != 0 {
			t.Errorf("batch %d: %v allocations a request", batch, a)
		}
	}
}

// TestRenderGRPC: a hand-encoded request is byte for byte what
// proto.Marshal makes of the same RateLimitRequest.
func TestRenderGRPC(t *testing.T) {
	for _, tc := range []struct{ domain, key, value string }{
		{"edge", "api_key", "k0"},
		{"edge", "api_key", "k18446744073709551615"},
		{"", "", "hot"},
		{strings.Repeat("é", 100), strings.Repeat("x", 300), "k12"},
	} {
		want, err := proto.Marshal(request(&Config{Domain: tc.domain, Key: tc.key}, tc.value))
		if err != nil {
			t.Fatal(err)
		}
		got := appendGRPCRequest([]byte("x"), tc.domain, tc.key, []byte(tc.value))
		if !bytes.Equal(got[6:], want) || string(got[:2]) != "x\x00" || int(got[2])<<24|int(got[3])<<16|int(got[4])<<8|int(got[5]) != len(want) {
			t.Errorf("%+v:\n got %x\nwant %x", tc, got, want)
		}
	}
	tg, err := Config{GRPC: "127.0.0.1:1", Dist: Uniform, Keys: 10, Seed: 4}.validate()
	if err != nil {
		t.Fatal(err)
	}
	r, d := newRenderer(&tg, 0, newKeySet(10)), newDrawer(&tg.cfg, 0)
	for range 20 {
		got := r.render()
		want, _ := GRPCRequest(tg.cfg, fmt.Sprintf("k%d", d.next()))
		if !bytes.Equal(got, want) {
			t.Fatalf("got %x, want %x", got, want)
		}
	}
	if a := testing.AllocsPerRun(100, func() { r.render(); r.sent() }); a != 0 {
		t.Errorf("%v allocations a request", a)
	}
}

// TestKeySet: exact counts in the bitmap; HyperLogLog estimates within 3%
// (its standard error is 0.8%) from a few values to millions.
func TestKeySet(t *testing.T) {
	s := newKeySet(1000)
	for _, i := range []uint64{0, 999, 64, 63, 999, 0, 500} {
		s.add(i)
	}
	if n, exact := s.count(); n != 5 || !exact {
		t.Errorf("bitmap: %d (exact %v), want 5 exact", n, exact)
	}
	if s := newKeySet(exactKeysMax + 1); s.bits != nil {
		t.Errorf("a key space of 2^27+1 is counted in a bitmap")
	}
	h := newKeySet(1 << 40)
	added := 0
	for _, want := range []int{10, 1000, 30000, 100000, 1000000, 3000000} {
		for ; added < want; added++ {
			i := uint64(added) * 7919 // distinct, not consecutive
			h.add(i)
			h.add(i) // again: not counted twice
		}
		n, exact := h.count()
		if exact || math.Abs(float64(n)-float64(want)) > 0.03*float64(want)+1 {
			t.Errorf("HyperLogLog: %d (exact %v) for %d distinct, want within 3%%", n, exact, want)
		}
	}
}

// renderCases are the request shapes BenchmarkRender renders: single checks
// and batches of 500 (the run), uniform and Zipf over 1M keys.
var renderCases = []struct {
	name string
	cfg  Config
}{
	{"single-uniform", Config{Concurrency: 4, Dist: Uniform, Keys: 1000000}},
	{"single-zipf", Config{Concurrency: 4, Dist: Zipf, Keys: 1000000}},
	{"batch500-uniform", Config{Concurrency: 4, Dist: Uniform, Keys: 1000000, Batch: 500}},
	{"grpc-uniform", Config{Concurrency: 4, Dist: Uniform, Keys: 1000000, GRPC: "127.0.0.1:1"}},
}

// BenchmarkRender measures what a request costs the generator to render,
// per request (one op), in the steady state: drawing its values, rendering
// it into the worker's buffer, and counting its values as sent.
func BenchmarkRender(b *testing.B) {
	for _, bc := range renderCases {
		b.Run(bc.name, func(b *testing.B) {
			cfg := bc.cfg
			if cfg.GRPC == "" {
				cfg.URL = "http://127.0.0.1:1"
			}
			t, err := cfg.validate()
			if err != nil {
				b.Fatal(err)
			}
			r := newRenderer(&t, 0, newKeySet(keySpace(&t.cfg)))
			b.SetBytes(int64(len(r.render())))
			b.ReportAllocs()
			for b.Loop() {
				r.render()
				r.sent()
			}
		})
	}
}

// BenchmarkRunBatch is BenchmarkRun in batches of 500 checks over 1M keys
// against the allocation-free responder: the client's cost when each
// request carries many checks.
func BenchmarkRunBatch(b *testing.B) {
	body := `{"results":[]}`
	raw := startRawServer(b, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 14\r\n\r\n"+body)
	b.ReportAllocs()
	rep, err := Run(context.Background(), Config{URL: raw, Concurrency: 4, Requests: int64(b.N),
		Duration: time.Minute, Dist: Uniform, Keys: 1000000, Batch: 500})
	if err != nil {
		b.Fatal(err)
	}
	if rep.Errors != 0 || rep.Requests != int64(b.N) {
		b.Fatalf("report: %+v", rep)
	}
	b.ReportMetric(rep.DecisionsPerSecond(), "decisions/s")
}
