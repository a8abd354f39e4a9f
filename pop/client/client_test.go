package client_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/edgelimit/edgelimit/pop/client"
	"github.com/edgelimit/edgelimit/pop/poptest"
	"github.com/edgelimit/edgelimit/pop/store"
	"github.com/edgelimit/edgelimit/pop/store/redistest"
)

// holderEnv, when set to a PoP's URL, makes the test binary a lease holder
// (see holder) instead of running tests.
const holderEnv = "EDGELIMIT_CLIENT_TEST_HOLDER"

func TestMain(m *testing.M) {
	if url := os.Getenv(holderEnv); url != "" {
		holder(url)
		return
	}
	code := m.Run()
	poptest.Cleanup()
	os.Exit(code)
}

// holder takes a lease for api_key=crash, prints it and waits to be killed.
func holder(url string) {
	c, _ := client.New(client.Config{URL: url, Timeout: 2 * time.Second})
	d, err := c.Check(context.Background(), keyReq("crash"))
	if err != nil || !d.Allowed || d.Lease == "" {
		fmt.Printf("FAILED %v %+v\n", err, d)
		os.Exit(1)
	}
	fmt.Println("LEASE " + d.Lease)
	time.Sleep(time.Hour)
}

const concRules = `domain: app
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100000}
    concurrency: {max: %d, lease_ttl: %s}
`

func keyReq(key string) client.Request {
	return client.Request{Domain: "app", Descriptors: []client.Descriptor{{Entries: []client.Entry{{Key: "api_key", Value: key}}}}}
}

func byHeader(r *http.Request) (client.Request, bool) {
	k := r.Header.Get("X-API-Key")
	return keyReq(k), k != ""
}

func get(t *testing.T, url, key string) *http.Response {
	t.Helper()
	r, _ := http.NewRequest(http.MethodGet, url, nil)
	r.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// The middleware holds a lease while the handler runs, copies the fields,
// answers 429 when the slots are taken, and releases on return and on panic.
func TestMiddlewareLeases(t *testing.T) {
	pop := poptest.Start(t, "--rules", poptest.Rules(t, fmt.Sprintf(concRules, 2, "30s")))
	c, err := client.New(client.Config{URL: pop.URL, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	block := make(chan struct{})
	entered := make(chan string, 4)
	app := httptest.NewServer(recoverer(c.Middleware(byHeader, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- client.LeaseFromContext(r.Context())
		switch r.URL.Path {
		case "/block":
			<-block
		case "/panic":
			panic("boom")
		}
	}))))
	defer app.Close()

	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); get(t, app.URL+"/block", "k") }()
	}
	for range 2 {
		if l := <-entered; l == "" {
			t.Fatal("an admitted request's handler holds no lease")
		}
	}
	resp := get(t, app.URL+"/", "k")
	if resp.StatusCode != 429 || !strings.Contains(resp.Header.Get("RateLimit-Policy"), `qu="concurrent-requests"`) || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("third request while two are in flight: %d %v; want 429 with the concurrency policy and Retry-After", resp.StatusCode, resp.Header)
	}
	close(block)
	wg.Wait()
	// Released on return: two more fit. And a handler that panics releases too.
	for i := range 3 {
		if resp := get(t, app.URL+"/panic", "k"); resp.StatusCode != 500 {
			t.Fatalf("panic request %d: %d, want the recoverer's 500 (429: a panicking handler leaked its slot)", i, resp.StatusCode)
		}
		<-entered
	}
	if resp := get(t, app.URL+"/", "k"); resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Limit") != "2" {
		t.Fatalf("after the panics: %d %v", resp.StatusCode, resp.Header)
	}
}

// recoverer turns a handler's panic into a 500, as an application's
// recovery middleware outside the rate limit middleware would.
func recoverer(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if recover() != nil {
				w.WriteHeader(http.StatusInternalServerError)
			}
		}()
		h.ServeHTTP(w, r)
	})
}

// A PoP that does not answer within the deadline: fail closed is a 503 in
// about Timeout, fail open serves.
func TestMiddlewareDeadline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
		}
	}()
	for _, open := range []bool{false, true} {
		var failures atomic.Int32
		c, _ := client.New(client.Config{URL: "http://" + ln.Addr().String(), Timeout: 50 * time.Millisecond, FailOpen: open,
			OnError: func(error) { failures.Add(1) }})
		app := httptest.NewServer(c.Middleware(byHeader, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
		start := time.Now()
		resp := get(t, app.URL, "k")
		took := time.Since(start)
		app.Close()
		want := 503
		if open {
			want = 200
		}
		if resp.StatusCode != want || took > time.Second || failures.Load() != 1 {
			t.Errorf("fail open %v: %d after %v (%d errors reported), want %d within the 50ms deadline", open, resp.StatusCode, took, failures.Load(), want)
		}
	}
}

// Over gRPC (Envoy's protocol) the client checks and copies the fields; the
// PoP applies no concurrency limit there, and the client holds no lease.
func TestGRPCCheckAndInterceptor(t *testing.T) {
	gaddr := poptest.FreeAddr(t)
	rules := poptest.Rules(t, "domain: app\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: 2}\n    concurrency: {max: 1}\n")
	pop := poptest.Start(t, "--rules", rules, "--grpc-listen", gaddr)
	conn, err := grpc.NewClient(gaddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c, _ := client.New(client.Config{GRPC: conn, URL: pop.URL, Timeout: 2 * time.Second})
	icpt := c.UnaryServerInterceptor(func(context.Context, string, any) (client.Request, bool) { return keyReq("g"), true })
	info := &grpc.UnaryServerInfo{FullMethod: "/app.Orders/Create"}
	var leases []string
	handler := func(ctx context.Context, _ any) (any, error) {
		leases = append(leases, client.LeaseFromContext(ctx))
		return "ok", nil
	}
	for i := range 2 {
		if _, err := icpt(context.Background(), nil, info, handler); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	_, err = icpt(context.Background(), nil, info, handler)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third call: %v, want ResourceExhausted (2/min)", err)
	}
	if leases[0] != "" || leases[1] != "" {
		t.Fatalf("leases over gRPC %q: the PoP must not hand out leases there", leases)
	}
	d, err := c.Check(context.Background(), keyReq("g"))
	if err != nil || d.Allowed || d.Header.Get("Retry-After") == "" || d.RetryAfter <= 0 {
		t.Fatalf("gRPC Check: %+v %v; want denied with Retry-After", d, err)
	}
}

// The interceptor over HTTP holds a lease around the handler and releases it
// when the handler panics.
func TestInterceptorReleasesOnPanic(t *testing.T) {
	pop := poptest.Start(t, "--rules", poptest.Rules(t, fmt.Sprintf(concRules, 1, "30s")))
	c, _ := client.New(client.Config{URL: pop.URL, Timeout: 2 * time.Second})
	icpt := c.UnaryServerInterceptor(func(context.Context, string, any) (client.Request, bool) { return keyReq("p"), true })
	info := &grpc.UnaryServerInfo{FullMethod: "/app.Orders/Create"}
	call := func(h grpc.UnaryHandler) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panic: %v", r)
			}
		}()
		_, err = icpt(context.Background(), nil, info, h)
		return err
	}
	inner := func(ctx context.Context, _ any) (any, error) {
		if client.LeaseFromContext(ctx) == "" {
			return nil, errors.New("no lease")
		}
		// The only slot is held: another call is denied meanwhile.
		if _, err := icpt(ctx, nil, info, func(context.Context, any) (any, error) { return nil, nil }); status.Code(err) != codes.ResourceExhausted {
			return nil, fmt.Errorf("nested call while the slot is held: %v", err)
		}
		panic("boom")
	}
	if err := call(inner); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("first call: %v", err)
	}
	if err := call(func(context.Context, any) (any, error) { return nil, nil }); err != nil {
		t.Fatalf("after the panic: %v (the slot leaked)", err)
	}
}

// leasesKnown marks a fresh redis-server as holding every lease ever granted
// (store.LeaseMarkerKey at the epoch), as a Redis that always kept its data
// would; otherwise the PoPs would refuse every lease for one lease_ttl, not
// knowing that the Redis is new rather than emptied (docs/durability-leases.md).
func leasesKnown(t *testing.T, r *redistest.Server) {
	t.Helper()
	if _, err := r.Do("SET", store.LeaseMarkerKey, "0"); err != nil {
		t.Fatal(err)
	}
}

// 64 goroutines on each of 3 PoP processes sharing one redis-server never
// hold more than the limit at once, counted in the application's handlers
// (each holds its request 10 ms).
func TestThreePoPsOneRedis(t *testing.T) {
	const limit, perPoP, rounds = 10, 64, 25
	redis := redistest.Start(t)
	leasesKnown(t, redis)
	rules := poptest.Rules(t, fmt.Sprintf(concRules, limit, "30s"))
	var inFlight, most, acquired, denied, noLease atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if client.LeaseFromContext(r.Context()) == "" {
			noLease.Add(1) // admitted without a lease: the PoP failed open
		}
		n := inFlight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		acquired.Add(1)
		time.Sleep(10 * time.Millisecond)
		inFlight.Add(-1)
	})
	var wg sync.WaitGroup
	start := time.Now()
	for range 3 {
		// A generous Redis deadline: on a shared 2-core box a 5 ms one
		// times out, and the PoP then fails open (counted as noLease).
		pop := poptest.Start(t, "--rules", rules, "--store", redis.URL(), "--redis-timeout", "2s")
		c, _ := client.New(client.Config{URL: pop.URL, Timeout: 5 * time.Second})
		h := c.Middleware(func(*http.Request) (client.Request, bool) { return keyReq("shared"), true }, handler)
		for range perPoP {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
					switch rec.Code {
					case 200:
					case 429:
						denied.Add(1)
					default:
						t.Errorf("status %d: %s", rec.Code, rec.Body)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	t.Logf("3 PoPs × %d goroutines × %d rounds on one Redis, limit %d: %d acquisitions, %d denied, at most %d in flight at once, %d admitted without a lease, %v",
		perPoP, rounds, limit, acquired.Load(), denied.Load(), most.Load(), noLease.Load(), time.Since(start).Round(time.Millisecond))
	if most.Load() > limit {
		t.Fatalf("%d requests in flight at once, the limit is %d", most.Load(), limit)
	}
	if noLease.Load() > 0 {
		t.Fatalf("%d requests admitted without a lease (the lease store failed open)", noLease.Load())
	}
	// The slots were full (denials), and the handlers saw most of them
	// taken at once. A slot is held from the check's answer to the
	// release's, longer than the handler runs, so on a loaded machine the
	// handlers' own count can stay below the limit while the PoPs deny.
	if denied.Load() == 0 || most.Load() < limit/2 {
		t.Fatalf("at most %d in flight and %d denied: the test never reached the limit, so it proves nothing", most.Load(), denied.Load())
	}
}

// A holder killed with SIGKILL never releases; its slot comes back when the
// lease's TTL ends, on a PoP sharing the Redis with the one it took it from.
func TestCrashedHolderSlotReturns(t *testing.T) {
	const ttl = 2 * time.Second
	redis := redistest.Start(t)
	leasesKnown(t, redis)
	rules := poptest.Rules(t, fmt.Sprintf(concRules, 1, ttl))
	a := poptest.Start(t, "--rules", rules, "--store", redis.URL(), "--redis-timeout", "1s")
	b := poptest.Start(t, "--rules", rules, "--store", redis.URL(), "--redis-timeout", "1s")

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holderEnv+"="+a.URL)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	acquiredBy := time.Now() // the lease was taken before this
	if err != nil || !strings.HasPrefix(line, "LEASE ") {
		t.Fatalf("holder: %q %v", line, err)
	}
	c, _ := client.New(client.Config{URL: b.URL, Timeout: 2 * time.Second})
	if d, err := c.Check(context.Background(), keyReq("crash")); err != nil || d.Allowed {
		t.Fatalf("while the holder lives: %+v %v; want denied", d, err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	for {
		d, err := c.Check(context.Background(), keyReq("crash"))
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			back := time.Since(acquiredBy)
			t.Logf("slot back %v after the holder's acquisition (lease_ttl %v)", back.Round(time.Millisecond), ttl)
			if back < ttl-200*time.Millisecond || back > ttl+time.Second {
				t.Fatalf("slot back after %v, want about the TTL %v", back, ttl)
			}
			_ = c.Release(context.Background(), d.Lease)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
