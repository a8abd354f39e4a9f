package grpcapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/httpapi"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/limit/limittest"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
)

// t0 is 10s into a minute, so a minute limit resets in 50s.
var t0 = limittest.T0.Add(10 * time.Second)

func lim(path string, n int64, u rules.Unit) *rules.Limit {
	return &rules.Limit{Domain: "api", Path: path, Name: path, Unit: u,
		Spec: limit.Spec{Algorithm: limit.SlidingWindow, Limit: n, Window: int64(u.Duration())}}
}

// testRules: api_key 100/min, api_key+endpoint 20/min, remote_address 3/min,
// internal unlimited, user 1/min in shadow mode.
func testRules(t testing.TB) *rules.Set {
	root := &rules.Node{}
	root.Child("api_key", "").Add(lim("api_key", 100, rules.Minute))
	root.Child("api_key", "").Child("endpoint", "POST /orders").Add(lim("api_key.endpoint=POST /orders", 20, rules.Minute))
	root.Child("remote_address", "").Add(lim("remote_address", 3, rules.Minute))
	root.Child("internal", "").Add(&rules.Limit{Domain: "api", Path: "internal", Name: "internal", Unlimited: true})
	sh := lim("user", 1, rules.Minute)
	sh.Shadow = true
	root.Child("user", "").Add(sh)
	set, err := rules.NewSet(rules.NewDomain("api", "test", root))
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// slowStore is the real store behind a gate: while gate is set, every check
// waits for it to close or for the caller's context to end. It lets tests
// hold a call in flight.
type slowStore struct {
	pop.Store
	mu      sync.Mutex
	gate    chan struct{}
	entered chan context.Context // a held call's context, as the call reaches the gate
	left    chan error           // why a held call left the gate: nil (it opened) or its context's error
}

func (s *slowStore) CheckAt(ctx context.Context, now, hits int64, items []limit.Item, out []limit.Decision) error {
	s.mu.Lock()
	gate, entered, left := s.gate, s.entered, s.left
	s.mu.Unlock()
	if gate != nil {
		entered <- ctx
		select {
		case <-gate:
			left <- nil
		case <-ctx.Done():
			left <- ctx.Err()
			return ctx.Err()
		}
	}
	return s.Store.CheckAt(ctx, now, hits, items, out)
}

func (s *slowStore) hold() chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gate = make(chan struct{})
	s.entered = make(chan context.Context, 16)
	s.left = make(chan error, 16)
	return s.gate
}

// within bounds the waits for what a loaded machine may be slow to get
// around to (a call reaching the store, an answer, a stop): long enough
// never to be the reason a test fails, and a test that waits it out fails
// saying what did not happen instead of hanging until go test's timeout.
const within = 2 * time.Minute

// recv receives from c, or fails the test after within.
func recv[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(within):
		t.Fatalf("%s: not within %v", what, within)
		panic("unreachable")
	}
}

type fixture struct {
	srv    *Server
	store  *slowStore
	engine *pop.Engine
	client rlsv3.RateLimitServiceClient
	health healthpb.HealthClient
	conn   *grpc.ClientConn
	reg    *prometheus.Registry // holds edgelimit_grpc_requests_total
	addr   string               // the server's address
}

// start serves a Server on a loopback port with the real engine and the
// embedded store, at the fixed instant t0, and dials it. set, if given,
// changes the Server's Config first.
func start(t *testing.T, set ...func(*Config)) *fixture {
	t.Helper()
	st := &slowStore{Store: store.NewMemory(store.MemoryConfig{})}
	eng := pop.NewEngine(st, testRules(t), nil)
	reg := prometheus.NewRegistry()
	cfg := Config{Engine: eng, Requests: NewRequestCounter(reg), Now: func() time.Time { return t0 }}
	for _, f := range set {
		f(&cfg)
	}
	srv := New(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	srv.SetServing(true)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Stop(ctx)
	})
	return &fixture{srv: srv, store: st, engine: eng, client: rlsv3.NewRateLimitServiceClient(conn), health: healthpb.NewHealthClient(conn), conn: conn, reg: reg, addr: ln.Addr().String()}
}

func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func check(t *testing.T, f *fixture, r *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	resp, err := f.client.ShouldRateLimit(ctx, r)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%v): %v", r, err)
	}
	return resp
}

func headers(hs []*corev3.HeaderValue) map[string]string {
	m := map[string]string{}
	for _, h := range hs {
		m[h.Key] = h.Value
	}
	return m
}

// TestShouldRateLimitContract walks every field of the request and of the
// response through a real client and server.
func TestShouldRateLimitContract(t *testing.T) {
	f := start(t)
	ip := func() *ratelimitv3.RateLimitDescriptor { return desc("remote_address", "1.2.3.4") }

	t.Run("allowed: every response field", func(t *testing.T) {
		resp := check(t, f, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("api_key", "k", "endpoint", "POST /orders"), desc("api_key", "k"), desc("nomatch", "x")}})
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.Statuses) != 3 {
			t.Fatalf("got %v", resp)
		}
		s := resp.Statuses[0]
		if s.Code != rlsv3.RateLimitResponse_OK || s.CurrentLimit.GetName() != "api_key.endpoint=POST /orders" ||
			s.CurrentLimit.GetRequestsPerUnit() != 20 || s.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE ||
			s.LimitRemaining != 19 || s.DurationUntilReset.AsDuration() != 50*time.Second {
			t.Fatalf("status 0: %v", s)
		}
		if s := resp.Statuses[1]; s.LimitRemaining != 99 || s.CurrentLimit.GetRequestsPerUnit() != 100 {
			t.Fatalf("status 1: %v", s)
		}
		if s := resp.Statuses[2]; s.Code != rlsv3.RateLimitResponse_OK || s.CurrentLimit != nil || s.DurationUntilReset != nil {
			t.Fatalf("unmatched descriptor: %v", s)
		}
		h := headers(resp.ResponseHeadersToAdd)
		want := map[string]string{
			"X-Ratelimit-Limit":     "20",
			"X-Ratelimit-Remaining": "19",
			"X-Ratelimit-Reset":     "1767225660", // t0 + 50s
			"Ratelimit-Policy":      `"api_key.endpoint=POST /orders";q=20;w=60, "api_key";q=100;w=60`,
			"Ratelimit":             `"api_key.endpoint=POST /orders";r=19;t=50`,
		}
		if want["X-Ratelimit-Reset"] = itoa(t0.Unix() + 50); !equal(h, want) {
			t.Fatalf("headers\n got %v\nwant %v", h, want)
		}
	})

	t.Run("request hits_addend, then over limit with Retry-After", func(t *testing.T) {
		resp := check(t, f, &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 3, Descriptors: []*ratelimitv3.RateLimitDescriptor{ip()}})
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("3 hits: %v", resp)
		}
		resp = check(t, f, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{ip()}})
		s := resp.Statuses[0]
		if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || s.Code != rlsv3.RateLimitResponse_OVER_LIMIT || s.LimitRemaining != 0 || s.DurationUntilReset.GetSeconds() <= 0 {
			t.Fatalf("4th hit: %v", resp)
		}
		h := headers(resp.ResponseHeadersToAdd)
		if h["Retry-After"] == "" || h["X-Ratelimit-Remaining"] != "0" || !strings.Contains(h["Ratelimit"], ";r=0;t="+h["Retry-After"]) {
			t.Fatalf("denial headers: %v", h)
		}
	})

	t.Run("descriptor hits_addend 0 counts nothing", func(t *testing.T) {
		d := desc("api_key", "peek")
		d.HitsAddend = wrapperspb.UInt64(0)
		for range 3 {
			resp := check(t, f, &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 7, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
			if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 100 {
				t.Fatalf("peek: %v", resp)
			}
		}
		// The peek of a full limit is OVER_LIMIT; it makes the request over.
		full := ip()
		full.HitsAddend = wrapperspb.UInt64(0)
		resp := check(t, f, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{full}})
		if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("peek at a full limit: %v", resp)
		}
	})

	t.Run("descriptor hits_addend overrides the request's", func(t *testing.T) {
		d := desc("api_key", "dh")
		d.HitsAddend = wrapperspb.UInt64(10)
		resp := check(t, f, &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 2, Descriptors: []*ratelimitv3.RateLimitDescriptor{d, desc("api_key", "other")}})
		if resp.Statuses[0].LimitRemaining != 90 || resp.Statuses[1].LimitRemaining != 98 {
			t.Fatalf("got %v", resp.Statuses)
		}
	})

	t.Run("limit override", func(t *testing.T) {
		d := desc("api_key", "ov")
		d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_HOUR}
		var resp *rlsv3.RateLimitResponse
		for range 3 {
			resp = check(t, f, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
		}
		s := resp.Statuses[0]
		if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || s.CurrentLimit.GetRequestsPerUnit() != 2 || s.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR {
			t.Fatalf("3rd hit on an override of 2/hour: %v", resp)
		}
	})

	t.Run("unlimited, shadow, empty descriptor and unknown domain answer OK", func(t *testing.T) {
		resp := check(t, f, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("internal", "x"), desc("user", "u"), desc("user", "u"), {}}})
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.Statuses) != 4 || len(resp.ResponseHeadersToAdd) != 0 {
			t.Fatalf("got %v", resp)
		}
		resp = check(t, f, &rlsv3.RateLimitRequest{Domain: "nowhere", Descriptors: []*ratelimitv3.RateLimitDescriptor{ip()}})
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
			t.Fatalf("unknown domain: %v", resp)
		}
	})
}

// TestInvalidArgument: bad input is codes.InvalidArgument naming the field.
func TestInvalidArgument(t *testing.T) {
	f := start(t)
	long := strings.Repeat("k", pop.MaxKeyBytes+1)
	neg := desc("api_key", "k")
	neg.IsNegativeHits = true
	neg.HitsAddend = wrapperspb.UInt64(1)
	unknown := desc("api_key", "k")
	unknown.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_UNKNOWN}
	mult := desc("api_key", "k")
	mult.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_YEAR, UnitMultiplier: wrapperspb.UInt32(11)}
	huge := desc("api_key", "k")
	huge.HitsAddend = wrapperspb.UInt64(pop.MaxHits + 1)
	cases := []struct {
		name, field string
		r           *rlsv3.RateLimitRequest
	}{
		{"empty domain", "domain", &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "b")}}},
		{"no descriptors", "descriptors", &rlsv3.RateLimitRequest{Domain: "api"}},
		{"long key", "descriptors[0].entries[0].key", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(long, "v")}}},
		{"long value", "descriptors[1].entries[0].value", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "b"), desc("k", strings.Repeat("v", pop.MaxValueBytes+1))}}},
		{"empty key", "descriptors[0].entries[0].key", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("", "v")}}},
		{"huge request hits", "hits_addend", &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: pop.MaxHits + 1, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "b")}}},
		{"huge descriptor hits", "descriptors[0].hits_addend", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{huge}}},
		{"negative hits", "descriptors[0].is_negative_hits", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{neg}}},
		{"unknown unit override", "descriptors[0].limit.unit", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{unknown}}},
		{"window over ten years", "descriptors[0].limit.unit_multiplier", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{mult}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := f.client.ShouldRateLimit(context.Background(), c.r)
			if status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(status.Convert(err).Message(), c.field+":") {
				t.Fatalf("got %v, want InvalidArgument naming %s", err, c.field)
			}
		})
	}
}

// TestRequestCounter: every call is counted once under its method and
// code, answers (OK and OVER_LIMIT alike) as OK.
func TestRequestCounter(t *testing.T) {
	f := start(t)
	ip := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address", "9.9.9.9")}}
	for range 5 { // 3/min: OK, OK, OK, OVER_LIMIT, OVER_LIMIT
		check(t, f, ip)
	}
	for range 2 {
		if _, err := f.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api"}); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("no descriptors: got %v", err)
		}
	}
	if _, err := f.health.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			got[mf.GetName()+" "+l["method"]+l["reason"]+" "+l["code"]] = m.GetCounter().GetValue()
		}
	}
	want := map[string]float64{
		"edgelimit_grpc_requests_total ShouldRateLimit OK":              5,
		"edgelimit_grpc_requests_total ShouldRateLimit InvalidArgument": 2,
		"edgelimit_grpc_requests_total Check OK":                        1,
		// Nothing was turned away, and each reason shows as 0.
		"edgelimit_grpc_refused_total conns ":        0,
		"edgelimit_grpc_refused_total memory ":       0,
		"edgelimit_grpc_refused_total read_timeout ": 0,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("counts\n got %v\nwant %v", got, want)
	}
}

// TestDeadlineAndCancel: the caller's deadline and cancellation reach the
// store, and the call ends with the caller's code.
func TestDeadlineAndCancel(t *testing.T) {
	r := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", "slow")}}

	// The deadline. The call has to reach the store before its deadline
	// passes, which a loaded machine may not get around to in a short one
	// (the client then gives up before the server has the call, and the
	// store never sees it). Such a try is made again, on a fresh server, with
	// a deadline four times as long. The connection is up before each try,
	// so that dialing is no part of the deadline.
	var f *fixture
	for d := 100 * time.Millisecond; ; d *= 4 {
		f = start(t)
		if _, err := f.health.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
		release := f.store.hold()
		t.Cleanup(func() { close(release) })
		ctx, cancel := context.WithTimeout(context.Background(), d)
		errc := make(chan error, 1)
		go func() { _, err := f.client.ShouldRateLimit(ctx, r); errc <- err }()
		var inStore context.Context
		var answer error // the call's, if it came first
		answered := false
		select {
		case inStore = <-f.store.entered:
		case answer = <-errc:
			answered = true
			if status.Code(answer) != codes.DeadlineExceeded {
				t.Fatalf("deadline: got %v", answer)
			}
			select {
			case inStore = <-f.store.entered: // it did reach the store, and ended there
			default:
			}
		case <-time.After(d + within):
			t.Fatalf("deadline of %v: the call neither reached the store nor ended within %v", d, within)
		}
		if inStore == nil {
			cancel()
			if 4*d > within {
				t.Fatalf("no call reached the store before its deadline, %v the longest", d)
			}
			t.Logf("the call's deadline (%v) passed before it reached the store; trying again with %v", d, 4*d)
			continue
		}
		if _, ok := inStore.Deadline(); !ok {
			t.Fatal("the store's context has no deadline")
		}
		// The held call leaves the store when the deadline passes: by the
		// server's own timer (DeadlineExceeded) or, as a rule first, by the
		// client's cancel of the stream when its timer fires (Canceled).
		if err := recv(t, f.store.left, "the held call leaving the store at its deadline"); err != context.DeadlineExceeded && err != context.Canceled {
			t.Fatalf("the held call left the store with %v, want its context's end", err)
		}
		if !answered {
			answer = recv(t, errc, "the call's answer")
		}
		if status.Code(answer) != codes.DeadlineExceeded {
			t.Fatalf("deadline: got %v", answer)
		}
		cancel()
		break
	}

	// Cancellation, on the last server (its store still held).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { _, err := f.client.ShouldRateLimit(ctx, r); errc <- err }()
	select {
	case <-f.store.entered: // the call is in the store
	case err := <-errc:
		t.Fatalf("cancel: the call ended before it reached the store: %v", err)
	case <-time.After(within):
		t.Fatalf("cancel: the call did not reach the store within %v", within)
	}
	cancel()
	if err := recv(t, f.store.left, "the canceled call leaving the store"); err != context.Canceled {
		t.Fatalf("the canceled call left the store with %v, want %v", err, context.Canceled)
	}
	if err := recv(t, errc, "the canceled call's answer"); status.Code(err) != codes.Canceled {
		t.Fatalf("cancel: got %v", err)
	}
}

// TestHealth: NOT_SERVING before SetServing(true), SERVING after, and
// NOT_SERVING to a watcher when the server stops.
func TestHealth(t *testing.T) {
	f := start(t)
	ctx := context.Background()
	f.srv.SetServing(false)
	for _, svc := range []string{"", ServiceName} {
		if r, err := f.health.Check(ctx, &healthpb.HealthCheckRequest{Service: svc}); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("before serving %q: %v %v", svc, r, err)
		}
	}
	f.srv.SetServing(true)
	watch, err := f.health.Watch(ctx, &healthpb.HealthCheckRequest{Service: ServiceName})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := watch.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("serving: %v %v", r, err)
	}
	// The watch stream stays in flight, so Stop waits for sctx; it is ended
	// once the watcher has its answer (or after within, which cuts the
	// stream: then Recv fails).
	sctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	stopped := make(chan struct{})
	go func() {
		f.srv.Stop(sctx)
		close(stopped)
	}()
	if r, err := watch.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("on stop: %v %v", r, err)
	}
	cancel()
	recv(t, stopped, "Stop returning once its deadline passed")
}

// TestGracefulStop: a call in flight when Stop begins is answered; new calls
// are refused; a call still running at the deadline is cut off.
func TestGracefulStop(t *testing.T) {
	f := start(t)
	release := f.store.hold()
	r := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", "inflight")}}
	errc := make(chan error, 1)
	go func() { _, err := f.client.ShouldRateLimit(context.Background(), r); errc <- err }()
	recv(t, f.store.entered, "the call reaching the store")

	stopped := make(chan struct{})
	go func() {
		f.srv.Stop(context.Background())
		close(stopped)
	}()
	select {
	case <-stopped:
		t.Fatal("Stop returned with a call in flight")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := recv(t, errc, "the in-flight call's answer"); err != nil {
		t.Fatalf("in-flight call: %v", err)
	}
	recv(t, stopped, "Stop returning once the call in flight was answered")
	if _, err := f.client.ShouldRateLimit(context.Background(), r); status.Code(err) != codes.Unavailable {
		t.Fatalf("after stop: %v, want Unavailable", err)
	}

	// A call that outlives the shutdown deadline is cut off.
	g := start(t)
	g.store.hold()
	go func() { _, err := g.client.ShouldRateLimit(context.Background(), r); errc <- err }()
	recv(t, g.store.entered, "the call reaching the store")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	g.srv.Stop(ctx)
	if err := recv(t, errc, "the cut-off call's answer"); status.Code(err) != codes.Unavailable {
		t.Fatalf("call past the deadline: %v, want Unavailable", err)
	}
}

// TestSameAnswersAsHTTP: the same requests to the gRPC service and to
// /v1/check give the same answers, status for status and header for header.
// Each API fronts its own engine with the same rules and a fresh store at
// the same instant, so that both see the same counts.
func TestSameAnswersAsHTTP(t *testing.T) {
	f := start(t)
	eng := pop.NewEngine(store.NewMemory(store.MemoryConfig{}), testRules(t), nil)
	hs := httptest.NewServer(httpapi.New(httpapi.Config{Engine: eng, Now: func() time.Time { return t0 }}))
	defer hs.Close()

	d := func(kv ...string) *ratelimitv3.RateLimitDescriptor { return desc(kv...) }
	peek := d("api_key", "k")
	peek.HitsAddend = wrapperspb.UInt64(0)
	ov := d("remote_address", "9.9.9.9")
	ov.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_SECOND}
	reqs := []*rlsv3.RateLimitRequest{
		{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{d("api_key", "k", "endpoint", "POST /orders"), d("api_key", "k")}},
		{Domain: "api", HitsAddend: 2, Descriptors: []*ratelimitv3.RateLimitDescriptor{d("remote_address", "1.1.1.1")}},
		{Domain: "api", HitsAddend: 2, Descriptors: []*ratelimitv3.RateLimitDescriptor{d("remote_address", "1.1.1.1")}},
		{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{peek, d("user", "u"), d("internal", "i")}},
		{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{ov}},
		{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{ov}},
		{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{{}}},
		{Domain: "other", Descriptors: []*ratelimitv3.RateLimitDescriptor{d("api_key", "k")}},
	}
	for i, r := range reqs {
		g := check(t, f, r)
		body, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		// protojson quotes 64-bit integers ("hits_addend":"0"); /v1/check
		// takes them as JSON numbers only (see docs/envoy-parity.md).
		body = quoted64.ReplaceAll(body, []byte(`"hits_addend":$1`))
		resp, err := http.Post(hs.URL+"/v1/check", "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		var h struct {
			OverallCode string `json:"overall_code"`
			Statuses    []struct {
				Code         string `json:"code"`
				CurrentLimit *struct {
					Name            string `json:"name"`
					RequestsPerUnit uint32 `json:"requests_per_unit"`
					Unit            string `json:"unit"`
				} `json:"current_limit"`
				LimitRemaining     uint32 `json:"limit_remaining"`
				DurationUntilReset string `json:"duration_until_reset"`
			} `json:"statuses"`
		}
		err = json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("request %d: HTTP %d: %v", i, resp.StatusCode, err)
		}
		if h.OverallCode != g.OverallCode.String() || len(h.Statuses) != len(g.Statuses) {
			t.Fatalf("request %d (%s): HTTP %+v, gRPC %v", i, body, h, g)
		}
		for j, hs := range h.Statuses {
			gs := g.Statuses[j]
			same := hs.Code == gs.Code.String() && hs.LimitRemaining == gs.LimitRemaining && (hs.CurrentLimit == nil) == (gs.CurrentLimit == nil)
			if same && hs.CurrentLimit != nil {
				same = hs.CurrentLimit.Name == gs.CurrentLimit.Name && hs.CurrentLimit.RequestsPerUnit == gs.CurrentLimit.RequestsPerUnit &&
					hs.CurrentLimit.Unit == gs.CurrentLimit.Unit.String() && hs.DurationUntilReset == itoa(gs.DurationUntilReset.GetSeconds())+"s"
			}
			if !same {
				t.Fatalf("request %d (%s) status %d: HTTP %+v, gRPC %v", i, body, j, hs, gs)
			}
		}
		gh := headers(g.ResponseHeadersToAdd)
		for _, name := range pop.HeaderNames {
			if got := resp.Header.Get(name); got != gh[name] {
				t.Fatalf("request %d header %s: HTTP %q, gRPC %q", i, name, got, gh[name])
			}
		}
	}
}

var quoted64 = regexp.MustCompile(`"hits_addend":\s*"(\d+)"`)

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func equal(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
