package loadgen

import (
	"fmt"
	"math"
	"net"
	"net/url"
	"strings"
	"time"
)

// Distribution says how the descriptor value of each check is chosen. The
// zero value is HotKey.
type Distribution int

const (
	// HotKey sends the single value "hot" in every check: one counter, the
	// worst case for contention on one key.
	HotKey Distribution = iota
	// Uniform picks "k<i>" with i uniform in [0, Config.Keys).
	Uniform
	// Zipf picks "k<i>" with i Zipf-distributed over [0, Config.Keys)
	// (exponent Config.ZipfS): rank 0 is the most frequent value.
	Zipf
)

// String returns the distribution's name as accepted by ParseDistribution.
func (d Distribution) String() string {
	switch d {
	case HotKey:
		return "hot"
	case Uniform:
		return "uniform"
	case Zipf:
		return "zipf"
	}
	return fmt.Sprintf("Distribution(%d)", int(d))
}

// ParseDistribution parses "hot" (or "hotkey"), "uniform" or "zipf",
// ignoring case.
func ParseDistribution(s string) (Distribution, error) {
	switch strings.ToLower(s) {
	case "hot", "hotkey":
		return HotKey, nil
	case "uniform":
		return Uniform, nil
	case "zipf":
		return Zipf, nil
	}
	return 0, fmt.Errorf("loadgen: unknown distribution %q (want hot, uniform or zipf)", s)
}

// Config describes one load run. The zero value of every field except URL
// means its documented default; negative or otherwise invalid values make
// Run fail before any traffic is sent. A Config is a plain value, safe to
// share once built.
type Config struct {
	URL         string        // base URL, e.g. http://127.0.0.1:8080; only http:// is supported; required
	Domain      string        // rate-limit domain, default "edge"
	Key         string        // descriptor key, default "api_key"
	Concurrency int           // workers, each with one request in flight on its own connection (gRPC: see GRPCConns), default 64
	Duration    time.Duration // run length, default 10s
	Requests    int64         // when > 0, stop after this many requests in total (whichever of Duration/Requests comes first)
	Dist        Distribution  // how descriptor values are chosen, default HotKey
	Keys        int           // distinct values for Uniform/Zipf, default 100000
	ZipfS       float64       // Zipf exponent s > 1, default 1.1
	Batch       int           // 0: single checks to /v1/check; N > 0: N checks per request to /v1/check/batch
	Seed        uint64        // seeds value choice; worker i draws from its own generator seeded with Seed+i, so runs are reproducible
	// GRPC, when set, is the host:port of a PoP's gRPC rate limit service
	// (--grpc-listen): each worker then sends single-check ShouldRateLimit
	// calls, one in flight, and URL and Batch are unused.
	GRPC string
	// GRPCConns is how many connections the gRPC workers share, their calls
	// multiplexed as HTTP/2 streams (worker i on connection i mod
	// GRPCConns), as Envoy calls a rate limit service over a few
	// connections; 0 means one connection per worker. At most Concurrency.
	GRPCConns int
	// RawGRPC, with GRPC, sends the calls as hand-encoded gRPC messages in
	// HTTP/2 frames on raw connections, reading each answer only as far as
	// grpc-status and overall_code, instead of through grpc-go's client,
	// which costs about as much CPU as the server it measures. A connection
	// that fails is not redialed: its workers stop, each counting one error.
	RawGRPC bool
	// Rate, when > 0, paces the run at Rate requests per second in total,
	// spread evenly over the connections, instead of sending each next
	// request as soon as the last is answered (HTTP only).
	Rate float64
	// Timeline, when set, makes Report.Timeline count the allowed and
	// denied checks of every Unix second (HTTP single checks only).
	Timeline bool
}

// Limits on Config values, to catch typos before they exhaust the machine.
const (
	maxConcurrency = 10000
	maxBatch       = 1000
)

// target is a validated Config with defaults applied.
type target struct {
	cfg  Config
	addr string // host:port to dial
	host string // Host header
	path string // request path
}

func (c Config) validate() (target, error) {
	if c.Domain == "" {
		c.Domain = "edge"
	}
	if c.Key == "" {
		c.Key = "api_key"
	}
	if c.Concurrency == 0 {
		c.Concurrency = 64
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	if c.Keys == 0 {
		c.Keys = 100000
	}
	if c.ZipfS == 0 {
		c.ZipfS = 1.1
	}
	switch {
	case c.Concurrency < 0 || c.Concurrency > maxConcurrency:
		return target{}, fmt.Errorf("loadgen: Concurrency must be in [1, %d], got %d", maxConcurrency, c.Concurrency)
	case c.Duration < 0:
		return target{}, fmt.Errorf("loadgen: Duration must be > 0, got %v", c.Duration)
	case c.Requests < 0:
		return target{}, fmt.Errorf("loadgen: Requests must be >= 0, got %d", c.Requests)
	case c.Dist < HotKey || c.Dist > Zipf:
		return target{}, fmt.Errorf("loadgen: Dist must be HotKey, Uniform or Zipf, got %v", c.Dist)
	case c.Keys < 0:
		return target{}, fmt.Errorf("loadgen: Keys must be > 0, got %d", c.Keys)
	case !(c.ZipfS > 1) || math.IsInf(c.ZipfS, 0):
		return target{}, fmt.Errorf("loadgen: ZipfS must be a finite number > 1, got %v", c.ZipfS)
	case c.Batch < 0 || c.Batch > maxBatch:
		return target{}, fmt.Errorf("loadgen: Batch must be in [0, %d], got %d", maxBatch, c.Batch)
	}
	if !(c.Rate >= 0) || math.IsInf(c.Rate, 0) {
		return target{}, fmt.Errorf("loadgen: Rate must be a finite number ≥ 0, got %v", c.Rate)
	}
	if (c.Rate > 0 || c.Timeline) && (c.GRPC != "" || c.Batch != 0) {
		return target{}, fmt.Errorf("loadgen: Rate and Timeline need HTTP single checks, got GRPC %q and Batch %d", c.GRPC, c.Batch)
	}
	if c.RawGRPC && c.GRPC == "" {
		return target{}, fmt.Errorf("loadgen: RawGRPC needs GRPC, got GRPC %q", c.GRPC)
	}
	if c.GRPCConns < 0 || c.GRPCConns > c.Concurrency || (c.GRPCConns > 0 && c.GRPC == "") {
		return target{}, fmt.Errorf("loadgen: GRPCConns must be in [0, Concurrency %d] and needs GRPC, got %d and GRPC %q", c.Concurrency, c.GRPCConns, c.GRPC)
	}
	if c.GRPC != "" {
		if _, _, err := net.SplitHostPort(c.GRPC); err != nil || c.Batch != 0 {
			return target{}, fmt.Errorf("loadgen: GRPC must be host:port and Batch 0, got %q and %d", c.GRPC, c.Batch)
		}
		return target{cfg: c, addr: c.GRPC}, nil
	}
	if c.URL == "" {
		return target{}, fmt.Errorf("loadgen: URL is required, got %q", c.URL)
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		return target{}, fmt.Errorf("loadgen: URL %q: %v", c.URL, err)
	}
	if u.Scheme != "http" {
		return target{}, fmt.Errorf("loadgen: URL %q: only http:// is supported, got scheme %q", c.URL, u.Scheme)
	}
	if u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return target{}, fmt.Errorf("loadgen: URL %q must be http://host[:port][/base-path]", c.URL)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	path := strings.TrimSuffix(u.EscapedPath(), "/") + "/v1/check"
	if c.Batch > 0 {
		path += "/batch"
	}
	return target{cfg: c, addr: addr, host: u.Host, path: path}, nil
}
