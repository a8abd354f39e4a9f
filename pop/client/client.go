// Package client is the Go client of a PoP for application teams: a Client
// that asks a PoP whether a request is within its limits — over HTTP
// (POST /v1/check, POST /v1/release), or over gRPC with Envoy's rate limit
// protocol when given a connection — and, on top of it, net/http middleware
// (Middleware) and a gRPC server interceptor (UnaryServerInterceptor) that
// ask before the handler runs, copy the rate limit fields to the response,
// hold the request's concurrency lease while the handler runs and release it
// when the handler returns or panics.
//
// Every call to the PoP has a deadline (Config.Timeout). When the PoP cannot
// answer — down, slow, a 5xx — the middleware fails open (serves the request)
// or closed (503, or gRPC Unavailable) as Config.FailOpen says.
//
// Concurrency limits need the HTTP API: Envoy's gRPC protocol has no release
// call, so the PoP leaves concurrency limits out of gRPC checks, and a Client
// checking over gRPC never holds a lease.
//
// It imports pop/… nothing: only net/http, encoding/json, grpc and Envoy's
// generated types, so an application does not pull in the PoP.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// DefaultTimeout is Config.Timeout's default: the longest a check or a
// release waits for the PoP.
const DefaultTimeout = 100 * time.Millisecond

// HeaderNames are the response fields a PoP's answer carries that a Client
// copies to the application's response (the rate limit fields of
// draft-ietf-httpapi-ratelimit-headers and the X-RateLimit-* trio).
var HeaderNames = []string{
	"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset",
	"Ratelimit-Policy", "Ratelimit", "Retry-After",
}

// leaseHeader carries a check's lease token beside the JSON's lease_id.
const leaseHeader = "X-Ratelimit-Lease"

// Config configures a Client.
type Config struct {
	// URL is the PoP's HTTP API, e.g. http://127.0.0.1:8080. Required
	// unless GRPC is set; releases always go here.
	URL string
	// HTTPClient sends the HTTP calls; nil means a client of its own with
	// keep-alive connections.
	HTTPClient *http.Client
	// GRPC, when set, is a connection to the PoP's --grpc-listen: checks go
	// over Envoy's RateLimitService and hold no concurrency leases.
	GRPC grpc.ClientConnInterface
	// Timeout bounds each call to the PoP (also when the caller's context
	// allows longer); 0 means DefaultTimeout.
	Timeout time.Duration
	// FailOpen makes the middleware serve a request the PoP could not
	// decide; false refuses it (503 / Unavailable). Client.Check itself
	// returns the error either way.
	FailOpen bool
	// OnError, when set, is told every failed check and release (for
	// logs or metrics); nil ignores them.
	OnError func(error)
}

// Client asks a PoP. It is safe for concurrent use.
type Client struct {
	cfg  Config
	http *http.Client
	rls  rlsv3.RateLimitServiceClient
}

// New returns a Client for cfg.
func New(cfg Config) (*Client, error) {
	if cfg.URL == "" && cfg.GRPC == nil {
		return nil, errors.New("client: Config.URL or Config.GRPC is required")
	}
	cfg.URL = strings.TrimRight(cfg.URL, "/")
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	c := &Client{cfg: cfg, http: cfg.HTTPClient}
	if c.http == nil {
		c.http = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second}}
	}
	if cfg.GRPC != nil {
		c.rls = rlsv3.NewRateLimitServiceClient(cfg.GRPC)
	}
	return c, nil
}

// Entry is one key/value pair of a descriptor.
type Entry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Descriptor is one descriptor: its entries, in order.
type Descriptor struct {
	Entries []Entry `json:"entries"`
}

// Request is a check: the JSON mapping of Envoy's RateLimitRequest.
type Request struct {
	Domain      string       `json:"domain"`
	Descriptors []Descriptor `json:"descriptors"`
	// Hits is how many hits the request counts; 0 means 1.
	Hits int64 `json:"hits_addend,omitempty"`
}

// Decision is the PoP's answer to a check.
type Decision struct {
	// Allowed reports whether the request is within its limits.
	Allowed bool
	// Lease, when set, is the concurrency lease the request holds: pass it
	// to Release when the request is done (or let its TTL free it).
	Lease string
	// Header holds the rate limit fields (HeaderNames) to send back.
	Header http.Header
	// RetryAfter is, when denied, how long the client should wait.
	RetryAfter time.Duration
	// Body is the PoP's JSON answer over HTTP (with the 429 error object
	// when denied); nil over gRPC.
	Body []byte
}

// Error is a PoP answer that is not a decision: a 4xx for a malformed
// request, a 5xx when the PoP's store could not decide.
type Error struct {
	Status int
	Body   string
}

func (e *Error) Error() string {
	return fmt.Sprintf("client: PoP answered %d: %s", e.Status, strings.TrimSpace(e.Body))
}

// Check asks the PoP about req. It returns an error when the PoP gave no
// decision (unreachable, past Timeout, or an *Error); then the Decision is
// the zero one and the caller applies its own failure policy.
func (c *Client) Check(ctx context.Context, req Request) (Decision, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	if c.rls != nil {
		return c.checkGRPC(ctx, req)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return Decision{}, fmt.Errorf("client: %w", err)
	}
	status, h, raw, err := c.post(ctx, "/v1/check", body)
	if err != nil {
		return Decision{}, err
	}
	if status != http.StatusOK && status != http.StatusTooManyRequests {
		return Decision{}, &Error{Status: status, Body: string(raw)}
	}
	d := Decision{Allowed: status == http.StatusOK, Header: http.Header{}, Body: raw}
	for _, n := range HeaderNames {
		if v := h.Values(n); len(v) > 0 {
			d.Header[n] = v
		}
	}
	if s, err := strconv.Atoi(h.Get("Retry-After")); err == nil && !d.Allowed {
		d.RetryAfter = time.Duration(s) * time.Second
	}
	d.Lease = h.Get(leaseHeader)
	if d.Allowed && d.Lease == "" {
		var ans struct {
			Lease string `json:"lease_id"`
		}
		if json.Unmarshal(raw, &ans) == nil {
			d.Lease = ans.Lease
		}
	}
	return d, nil
}

// checkGRPC asks Envoy's RateLimitService.
func (c *Client) checkGRPC(ctx context.Context, req Request) (Decision, error) {
	in := &rlsv3.RateLimitRequest{Domain: req.Domain, HitsAddend: uint32(max(req.Hits, 0))}
	for _, d := range req.Descriptors {
		rd := &ratelimitv3.RateLimitDescriptor{}
		for _, e := range d.Entries {
			rd.Entries = append(rd.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
		}
		in.Descriptors = append(in.Descriptors, rd)
	}
	out, err := c.rls.ShouldRateLimit(ctx, in)
	if err != nil {
		return Decision{}, fmt.Errorf("client: gRPC check: %w", err)
	}
	d := Decision{Allowed: out.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT, Header: http.Header{}}
	for _, hv := range out.GetResponseHeadersToAdd() {
		d.Header.Add(hv.GetKey(), hv.GetValue())
	}
	if s, err := strconv.Atoi(d.Header.Get("Retry-After")); err == nil && !d.Allowed {
		d.RetryAfter = time.Duration(s) * time.Second
	}
	return d, nil
}

// Release frees a concurrency lease (Decision.Lease) on the PoP's HTTP API.
// Releasing a lease twice, or one that expired, is not an error.
func (c *Client) Release(ctx context.Context, lease string) error {
	if lease == "" {
		return nil
	}
	if c.cfg.URL == "" {
		return errors.New("client: Release needs Config.URL")
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	body, _ := json.Marshal(struct {
		LeaseID string `json:"lease_id"`
	}{lease})
	status, _, raw, err := c.post(ctx, "/v1/release", body)
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return &Error{Status: status, Body: string(raw)}
	}
	return nil
}

// maxAnswer bounds the body read from the PoP.
const maxAnswer = 1 << 20

func (c *Client) post(ctx context.Context, path string, body []byte) (int, http.Header, []byte, error) {
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, c.cfg.URL+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, fmt.Errorf("client: %w", err)
	}
	r.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(r)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("client: %s: %w", path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return 0, nil, nil, fmt.Errorf("client: %s: reading the answer: %w", path, err)
	}
	return resp.StatusCode, resp.Header, raw, nil
}
