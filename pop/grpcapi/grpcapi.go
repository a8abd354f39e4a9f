// Package grpcapi is a PoP's gRPC interface, a peer of httpapi over the same
// pop.Engine: Envoy's rate limit service,
//
//	envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
//
// as Envoy's rate limit filter (HTTP and network), Istio and Envoy Gateway
// call it, and the standard gRPC health service (grpc.health.v1.Health),
// SERVING while the PoP can answer checks and NOT_SERVING once it stops.
//
// A request maps onto pop.Request field for field — domain, descriptors and
// their entries, the request's hits_addend (0 → 1), each descriptor's own
// hits_addend (0 = check only) and limit override — and the answer carries
// what /v1/check answers: overall_code, one status per descriptor
// (current_limit, limit_remaining, duration_until_reset, whole seconds) and
// the rate limit headers in response_headers_to_add (pop.HeaderValues).
// Malformed requests get codes.InvalidArgument with a message naming the
// field; a store that cannot decide gives codes.Unavailable; the caller's
// deadline and cancellation reach the store through the context.
//
// The server has the HTTP API's budgets (limits.go): a request size, a
// read timeout, a memory budget for streams receiving their requests,
// streams per connection and connections, fixed flow-control windows and
// keepalive enforcement, so that clients that open streams and never finish
// them cannot exhaust a PoP.
//
// It imports pop, grpc and Envoy's generated types (go-control-plane).
package grpcapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"sync"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/rules"
)

// ServiceName is the rate limit service's full name, as health checks name it.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// Config configures a Server.
type Config struct {
	Engine *pop.Engine
	// Metrics may be nil. Checks are observed as api "grpc".
	Metrics *pop.Metrics
	// Requests, when set, counts every call by method and gRPC code
	// (edgelimit_grpc_requests_total); see NewRequestCounter.
	Requests *RequestCounter
	Logger   *slog.Logger
	// Now reads the clock; nil means time.Now.
	Now func() time.Time
	// MaxStreams bounds the streams of one connection at once (HTTP/2's
	// SETTINGS_MAX_CONCURRENT_STREAMS; grpc resets those past it); 0 means
	// DefaultMaxStreams.
	MaxStreams uint32
	// MaxConns bounds the connections Serve keeps open; one past it is
	// closed as soon as it is accepted. 0 means DefaultMaxConns.
	MaxConns int
	// ReadTimeout bounds the time from a stream's headers to the end of its
	// request: a stream that has not delivered its request by then is
	// cancelled (ErrReadTimeout; the client sees CANCELLED and a reset
	// stream), and a connection must send its HTTP/2 preface within it.
	// 0 means DefaultReadTimeout.
	ReadTimeout time.Duration
	// ReceiveMemory bounds the memory of the streams receiving their
	// requests, each counted as the most it may hold (160 KiB; see
	// streamMemory), shared fairly between connections: past it a stream
	// takes the place of the oldest stream of a connection holding more
	// (cut off, ErrEvicted) or is refused with RESOURCE_EXHAUSTED, before
	// grpc gives it a goroutine. 0 means DefaultReceiveMemory.
	ReceiveMemory int64
	// Options are extra grpc.ServerOptions (TLS credentials); they come
	// after the Server's own, so they may override its limits.
	Options []grpc.ServerOption
	// Headers selects the rate limit fields of response_headers_to_add;
	// nil means pop.DefaultHeaders.
	Headers *pop.Headers
	// DynamicMetadata puts the request's domain and descriptors, and the
	// metadata of the limits of the descriptors within them, in the
	// response's dynamic_metadata, as Envoy's ratelimit's
	// RESPONSE_DYNAMIC_METADATA does (see dynamicMetadata).
	DynamicMetadata bool
	// EnvoyCompat answers as Envoy's ratelimit where edgelimit otherwise
	// differs on purpose: a malformed request fails with codes.Unknown (not
	// InvalidArgument), /json keeps response_headers_to_add in its body
	// (not as HTTP headers), and current_limit names a limit only by the
	// name its rule gives it (envoyNames).
	EnvoyCompat bool
}

// Server serves the rate limit and health services. Its health starts
// NOT_SERVING: call SetServing(true) once the PoP can answer checks. It is
// safe for concurrent use.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	cfg    Config
	gate   *gate
	grpc   *grpc.Server
	health *health.Server
	states sync.Pool // *state
}

// state is one call's reusable memory.
type state struct {
	req       pop.Request
	res       pop.Result
	entries   []rules.Entry
	hits      []int64
	overrides []pop.Override
}

// streamWorkers is the size of grpc's pool of stream workers. A call that
// finds every worker busy gets a goroutine of its own, whose stack grows
// (is copied) through grpc's handler chain: with a worker per core and 64
// calls in flight, that copying was a fifth of the PoP's CPU (profile of
// 64 h2load streams, hot key), and the PoP spent about 14 µs of CPU a call.
// With 64 workers the copying left the profile and a call took about 11 µs
// (same minute; docs/performance.md, gRPC speed). The pool is not per core: it is the
// calls in flight a PoP expects from its Envoys. More workers than calls
// cost little more than their idle stacks, but each then serves fewer
// calls, and the garbage collector shrinks an idle worker's stack, which
// the next call grows again (256 workers measured a little above 64).
const streamWorkers = 64

// New returns a Server; serve it with Serve.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxStreams == 0 {
		cfg.MaxStreams = DefaultMaxStreams
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.ReceiveMemory <= 0 {
		cfg.ReceiveMemory = DefaultReceiveMemory
	}
	s := &Server{cfg: cfg, health: health.NewServer()}
	s.gate = &gate{
		max:      int(max(cfg.ReceiveMemory/streamMemory, 1)),
		conns:    map[*peer.Peer]*connQueue{},
		timeout:  cfg.ReadTimeout,
		refused:  cfg.Requests.refusal("memory"),
		timedOut: cfg.Requests.refusal("read_timeout"),
	}
	s.states.New = func() any { return new(state) }
	opts := append(limitOptions(&cfg, s.gate),
		grpc.ChainUnaryInterceptor(cfg.Requests.interceptor),
		// A pool of stream workers instead of a goroutine per call: a check
		// is far shorter than starting a goroutine and growing its stack
		// through grpc's handler chain. See streamWorkers.
		grpc.NumStreamWorkers(streamWorkers),
		// One write buffer per connection shared while idle: 64 connections
		// of mostly idle checks need not hold 64 buffers.
		grpc.SharedWriteBuffer(true),
	)
	opts = append(opts, cfg.Options...)
	s.grpc = grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(s.grpc, s)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	s.SetServing(false)
	return s
}

// Serve serves on l, keeping at most Config.MaxConns of its connections
// open, until Stop; it returns nil after Stop.
func (s *Server) Serve(l net.Listener) error {
	l = &connLimit{Listener: l, max: int64(s.cfg.MaxConns), refused: s.cfg.Requests.refusal("conns")}
	if err := s.grpc.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// SetServing sets the health of the server ("") and of ServiceName.
func (s *Server) SetServing(ok bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(ServiceName, st)
}

// Stop reports NOT_SERVING to every health watcher, stops taking calls and
// waits for the calls in flight to finish; when ctx ends first, it closes
// the connections still open, cutting those calls off.
func (s *Server) Stop(ctx context.Context) {
	s.health.Shutdown() // NOT_SERVING, and it stays so
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		s.grpc.Stop()
		<-done
	}
}

// ShouldRateLimit implements Envoy's RateLimitService.
func (s *Server) ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	st := s.states.Get().(*state)
	defer s.states.Put(st)
	if err := st.decode(in); err != nil {
		s.cfg.Metrics.BadRequest("grpc")
		return nil, status.Error(s.cfg.badRequestCode(), err.Error())
	}
	now := s.cfg.Now()
	err := s.cfg.Engine.CheckAt(ctx, now, &st.req, &st.res)
	s.cfg.Metrics.ObserveCheck("grpc", s.cfg.Now().Sub(now))
	if err != nil {
		return nil, s.checkFailed(ctx, err)
	}
	return s.cfg.response(now, in, &st.res), nil
}

// badRequestCode is the code of a malformed request's error: Envoy's
// ratelimit fails one with a plain error, which gRPC reports as Unknown.
func (c *Config) badRequestCode() codes.Code {
	if c.EnvoyCompat {
		return codes.Unknown
	}
	return codes.InvalidArgument
}

// checkFailed maps the engine's error to a gRPC status.
func (s *Server) checkFailed(ctx context.Context, err error) error {
	var re *pop.RequestError
	switch {
	case errors.As(err, &re):
		s.cfg.Metrics.BadRequest("grpc")
		return status.Error(s.cfg.badRequestCode(), re.Error())
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	}
	s.cfg.Logger.Error("check failed", "api", "grpc", "err", err)
	return status.Error(codes.Unavailable, err.Error())
}

// decode maps in onto st.req, reusing st's memory. It rejects what pop's
// Request cannot say or says differently, naming the field; the engine
// checks the rest (pop.Request.Validate). The strings alias in's.
func (st *state) decode(in *rlsv3.RateLimitRequest) error {
	if !utf8.ValidString(in.GetDomain()) {
		return &pop.RequestError{Field: "domain", Msg: "invalid UTF-8"}
	}
	r := &st.req
	r.Domain, r.HitsAddend = in.GetDomain(), int64(in.GetHitsAddend())
	ds := in.GetDescriptors()
	n := 0
	for _, d := range ds {
		n += len(d.GetEntries())
	}
	st.entries = grow(st.entries, n)
	st.hits = grow(st.hits, len(ds))
	st.overrides = grow(st.overrides, len(ds))
	r.Descriptors = grow(r.Descriptors, len(ds))
	n = 0
	for i, d := range ds {
		pd := &r.Descriptors[i]
		start := n
		for j, e := range d.GetEntries() {
			switch {
			case !utf8.ValidString(e.GetKey()):
				return &pop.RequestError{Field: fmt.Sprintf("descriptors[%d].entries[%d].key", i, j), Msg: "invalid UTF-8"}
			case !utf8.ValidString(e.GetValue()):
				return &pop.RequestError{Field: fmt.Sprintf("descriptors[%d].entries[%d].value", i, j), Msg: "invalid UTF-8"}
			}
			st.entries[n] = rules.Entry{Key: e.GetKey(), Value: e.GetValue()}
			n++
		}
		pd.Entries = st.entries[start:n:n]
		pd.HitsAddend, pd.Limit = nil, nil
		if d.GetIsNegativeHits() {
			return &pop.RequestError{Field: fmt.Sprintf("descriptors[%d].is_negative_hits", i), Msg: "is not supported: counts only grow (G-counters), so hits cannot be given back"}
		}
		if h := d.GetHitsAddend(); h != nil {
			if h.GetValue() > pop.MaxHits {
				return &pop.RequestError{Field: fmt.Sprintf("descriptors[%d].hits_addend", i), Msg: fmt.Sprintf("must be at most %d, got %d", pop.MaxHits, h.GetValue())}
			}
			st.hits[i] = int64(h.GetValue())
			pd.HitsAddend = &st.hits[i]
		}
		if o := d.GetLimit(); o != nil {
			u, err := unitOf(o.GetUnit())
			if err != nil {
				return &pop.RequestError{Field: fmt.Sprintf("descriptors[%d].limit.unit", i), Msg: err.Error()}
			}
			st.overrides[i] = pop.Override{RequestsPerUnit: int64(o.GetRequestsPerUnit()), Unit: u, Multiplier: o.GetUnitMultiplier().GetValue()}
			pd.Limit = &st.overrides[i]
		}
	}
	return nil
}

// grow returns s with length n, reusing its memory.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// unitOf maps Envoy's unit to a rules.Unit.
func unitOf(u typev3.RateLimitUnit) (rules.Unit, error) {
	switch u {
	case typev3.RateLimitUnit_SECOND:
		return rules.Second, nil
	case typev3.RateLimitUnit_MINUTE:
		return rules.Minute, nil
	case typev3.RateLimitUnit_HOUR:
		return rules.Hour, nil
	case typev3.RateLimitUnit_DAY:
		return rules.Day, nil
	case typev3.RateLimitUnit_MONTH:
		return rules.Month, nil
	case typev3.RateLimitUnit_YEAR:
		return rules.Year, nil
	}
	return 0, fmt.Errorf("unit %s is not supported (want SECOND, MINUTE, HOUR, DAY, MONTH or YEAR; Envoy's override has no WEEK)", u)
}

// units maps rules.Unit to Envoy's response unit.
var units = [...]rlsv3.RateLimitResponse_RateLimit_Unit{
	rules.Second: rlsv3.RateLimitResponse_RateLimit_SECOND,
	rules.Minute: rlsv3.RateLimitResponse_RateLimit_MINUTE,
	rules.Hour:   rlsv3.RateLimitResponse_RateLimit_HOUR,
	rules.Day:    rlsv3.RateLimitResponse_RateLimit_DAY,
	rules.Week:   rlsv3.RateLimitResponse_RateLimit_WEEK,
	rules.Month:  rlsv3.RateLimitResponse_RateLimit_MONTH,
	rules.Year:   rlsv3.RateLimitResponse_RateLimit_YEAR,
}

var codesOf = [...]rlsv3.RateLimitResponse_Code{pop.OK: rlsv3.RateLimitResponse_OK, pop.OverLimit: rlsv3.RateLimitResponse_OVER_LIMIT}

// replyMemory is the memory of one response. The messages of a single-descriptor
// answer, the common case, are its fields, so that a response is one
// allocation rather than one per message (a dozen with the headers).
type replyMemory struct {
	resp     rlsv3.RateLimitResponse
	status   [1]rlsv3.RateLimitResponse_DescriptorStatus
	statusp  [1]*rlsv3.RateLimitResponse_DescriptorStatus
	limit    [1]rlsv3.RateLimitResponse_RateLimit
	reset    [1]durationpb.Duration
	headers  [len(pop.HeaderNames) + 3]corev3.HeaderValue
	headerps [len(pop.HeaderNames) + 3]*corev3.HeaderValue
}

// response renders res, the decision at now of in, as Envoy's
// RateLimitResponse: what /v1/check answers, field for field, with the
// headers and dynamic metadata c selects.
func (c *Config) response(now time.Time, in *rlsv3.RateLimitRequest, res *pop.Result) *rlsv3.RateLimitResponse {
	r := reply(now, res, c.Headers)
	if c.DynamicMetadata {
		r.DynamicMetadata = dynamicMetadata(in, res)
	}
	if c.EnvoyCompat {
		envoyNames(in, res, r)
	}
	return r
}

// envoyNames gives each status's current_limit the name Envoy's ratelimit
// gives it: the rule's configured name, and none when the rule names the
// limit only by its descriptor path or the descriptor carries a limit of its
// own (an override). The headers keep edgelimit's names.
func envoyNames(in *rlsv3.RateLimitRequest, res *pop.Result, r *rlsv3.RateLimitResponse) {
	for i, ds := range r.GetStatuses() {
		if ds.GetCurrentLimit() == nil || i >= len(res.Statuses) || res.Statuses[i].Limit == nil {
			continue
		}
		name := res.Statuses[i].Limit.ConfiguredName()
		if i < len(in.GetDescriptors()) && in.GetDescriptors()[i].GetLimit() != nil {
			name = ""
		}
		ds.CurrentLimit.Name = name
	}
}

// reply renders res, decided at now, with the rate limit fields of headers.
func reply(now time.Time, res *pop.Result, headers *pop.Headers) *rlsv3.RateLimitResponse {
	r := new(replyMemory)
	n := len(res.Statuses)
	statuses, ptrs, limits, resets := r.status[:], r.statusp[:], r.limit[:], r.reset[:]
	if n > len(statuses) {
		statuses = make([]rlsv3.RateLimitResponse_DescriptorStatus, n)
		ptrs = make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)
		limits = make([]rlsv3.RateLimitResponse_RateLimit, n)
		resets = make([]durationpb.Duration, n)
	}
	out := &r.resp
	out.OverallCode = codesOf[res.Code]
	out.Statuses = ptrs[:n]
	for i := range res.Statuses {
		st := &res.Statuses[i]
		ds := &statuses[i]
		ds.Code = codesOf[st.Code]
		if l := st.Limit; l != nil {
			u := rlsv3.RateLimitResponse_RateLimit_UNKNOWN
			if int(l.Unit) < len(units) {
				u = units[l.Unit]
			}
			cl := &limits[i]
			cl.Name, cl.RequestsPerUnit, cl.Unit = l.Name, clampU32(l.Spec.Limit), u
			ds.CurrentLimit = cl
			ds.LimitRemaining = clampU32(st.Remaining)
			resets[i].Seconds = pop.Seconds(st.UntilReset())
			ds.DurationUntilReset = &resets[i]
		} else if st.Unlimited {
			ds.LimitRemaining = math.MaxUint32 // as Envoy's ratelimit reports an unlimited descriptor
		}
		ptrs[i] = ds
	}
	if !headers.Default() {
		var buf [len(r.headers)]pop.Field
		fields := headers.AppendFields(buf[:0], now, res)
		if len(fields) > 0 {
			out.ResponseHeadersToAdd = r.headerps[:len(fields)]
		}
		for i, f := range fields {
			h := &r.headers[i]
			h.Key, h.Value = f.Name, f.Value
			out.ResponseHeadersToAdd[i] = h
		}
		return out
	}
	if vals := pop.HeaderValues(now, res); len(vals) > 0 {
		out.ResponseHeadersToAdd = r.headerps[:len(vals)]
		for i, v := range vals {
			h := &r.headers[i]
			h.Key, h.Value = pop.HeaderNames[i], v
			out.ResponseHeadersToAdd[i] = h
		}
	}
	return out
}

func clampU32(v int64) uint32 { return uint32(min(max(v, 0), 1<<32-1)) }
