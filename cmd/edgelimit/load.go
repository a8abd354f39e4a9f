package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/edgelimit/edgelimit/pop/loadgen"
)

const loadUsage = `usage: edgelimit load [flags]

Drives a PoP's HTTP check API (POST /v1/check, or /v1/check/batch with
--batch N) from -c keep-alive connections, each with one request in flight,
for -d (or until -n requests), then prints throughput (requests/s, and
decisions/s in batch mode), closed-loop latency percentiles (p50, p99,
p99.9, max; measured from writing a request to reading the end of its
response), the HTTP status mix (200 allowed, 429 denied), errors, and how
many distinct keys the checks sent carried (exact up to 2^27 --keys, a
HyperLogLog estimate above). Each connection draws its values as it sends,
from its own generator seeded with --seed: a run is reproducible from it.
With --grpc host:port it sends Envoy's ShouldRateLimit calls instead, -c of
them in flight, on --grpc-conns connections (OK counted as 200, OVER_LIMIT
as 429).
The generator shares the CPU with the server when both run on one machine:
leave it cores, or read the numbers as a lower bound. Ctrl-C stops the run
early and still prints the report.

flags:
`

// runLoad implements "edgelimit load": it parses args, runs the load
// generator until done or SIGINT/SIGTERM, and prints the report to stdout.
func runLoad(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), loadUsage)
		fs.PrintDefaults()
	}
	var (
		cfg     loadgen.Config
		dist    = "hot"
		asJSON  bool
		reqOut  string
		conc    = 64
		dur     = 10 * time.Second
		reqs    int64
		keys    = 100000
		zipfS   = 1.1
		urlFlag = "http://127.0.0.1:8080"
	)
	fs.StringVar(&urlFlag, "url", urlFlag, "base URL of the PoP (http:// only)")
	fs.StringVar(&cfg.Domain, "domain", "edge", "rate-limit domain sent in every check")
	fs.StringVar(&cfg.Key, "key", "api_key", "descriptor key sent in every check")
	fs.IntVar(&conc, "c", conc, "connections (shorthand for --concurrency)")
	fs.IntVar(&conc, "concurrency", conc, "connections, each with one request in flight")
	fs.DurationVar(&dur, "d", dur, "run length (shorthand for --duration)")
	fs.DurationVar(&dur, "duration", dur, "run length")
	fs.Int64Var(&reqs, "n", 0, "stop after this many requests (shorthand for --requests)")
	fs.Int64Var(&reqs, "requests", 0, "stop after this many requests in total; 0 = no limit (whichever of duration/requests comes first)")
	fs.StringVar(&dist, "dist", dist, "descriptor value distribution: hot (one value), uniform or zipf over --keys values")
	fs.IntVar(&keys, "keys", keys, "distinct values for uniform and zipf")
	fs.Float64Var(&zipfS, "zipf-s", zipfS, "zipf exponent, > 1 (larger = more skewed)")
	fs.IntVar(&cfg.Batch, "batch", 0, "checks per request to /v1/check/batch; 0 = single checks to /v1/check")
	fs.StringVar(&cfg.GRPC, "grpc", "", "`host:port` of the PoP's gRPC rate limit service (--grpc-listen): send single-check ShouldRateLimit calls there instead of HTTP, one call in flight per --concurrency")
	fs.IntVar(&cfg.GRPCConns, "grpc-conns", 0, "with --grpc: connections the calls share as HTTP/2 streams, as Envoy calls a rate limit service over a few; 0 = one connection per --concurrency")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed for the value choice (runs are reproducible)")
	fs.Float64Var(&cfg.Rate, "rate", 0, "requests per second in total, paced evenly over the connections; 0 = each connection sends its next request as soon as the last is answered")
	fs.BoolVar(&cfg.Timeline, "timeline", false, "count allowed and denied checks per Unix second (the JSON report's \"timeline\"; HTTP single checks only)")
	fs.BoolVar(&cfg.RawGRPC, "grpc-raw", false, "with --grpc: write pre-rendered gRPC messages as HTTP/2 frames on raw connections instead of using grpc-go's\nclient, which costs about as much CPU as the server it measures")
	fs.StringVar(&reqOut, "write-grpc-request", "", "write one hot-key ShouldRateLimit request of --domain and --key, as a gRPC message (5-byte prefix and\nthe RateLimitRequest), to `file` and exit: the body for a generic HTTP/2 generator (h2load -d; see docs/load.md)")
	fs.BoolVar(&asJSON, "json", false, "print the report as JSON instead of a table")
	if err := parseArgs(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return &usageError{fmt.Sprintf("unexpected arguments %q (flags only)", fs.Args())}
	}
	d, err := loadgen.ParseDistribution(dist)
	if err != nil {
		return err
	}
	// Explicit zeros would silently mean "default" in Config; reject them.
	if conc <= 0 || dur <= 0 || keys <= 0 {
		return fmt.Errorf("load: -c, -d and --keys must be > 0, got %d, %v, %d", conc, dur, keys)
	}
	cfg.URL, cfg.Concurrency, cfg.Duration, cfg.Requests = urlFlag, conc, dur, reqs
	cfg.Dist, cfg.Keys, cfg.ZipfS = d, keys, zipfS
	if reqOut != "" {
		b, err := loadgen.GRPCRequest(cfg, "hot")
		if err != nil {
			return err
		}
		return os.WriteFile(reqOut, b, 0o644)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := loadgen.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if !asJSON {
		batch := ""
		if cfg.Batch > 0 {
			batch = fmt.Sprintf(", batch %d", cfg.Batch)
		}
		target := cfg.URL
		if cfg.GRPC != "" {
			target = "grpc://" + cfg.GRPC + " (ShouldRateLimit)"
			if cfg.RawGRPC {
				target = "grpc://" + cfg.GRPC + " (ShouldRateLimit, raw HTTP/2)"
			}
		}
		conns := fmt.Sprintf("%d connections", cfg.Concurrency)
		if cfg.GRPCConns > 0 {
			conns = fmt.Sprintf("%d streams on %d connections", cfg.Concurrency, cfg.GRPCConns)
		}
		dist := cfg.Dist.String()
		if cfg.Dist != loadgen.HotKey {
			dist += fmt.Sprintf(" over %d keys", cfg.Keys)
		}
		_, err = fmt.Fprintf(stdout, "load %s: %s, dist %s%s, seed %d\n%s",
			target, conns, dist, batch, cfg.Seed, rep)
		return err
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		loadgen.Report
		RequestsPerSecond  float64 `json:"requests_per_second"`
		DecisionsPerSecond float64 `json:"decisions_per_second"`
	}{rep, rep.RequestsPerSecond(), rep.DecisionsPerSecond()})
}
