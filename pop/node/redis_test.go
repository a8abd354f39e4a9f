package node

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/store/redistest"
)

// logBuffer is an io.Writer safe for the concurrent writes of a logger.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// readyz returns /readyz's status and decoded body.
func readyz(t *testing.T, base string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var v map[string]any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("/readyz body %q is not JSON: %v", body, err)
	}
	return resp.StatusCode, v
}

// waitReady polls /readyz until it answers want, or fails after 5s.
func waitReady(t *testing.T, base string, want int) map[string]any {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, body := readyz(t, base)
		if code == want {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz %d %v after 5s, want %d", code, body, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A PoP whose Redis refuses its password says so in its log at once, keeps
// saying so (rate-limited) while it lasts, is not ready (503 with the reason)
// and never prints the password. When the password becomes right it turns
// ready and says it recovered.
func TestRunRedisWrongPassword(t *testing.T) {
	const right, wrong = "right-pw-7f3a", "wrong-pw-19c2"
	srv := redistest.StartWithPassword(t, right)
	file := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(file, []byte("domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 2, fail_closed: true}\n"), 0o644)
	var logs logBuffer
	base, _, _ := start(t, Config{
		Rules: []string{file}, Store: "redis://:" + wrong + "@" + srv.Addr, RedisTimeout: 100 * time.Millisecond,
		StoreHealthInterval: 20 * time.Millisecond,
		Logger:              slog.New(slog.NewTextHandler(&logs, nil)),
	})
	code, body := readyz(t, base)
	if code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz %d %v with a wrong Redis password, want 503", code, body)
	}
	if msg, _ := json.Marshal(body); !strings.Contains(strings.ToLower(string(msg)), "auth") {
		t.Errorf("/readyz body %s does not give the authentication failure as the reason", msg)
	}
	if !strings.Contains(logs.String(), "WRONGPASS") {
		t.Errorf("the authentication failure is not logged at start:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "redis://:xxxxx@"+srv.Addr) {
		t.Errorf("the store URL is not logged redacted:\n%s", logs.String())
	}
	time.Sleep(time.Second) // 50 failed probes
	if n := strings.Count(logs.String(), "WRONGPASS"); n > 2 {
		t.Errorf("the failure was logged %d times in a second; want it rate-limited:\n%s", n, logs.String())
	}

	if err := srv.SetPassword(wrong); err != nil {
		t.Fatal(err)
	}
	waitReady(t, base, http.StatusOK)
	if !strings.Contains(logs.String(), "recovered") {
		t.Errorf("recovery is not logged:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), wrong) || strings.Contains(logs.String(), right) {
		t.Fatalf("a password appears in the log:\n%s", logs.String())
	}
}

// A PoP whose Redis cannot be reached is not ready and logs why.
func TestRunRedisUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	file := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(file, []byte(rulesFile("2")), 0o644)
	var logs logBuffer
	base, _, _ := start(t, Config{Rules: []string{file}, Store: "redis://:pw-secret-1@" + addr,
		StoreHealthInterval: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	body := waitReady(t, base, http.StatusServiceUnavailable)
	if msg, _ := json.Marshal(body); !strings.Contains(string(msg), "refused") {
		t.Errorf("/readyz body %s does not say the connection was refused", msg)
	}
	if !strings.Contains(logs.String(), "refused") {
		t.Errorf("the connection failure is not logged:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "pw-secret-1") {
		t.Fatalf("the password appears in the log:\n%s", logs.String())
	}
	// Checks are still answered (by the fallback): not ready is not down.
	if got, _ := check(t, base); got != 200 {
		t.Fatalf("check while Redis is unreachable: %d, want 200 from the embedded fallback", got)
	}
}

// A password given apart from the URL (RedisPassword, from
// --redis-password-file) authenticates: Redis decides the checks.
func TestRunRedisPasswordApart(t *testing.T) {
	srv := redistest.StartWithPassword(t, "apart-pw")
	file := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(file, []byte(rulesFile("2")), 0o644)
	base, _, _ := start(t, Config{Rules: []string{file}, Store: "redis://" + srv.Addr, RedisPassword: "apart-pw",
		RedisTimeout: 100 * time.Millisecond})
	waitReady(t, base, http.StatusOK)
	for _, want := range []int{200, 200, 429} {
		if got, _ := check(t, base); got != want {
			t.Fatalf("status %d, want %d", got, want)
		}
	}
	if m := metricsText(t, base); !strings.Contains(m, "edgelimit_store_fallback_decisions_total 0") {
		t.Fatalf("Redis did not decide the checks:\n%s", grep(m, "edgelimit_store"))
	}
}
