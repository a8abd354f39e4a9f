// Package loadgen is edgelimit's load generator: it drives a PoP's HTTP
// check API (POST /v1/check, or POST /v1/check/batch in batch mode) from a
// fixed number of keep-alive connections and reports throughput, latency
// percentiles and the HTTP status mix. Users size a PoP with it and the
// project benchmarks with it.
//
// The generator shares the machine with the server it measures, so it is
// built to be cheap per request: each connection is a raw net.Conn with one
// request in flight (no pipelining), request bytes are rendered before the
// run starts (a per-worker ring of requests whose keys follow the configured
// distribution), responses are read by a minimal HTTP/1.1 parser that
// understands Content-Length, chunked transfer encoding and
// "Connection: close" and discards the body, and latencies go into a
// per-worker log-linear histogram. The steady state allocates nothing.
//
// Latency is measured per request from just before the write to just after
// the last body byte is read; it is closed-loop latency (each connection
// waits for its answer before sending the next request), so it does not
// account for coordinated omission.
package loadgen
