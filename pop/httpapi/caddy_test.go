//go:build linux

package httpapi

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
)

// caddyExample is the example an operator copies; the test runs it unchanged.
const caddyExample = "../../deploy/examples/caddy"

// TestCaddyForwardAuth puts a real Caddy, configured by the example
// Caddyfile, between clients and a backend, with edgelimit (loaded with the
// example rules.yaml, reading the client's address as the Caddyfile says)
// as its forward_auth endpoint: one client gets nginxPerIP requests through
// and then a 429 with the rate limit headers and the JSON body; headers it
// forges — X-Real-IP, which Caddy passes through, X-Forwarded-For,
// X-Original-URI, X-Edgelimit-Domain — do not buy it a fresh quota; a client
// from another address has its own; the backend sees only what was allowed.
func TestCaddyForwardAuth(t *testing.T) {
	bin := caddyBinary(t)
	deadline := time.Now().Add(within)

	set, warns, err := rules.Load(filepath.Join(caddyExample, "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range warns {
		t.Errorf("rules.yaml: %s", w)
	}
	eng := pop.NewEngine(store.NewMemory(store.MemoryConfig{}), set, nil)
	header := exampleClientIPHeader(t, filepath.Join(caddyExample, "Caddyfile"))
	api := httptest.NewServer(New(Config{Engine: eng, ClientIPHeader: header}))
	t.Cleanup(api.Close)

	var hits atomic.Int64
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.WriteString(w, "hello")
	}))
	t.Cleanup(backend.Close)

	base := startCaddy(t, bin, api.Listener.Addr().String(), backend.Listener.Addr().String(), deadline)
	client := fromClient{ip: "127.0.0.1"}

	for i := range nginxPerIP {
		resp, body := client.get(t, base+"/hello", nil)
		if resp.StatusCode != http.StatusOK || body != "hello" {
			t.Fatalf("request %d: %d %q, want 200 \"hello\"", i+1, resp.StatusCode, body)
		}
	}
	resp, body := client.get(t, base+"/hello", nil)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("request %d: %d %q, want 429", nginxPerIP+1, resp.StatusCode, body)
	}
	h := resp.Header
	t.Logf("denied: %d Retry-After=%s RateLimit=%s body=%s", resp.StatusCode, h.Get("Retry-After"), h.Get("RateLimit"), strings.TrimSpace(body))
	if ra, err := strconv.Atoi(h.Get("Retry-After")); err != nil || ra <= 0 || ra > 120 {
		t.Errorf("429: Retry-After %q, want 1..120 seconds", h.Get("Retry-After"))
	}
	if h.Get("X-RateLimit-Limit") != strconv.Itoa(nginxPerIP) || h.Get("X-RateLimit-Remaining") != "0" || !strings.HasPrefix(h.Get("RateLimit"), `"per_ip";r=0`) {
		t.Errorf("429: rate limit headers missing or wrong: %v", h)
	}
	if !strings.Contains(body, `"code":"RATE_LIMITED"`) {
		t.Errorf("429 body: %q, want the JSON error", body)
	}

	// What the client forges does not buy a fresh quota.
	for _, forged := range []map[string]string{
		{"X-Real-IP": "10.8.8.1"},
		{"X-Forwarded-For": "10.8.8.1"},
		{"X-Real-IP": "10.8.8.1", "X-Forwarded-For": "10.8.8.1", "X-Original-URI": "/other", "X-Edgelimit-Domain": "other"},
	} {
		if resp, body := client.get(t, base+"/hello", forged); resp.StatusCode != http.StatusTooManyRequests {
			t.Errorf("forged %v: %d %q, want 429", forged, resp.StatusCode, body)
		}
	}
	// Another client, from another address, has its own quota.
	if resp, body := other.get(t, base+"/hello", nil); resp.StatusCode != http.StatusOK {
		t.Errorf("a client from %s: %d %q, want 200", otherClientIP, resp.StatusCode, body)
	}
	if n := hits.Load(); n != nginxPerIP+1 {
		t.Errorf("backend saw %d requests, want %d", n, nginxPerIP+1)
	}
}

// within bounds the waits for Caddy: long enough never to be why a test
// fails on a loaded machine.
const within = 2 * time.Minute

// caddyBinary finds caddy, or skips the test loudly; on CI (CI=true) a
// missing caddy fails it.
func caddyBinary(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("caddy")
	if err != nil {
		msg := "caddy is not installed: TestCaddyForwardAuth DID NOT RUN (apt-get install -y caddy)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip("SKIPPED: " + msg)
	}
	return bin
}

// startCaddy runs the example Caddyfile on a free 127.0.0.1 port until the
// test ends, its state under a temporary directory, and returns the base URL
// once Caddy accepts connections.
func startCaddy(t *testing.T, bin, edgelimit, backend string, deadline time.Time) string {
	t.Helper()
	conf := filepath.Join(caddyExample, "Caddyfile")
attempts:
	for attempt := 1; ; attempt++ {
		dir := t.TempDir()
		listen := freeAddr(t)
		cmd := exec.Command(bin, "run", "--config", conf, "--adapter", "caddyfile")
		cmd.Env = append(os.Environ(), "LISTEN=http://"+listen, "EDGELIMIT="+edgelimit, "BACKEND="+backend,
			"HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
		logPath := filepath.Join(dir, "caddy.log")
		logf, err := os.Create(logPath)
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		var waitErr error
		go func() { waitErr = cmd.Wait(); logf.Close(); close(exited) }()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			<-exited
			if t.Failed() {
				t.Logf("caddy log:\n%s", readLog(dir, "caddy.log"))
			}
		})
		for ready := false; !ready; {
			if c, err := net.DialTimeout("tcp", listen, 100*time.Millisecond); err == nil {
				c.Close()
				ready = true
				continue
			}
			select {
			case <-exited:
				log := readLog(dir, "caddy.log")
				if strings.Contains(log, "address already in use") && attempt < 3 {
					t.Logf("caddy could not bind %s, retrying", listen)
					continue attempts
				}
				t.Fatalf("caddy exited (%v) before answering:\n%s", waitErr, log)
			case <-time.After(20 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("caddy did not accept connections on %s in time:\n%s", listen, readLog(dir, "caddy.log"))
			}
		}
		return "http://" + listen
	}
}
