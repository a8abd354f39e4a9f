//go:build linux

package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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

// nginxExample is the example an operator copies; the test runs it unchanged
// but for its placeholders, so the example cannot rot unnoticed.
const nginxExample = "../../deploy/examples/nginx"

// nginxPerIP is the per_ip limit of deploy/examples/nginx/rules.yaml.
const nginxPerIP = 5

// TestNginxForwardAuth puts a real nginx, configured by the example
// nginx.conf, between a client and a backend, with edgelimit (loaded with the
// example rules.yaml) as its auth_request endpoint, and checks what a client
// sees: nginxPerIP requests get through with the rate limit headers, the next
// one is a 429 with Retry-After, the headers and a JSON body, and it never
// reaches the backend.
func TestNginxForwardAuth(t *testing.T) {
	bin := nginxBinary(t)
	deadline := time.Now().Add(10 * time.Second)

	set, warns, err := rules.Load(filepath.Join(nginxExample, "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range warns {
		t.Errorf("rules.yaml: %s", w) // the example should load cleanly
	}
	eng := pop.NewEngine(store.NewMemory(store.MemoryConfig{}), set, nil)
	header := exampleClientIPHeader(t, filepath.Join(nginxExample, "nginx.conf"))
	api := httptest.NewServer(New(Config{Engine: eng, ClientIPHeader: header})) // 127.0.0.1, free port
	t.Cleanup(api.Close)

	var hits atomic.Int64
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.WriteString(w, "hello")
	}))
	t.Cleanup(backend.Close)

	base := startNginx(t, bin, api.Listener.Addr().String(), backend.Listener.Addr().String(), deadline)

	// A client of its own: no proxy from the environment, bounded per request.
	tr := &http.Transport{Proxy: nil}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: 2 * time.Second}
	get := func(path string, hdr map[string]string) (*http.Response, string) {
		t.Helper()
		if time.Now().After(deadline) {
			t.Fatal("out of time")
		}
		req, err := http.NewRequest("GET", base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, string(body)
	}

	// The sub-request location is internal: a client gets a 404, not edgelimit.
	if resp, _ := get("/_edgelimit", nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /_edgelimit from a client: %d, want 404", resp.StatusCode)
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("backend saw %d requests before the test began", n)
	}

	// The API key travels to edgelimit through the proxy_set_header allowlist;
	// its per_key policy then shows up in RateLimit-Policy.
	client1 := map[string]string{"X-API-Key": "key-1"}
	rateLimit := regexp.MustCompile(`^"per_ip";r=(\d+);t=(\d+)$`)
	for i := range nginxPerIP {
		resp, body := get("/hello?x=1", client1)
		if resp.StatusCode != http.StatusOK || body != "hello" {
			t.Fatalf("request %d: %d %q, want 200 \"hello\"", i+1, resp.StatusCode, body)
		}
		remaining := strconv.Itoa(nginxPerIP - 1 - i)
		h := resp.Header
		if h.Get("X-RateLimit-Limit") != strconv.Itoa(nginxPerIP) || h.Get("X-RateLimit-Remaining") != remaining {
			t.Errorf("request %d: X-RateLimit-Limit %q, -Remaining %q, want %d, %s",
				i+1, h.Get("X-RateLimit-Limit"), h.Get("X-RateLimit-Remaining"), nginxPerIP, remaining)
		}
		if m := rateLimit.FindStringSubmatch(h.Get("RateLimit")); m == nil || m[1] != remaining {
			t.Errorf("request %d: RateLimit %q, want \"per_ip\";r=%s;t=...", i+1, h.Get("RateLimit"), remaining)
		}
		pol := h.Get("RateLimit-Policy")
		if !strings.Contains(pol, `"per_ip";q=5;w=60`) || !strings.Contains(pol, `"per_key";q=100;w=60`) {
			t.Errorf("request %d: RateLimit-Policy %q, want per_ip and per_key", i+1, pol)
		}
		if reset, err := strconv.ParseInt(h.Get("X-RateLimit-Reset"), 10, 64); err != nil || reset < time.Now().Unix() {
			t.Errorf("request %d: X-RateLimit-Reset %q is not a Unix time ahead", i+1, h.Get("X-RateLimit-Reset"))
		}
		if ra := h.Get("Retry-After"); ra != "" {
			t.Errorf("request %d: Retry-After %q on an allowed request", i+1, ra)
		}
	}

	// One over the limit: nginx turns edgelimit's 403 into a 429.
	resp, body := get("/hello?x=1", client1)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("request %d: %d %q, want 429", nginxPerIP+1, resp.StatusCode, body)
	}
	h := resp.Header
	t.Logf("denied: %d Retry-After=%s RateLimit=%s RateLimit-Policy=%s body=%s", resp.StatusCode,
		h.Get("Retry-After"), h.Get("RateLimit"), h.Get("RateLimit-Policy"), strings.TrimSpace(body))
	ra, err := strconv.Atoi(h.Get("Retry-After"))
	// A sliding window may hold a client past the end of the current minute,
	// until enough of the previous one has slid out: at most two windows.
	if err != nil || ra <= 0 || ra > 120 {
		t.Fatalf("429: Retry-After %q, want 1..120 seconds", h.Get("Retry-After"))
	}
	if want := fmt.Sprintf(`"per_ip";r=0;t=%d`, ra); h.Get("RateLimit") != want {
		t.Errorf("429: RateLimit %q, want %q (t equal to Retry-After)", h.Get("RateLimit"), want)
	}
	if h.Get("X-RateLimit-Limit") != strconv.Itoa(nginxPerIP) || h.Get("X-RateLimit-Remaining") != "0" ||
		h.Get("X-RateLimit-Reset") == "" || h.Get("RateLimit-Policy") == "" {
		t.Errorf("429: rate limit headers missing or wrong: %v", h)
	}
	if ct := h.Get("Content-Type"); ct != "application/json" {
		t.Errorf("429: Content-Type %q, want application/json", ct)
	}
	var denial struct {
		Error struct {
			Code       string `json:"code"`
			Message    string `json:"message"`
			RetryAfter int    `json:"retry_after"`
			Limit      int    `json:"limit"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &denial); err != nil {
		t.Fatalf("429 body is not JSON (%v): %q", err, body)
	}
	if e := denial.Error; e.Code != "RATE_LIMITED" || e.RetryAfter != ra || e.Limit != nginxPerIP || !strings.Contains(e.Message, "Retry after") {
		t.Errorf("429 body: %+v, want RATE_LIMITED, retry_after %d, limit %d", e, ra, nginxPerIP)
	}

	// Forged client addresses do not buy a fresh quota: nginx.conf sends
	// edgelimit its own X-Real-IP and none of the client's headers.
	forged := map[string]string{"X-Real-IP": "203.0.113.9", "X-Forwarded-For": "203.0.113.9", "X-Original-URI": "/other"}
	if resp, body := get("/hello", forged); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("forged X-Real-IP: %d %q, want 429", resp.StatusCode, body)
	}

	// Another client, from another address, has its own quota: edgelimit
	// limits by the address nginx saw, not by nginx's own.
	if resp, body := other.get(t, base+"/hello", nil); resp.StatusCode != http.StatusOK {
		t.Errorf("a client from %s: %d %q, want 200", otherClientIP, resp.StatusCode, body)
	}

	if n := hits.Load(); n != nginxPerIP+1 {
		t.Errorf("backend saw %d requests, want %d", n, nginxPerIP+1)
	}
}

// otherClientIP is a second client's address: Linux routes all of
// 127.0.0.0/8 to the loopback interface.
const otherClientIP = "127.0.0.2"

// other is a client whose connections come from otherClientIP.
var other = fromClient{ip: otherClientIP}

type fromClient struct{ ip string }

// get sends a GET from the client's address, bounded in time.
func (c fromClient) get(t *testing.T, url string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(c.ip)}, Timeout: 2 * time.Second}
	tr := &http.Transport{Proxy: nil, DialContext: d.DialContext}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{Transport: tr, Timeout: 2 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// exampleClientIPHeader returns the --client-ip-header an example's file
// tells the operator to run edgelimit with, so that the test runs what the
// example says.
func exampleClientIPHeader(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`--client-ip-header[ =]([A-Za-z0-9-]+)`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s does not say which --client-ip-header to run edgelimit with", file)
	}
	return string(m[1])
}

// nginxBinary finds nginx, or skips the test — loudly, since the skip hides
// the only end-to-end check of the nginx example. On CI, where .ci/run
// installs it (Debian package "nginx"), a missing nginx is a failure.
func nginxBinary(t *testing.T) string {
	t.Helper()
	bin := "/usr/sbin/nginx"
	if _, err := os.Stat(bin); err != nil {
		if p, err := exec.LookPath("nginx"); err == nil {
			bin = p
		} else {
			msg := "nginx is not installed: TestNginxForwardAuth DID NOT RUN (apt-get install -y nginx)"
			if os.Getenv("CI") == "true" {
				t.Fatal(msg)
			}
			t.Skip("SKIPPED: " + msg)
		}
	}
	return bin
}

// placeholder matches a placeholder of nginx.conf left unreplaced.
var placeholder = regexp.MustCompile(`__[A-Z]+__`)

// startNginx renders the example nginx.conf into a temporary prefix and runs
// nginx in the foreground on a free 127.0.0.1 port until the test ends. It
// returns the base URL once nginx accepts connections.
func startNginx(t *testing.T, bin, edgelimit, backend string, deadline time.Time) string {
	t.Helper()
	tmpl, err := os.ReadFile(filepath.Join(nginxExample, "nginx.conf"))
	if err != nil {
		t.Fatal(err)
	}
	// The free port is found by binding and closing it, so another process
	// may take it before nginx binds it: try again with another port then.
attempts:
	for attempt := 1; ; attempt++ {
		prefix := t.TempDir()
		listen := freeAddr(t)
		conf := strings.NewReplacer(
			"__LISTEN__", listen,
			"__EDGELIMIT__", edgelimit,
			"__BACKEND__", backend,
			"__PREFIX__", prefix,
		).Replace(string(tmpl))
		if p := placeholder.FindString(conf); p != "" {
			t.Fatalf("nginx.conf has a placeholder the test does not fill: %s", p)
		}
		confPath := filepath.Join(prefix, "nginx.conf")
		if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		// -p and -e keep nginx away from its compiled-in paths (/etc/nginx,
		// /var/log/nginx) even before it has read the config.
		args := []string{"-p", prefix + "/", "-c", confPath, "-e", filepath.Join(prefix, "stderr.log")}

		// nginx -t first, so that a config error reads as one rather than as
		// nginx never answering.
		if out, err := exec.Command(bin, append(args, "-t")...).CombinedOutput(); err != nil {
			t.Fatalf("nginx -t rejects the example nginx.conf: %v\n%s%s", err, out, readLog(prefix, "stderr.log"))
		}

		// daemon off: nginx stays our child, so we can kill it. master_process
		// off: one process and no switch to the "user" account, which could
		// not read the temporary directory.
		cmd := exec.Command(bin, append(args, "-g", "daemon off; master_process off;")...)
		// Kill nginx with the test binary too, should it die before cleanup
		// (a panic, a -timeout), rather than leave it listening.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		var waitErr error
		go func() { waitErr = cmd.Wait(); close(exited) }()
		t.Cleanup(func() {
			_ = cmd.Process.Kill() // os.ErrProcessDone if it already exited
			<-exited
			if log := readLog(prefix, "error.log"); t.Failed() && log != "" {
				t.Logf("nginx error log:\n%s", log)
			}
		})

		for {
			if c, err := net.DialTimeout("tcp", listen, 100*time.Millisecond); err == nil {
				c.Close()
				return "http://" + listen
			}
			select {
			case <-exited:
				logs := readLog(prefix, "stderr.log") + readLog(prefix, "error.log")
				if strings.Contains(logs, "Address already in use") && attempt < 3 {
					t.Logf("nginx could not bind %s, retrying: %s", listen, logs)
					continue attempts
				}
				t.Fatalf("nginx exited (%v) before answering:\n%s", waitErr, logs)
			case <-time.After(20 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("nginx did not accept connections on %s in time:\n%s", listen, readLog(prefix, "error.log"))
			}
		}
	}
}

// freeAddr returns a 127.0.0.1 address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// readLog returns one of nginx's log files in prefix, or a note that it is
// missing.
func readLog(prefix, name string) string {
	b, err := os.ReadFile(filepath.Join(prefix, name))
	if errors.Is(err, os.ErrNotExist) {
		return ""
	}
	if err != nil {
		return fmt.Sprintf("(%s: %v)\n", name, err)
	}
	return string(b)
}
