package loadgen

import (
	"context"
	"testing"
	"time"
)

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
// per request (one op): before a run, into the pre-rendered ring.
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
			b.ReportAllocs()
			var bytes int
			for i := 0; i < b.N; {
				var ring [][]byte
				if cfg.GRPC != "" {
					ring, err = renderGRPCRing(&t, i)
					if err != nil {
						b.Fatal(err)
					}
				} else {
					ring = renderRing(&t, i)
				}
				i += len(ring)
				bytes = len(ring[0])
			}
			b.SetBytes(int64(bytes))
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
