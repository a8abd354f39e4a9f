package httpapi

import (
	"bytes"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/limit/limittest"
	"github.com/edgelimit/edgelimit/pop/quota"
	"github.com/edgelimit/edgelimit/pop/quota/pgtest"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
)

// syncBuffer is a log sink safe for the handler's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newAdminWith serves the admin API over st with adminRules, a store
// timeout and a log.
func newAdminWith(t *testing.T, st quota.Store, timeout time.Duration, log *syncBuffer) *httptest.Server {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(p, []byte(adminRules), 0o644); err != nil {
		t.Fatal(err)
	}
	set, _, err := rules.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	eng := pop.NewEngine(store.NewMemory(store.MemoryConfig{}), set, nil)
	srv := httptest.NewServer(NewAdmin(AdminConfig{Store: st, Engine: eng, Token: adminToken, StoreTimeout: timeout,
		Logger: slog.New(slog.NewTextHandler(log, nil)), Now: func() time.Time { return limittest.T0 }}))
	t.Cleanup(srv.Close)
	return srv
}

func adminDo(t *testing.T, srv *httptest.Server, method, path, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	c := &http.Client{Timeout: 2 * time.Minute}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

// blackHole listens on a free loopback port, accepts every connection and
// never answers, as a PostgreSQL behind a dropped route seems to a client
// whose SYN got through. It returns the address.
func blackHole(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

const seedOverride = `{"tier":"enterprise","overrides":[{"descriptor":"endpoint:POST /api/v1/orders","requests_per_unit":500,"unit":"minute"}]}`

// With PostgreSQL black-holed (connections accepted, never answered), an
// admin write is answered 503 within the store timeout. Before, it got no
// answer at all: the request waited as long as the client did.
func TestAdminStoreBlackHoled(t *testing.T) {
	pg, err := quota.NewPostgres("postgres://edgeadmin@" + blackHole(t) + "/quotas_db?sslmode=disable&connect_timeout=0")
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	var log syncBuffer
	srv := newAdminWith(t, pg, time.Second, &log)
	start := time.Now()
	code, body := adminDo(t, srv, "PUT", "/admin/v1/quotas/abc123", `{"tier":"pro"}`)
	took := time.Since(start)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "quota store unavailable") {
		t.Fatalf("PUT with PostgreSQL black-holed: %d %s; want 503 quota store unavailable", code, body)
	}
	// The timeout is 1 s; the bound only says when a hung request fails the
	// test on a loaded machine.
	if took > 30*time.Second {
		t.Fatalf("PUT answered after %v with a 1 s store timeout", took)
	}
}

// With PostgreSQL refusing connections, the 503 says "quota store
// unavailable" and nothing of the database (user, name, host:port); the log
// has the detail. Before, the 503's message carried the driver's error with
// all three.
func TestAdminStoreRefusingHidesDetail(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: connections are refused
	pg, err := quota.NewPostgres("postgres://edgeadmin@" + addr + "/quotas_db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	var log syncBuffer
	srv := newAdminWith(t, pg, 10*time.Second, &log)
	for _, req := range [][3]string{
		{"PUT", "/admin/v1/quotas/abc123", `{"tier":"pro"}`},
		{"GET", "/admin/v1/quotas/abc123", ""},
		{"DELETE", "/admin/v1/quotas/abc123", ""},
		{"GET", "/admin/v1/quotas?tier=pro", ""},
		{"GET", "/admin/v1/audit/abc123", ""},
	} {
		code, body := adminDo(t, srv, req[0], req[1], req[2])
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "quota store unavailable") {
			t.Errorf("%s %s with PostgreSQL refusing: %d %s; want 503 quota store unavailable", req[0], req[1], code, body)
		}
		for _, leak := range []string{"edgeadmin", "quotas_db", port(addr)} {
			if strings.Contains(body, leak) {
				t.Errorf("%s %s: the 503 names %q: %s", req[0], req[1], leak, body)
			}
		}
	}
	if l := log.String(); !strings.Contains(l, "quota store unavailable") || !strings.Contains(l, port(addr)) {
		t.Errorf("the log lacks the store's error:\n%s", l)
	}
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// An override with a unit the quota store cannot hold (week) is a 400 naming
// the field, before PostgreSQL is asked. Before, it passed validation and
// PostgreSQL's CHECK failed it as a 503 carrying the raw SQLSTATE.
func TestAdminOverrideUnitWeek(t *testing.T) {
	var log syncBuffer
	srv := newAdminWith(t, pgtest.Store(t), 0, &log)
	code, body := adminDo(t, srv, "PUT", "/admin/v1/quotas/abc123",
		`{"tier":"pro","overrides":[{"descriptor":"api_key.endpoint=POST /api/v1/orders","requests_per_unit":5,"unit":"week"}]}`)
	if code != http.StatusBadRequest || !strings.Contains(body, `"overrides[0].unit"`) || strings.Contains(body, "SQLSTATE") {
		t.Fatalf("override with unit week: %d %s; want 400 naming overrides[0].unit", code, body)
	}
}

// An override written as the quota API is specified ("descriptor":
// "endpoint:POST /api/v1/orders") is accepted as well as the limit's policy
// name, and both name the same limit: stored and answered under its policy
// name. Before, only the policy name was accepted (400).
func TestAdminOverrideSeedDescriptor(t *testing.T) {
	var log syncBuffer
	srv := newAdminWith(t, pgtest.Store(t), 0, &log)
	const name = `"descriptor":"api_key.endpoint=POST /api/v1/orders"`
	code, body := adminDo(t, srv, "PUT", "/admin/v1/quotas/abc123", seedOverride)
	if code != http.StatusCreated || !strings.Contains(body, name) {
		t.Fatalf("PUT with the specification's descriptor form: %d %s; want 201 with %s", code, body, name)
	}
	if code, body = adminDo(t, srv, "GET", "/admin/v1/quotas/abc123", ""); code != 200 || !strings.Contains(body, name) || !strings.Contains(body, `"requests_per_unit":500`) {
		t.Fatalf("GET: %d %s", code, body)
	}
	code, body = adminDo(t, srv, "PUT", "/admin/v1/quotas/abc123",
		`{"tier":"enterprise","overrides":[{"descriptor":"api_key.endpoint=POST /api/v1/orders","requests_per_unit":400,"unit":"minute"}]}`)
	if code != http.StatusOK || !strings.Contains(body, `"requests_per_unit":400`) {
		t.Fatalf("PUT with the policy name: %d %s; want 200", code, body)
	}
	code, body = adminDo(t, srv, "PUT", "/admin/v1/quotas/abc123",
		`{"tier":"enterprise","overrides":[{"descriptor":"api_key.endpoint=POST /api/v1/orders","requests_per_unit":1,"unit":"minute"},`+
			`{"descriptor":"endpoint:POST /api/v1/orders","requests_per_unit":2,"unit":"minute"}]}`)
	if code != http.StatusBadRequest || !strings.Contains(body, `"overrides[1].descriptor"`) {
		t.Fatalf("PUT naming one limit in both forms: %d %s; want 400 naming overrides[1].descriptor", code, body)
	}
	code, body = adminDo(t, srv, "PUT", "/admin/v1/quotas/abc123",
		`{"tier":"enterprise","overrides":[{"descriptor":"endpoint:GET /nowhere","requests_per_unit":1,"unit":"minute"}]}`)
	if code != http.StatusBadRequest || !strings.Contains(body, `"overrides[0].descriptor"`) {
		t.Fatalf("PUT naming no limit: %d %s; want 400 naming overrides[0].descriptor", code, body)
	}
}
