// Package loadgen is edgelimit's load generator: it drives a PoP's HTTP
// check API (POST /v1/check, or POST /v1/check/batch in batch mode) from a
// fixed number of keep-alive connections and reports throughput, latency
// percentiles and the HTTP status mix. Users size a PoP with it and the
// project benchmarks with it.
//
// The generator shares the machine with the server it measures, so it is
// built to be cheap per request: each connection is a raw net.Conn with one
// request in flight (no pipelining), each request is rendered as it is sent
// into its worker's reused buffer (its JSON appended by hand, its values
// drawn from the worker's own generator, seeded with Config.Seed plus the
// worker's index, so that a run's values are reproducible), responses are
// read by a minimal HTTP/1.1 parser that understands Content-Length,
// chunked transfer encoding and "Connection: close" and discards the body,
// and latencies go into a per-worker log-linear histogram. The steady state
// allocates nothing. The report says how many distinct values were sent:
// exactly (a bitmap shared by the workers) up to 2^27 keys, estimated by a
// HyperLogLog above.
//
// It drives a PoP's gRPC service (Envoy's ShouldRateLimit) too, with the
// same value distributions, its calls multiplexed as HTTP/2 streams over
// a chosen number of connections: through grpc-go's client, or, with
// RawGRPC, as gRPC messages encoded by hand as they are sent and written as
// HTTP/2 frames (golang.org/x/net's framer and HPACK) whose answers are read
// only as far as grpc-status and overall_code, the same economy as the
// HTTP path.
//
// Latency is measured per request from just before the write to just after
// the last body byte is read; it is closed-loop latency (each connection
// waits for its answer before sending the next request), so it does not
// account for coordinated omission.
package loadgen
