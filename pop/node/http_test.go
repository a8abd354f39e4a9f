package node

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// rulesDir writes a one-limit rule file and returns its path.
func ruleFileIn(t *testing.T) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(file, []byte(rulesFile("1000000")), 0o644)
	return file
}

// heapAlloc returns the live heap after a collection.
func heapAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// slowClient connects to addr and sends a request announcing a body of
// length bytes and the first chunk of it, then nothing more. It returns the
// connection.
func slowClient(t *testing.T, addr, path string, length, chunk int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, length)
	c.Write([]byte(`{"checks":[` + strings.Repeat(" ", chunk-11)))
	return c
}

// 200 clients that announce large bodies and send them slowly must not make
// the PoP allocate what they announce: the heap stays far below 200 × the
// announced size.
func TestRunSlowBodiesDoNotPreallocate(t *testing.T) {
	base, _, _ := start(t, Config{Rules: []string{ruleFileIn(t)}, DataDir: t.TempDir(), ReadTimeout: time.Minute})
	addr := strings.TrimPrefix(base, "http://")
	before := heapAlloc()
	const clients, announced = 200, 8_000_000 // under the batch limit of 64 KiB × 1000 / 8
	for range clients {
		slowClient(t, addr, "/v1/check/batch", announced, 4096)
	}
	time.Sleep(500 * time.Millisecond) // let every handler start reading
	grown := int64(heapAlloc()) - int64(before)
	t.Logf("heap grew by %d MiB with %d slow clients announcing %d bytes each", grown>>20, clients, announced)
	if grown > 64<<20 {
		t.Fatalf("heap grew by %d MiB with %d slow clients; want < 64 MiB", grown>>20, clients)
	}
}

// A client that sends its body too slowly is cut off at the read timeout
// with a JSON error, and its connection closed.
func TestRunBodyReadTimeout(t *testing.T) {
	base, _, _ := start(t, Config{Rules: []string{ruleFileIn(t)}, DataDir: t.TempDir(), ReadTimeout: 300 * time.Millisecond})
	c := slowClient(t, strings.TrimPrefix(base, "http://"), "/v1/check", 1000, 20)
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	began := time.Now()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no response to a stalled body within 3s: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if took := time.Since(began); took > 2*time.Second {
		t.Errorf("cut off after %v; want about the 300ms read timeout", took)
	}
	if resp.StatusCode != http.StatusRequestTimeout || !json.Valid(body) {
		t.Errorf("got %d %q, want 408 with a JSON error", resp.StatusCode, body)
	}
}

// Once the shutdown timeout has passed, a PoP closes the connections still
// open (here a client stuck sending its body) and returns, rather than
// waiting for them.
func TestRunShutdownForceClosesConnections(t *testing.T) {
	base, cancel, done := start(t, Config{Rules: []string{ruleFileIn(t)}, DataDir: t.TempDir(),
		ReadTimeout: time.Minute, ShutdownTimeout: 300 * time.Millisecond})
	c := slowClient(t, strings.TrimPrefix(base, "http://"), "/v1/check", 1000, 20)
	time.Sleep(100 * time.Millisecond)
	began := time.Now()
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5s of the shutdown")
	}
	if took := time.Since(began); took > 800*time.Millisecond {
		t.Errorf("shutdown took %v with --shutdown-timeout 300ms", took)
	}
	c.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := io.ReadAll(c); err != nil {
		t.Errorf("the stalled connection was not closed by the server: %v", err)
	}
}

// batchBody is a /v1/check/batch body of n checks of about size bytes in
// all; its values carry a JSON escape, so it takes the slower decoder.
func batchBody(n, size int) []byte {
	per := size / n / 3
	v := strings.Repeat("a", per-40) + `\u0041`
	var b strings.Builder
	b.WriteString(`{"checks":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"domain":"d","descriptors":[{"entries":[{"key":"ip","value":"%s%d"},{"key":"a","value":"%s"},{"key":"b","value":"%s"}]}]}`, v, i, v, v)
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// 64 concurrent 2.8 MB batches: the memory held by bodies in flight is
// bounded, so the heap stays bounded; the requests over the bound get a 503
// with a JSON error and Retry-After, the others are answered.
func TestRunBatchMemoryBounded(t *testing.T) {
	base, _, _ := start(t, Config{Rules: []string{ruleFileIn(t)}, DataDir: t.TempDir(), MaxBodyMemory: 32 << 20})
	body := batchBody(1000, 2800<<10)
	before := heapAlloc()
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var ms runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
		}
	}()
	var wg sync.WaitGroup
	var ok, busy, other atomic.Int32
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 0, DisableKeepAlives: true}}
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Post(base+"/v1/check/batch", "application/json", bytes.NewReader(body))
			if err != nil {
				other.Add(1)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch {
			case resp.StatusCode == 200:
				ok.Add(1)
			case resp.StatusCode == 503 && json.Valid(b) && resp.Header.Get("Retry-After") != "":
				busy.Add(1)
			default:
				t.Errorf("status %d %.200s", resp.StatusCode, b)
				other.Add(1)
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-sampled
	grown := int64(peak.Load()) - int64(before)
	t.Logf("64 batches of %d KiB: %d answered, %d turned away, %d other; heap in use grew by %d MiB at the peak",
		len(body)>>10, ok.Load(), busy.Load(), other.Load(), grown>>20)
	if ok.Load() == 0 {
		t.Error("no batch was answered")
	}
	// Unbounded, the 64 bodies and their decoding took over 600 MiB here;
	// bounded to 32 MiB, the peak includes garbage the collector has yet to
	// reclaim.
	if grown > 160<<20 {
		t.Errorf("heap in use grew by %d MiB at the peak; want < 160 MiB (MaxBodyMemory 32 MiB)", grown>>20)
	}
}

// Every error we answer is JSON: unknown paths and methods, oversized bodies,
// and invalid UTF-8 in a key or value (400 naming the field).
func TestRunErrorsAreJSON(t *testing.T) {
	base, _, _ := start(t, Config{Rules: []string{ruleFileIn(t)}, DataDir: t.TempDir()})
	do := func(method, path, body string) (int, map[string]any) {
		req, _ := http.NewRequestWithContext(context.Background(), method, base+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var v map[string]any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Errorf("%s %s: %d body %.100q is not JSON", method, path, resp.StatusCode, b)
		}
		return resp.StatusCode, v
	}
	field := func(v map[string]any) string {
		e, _ := v["error"].(map[string]any)
		f, _ := e["field"].(string)
		return f
	}
	for _, c := range []struct {
		method, path, body string
		want               int
		field              string
	}{
		{"GET", "/nope", "", 404, ""},
		{"GET", "/v1/check", "", 405, ""},
		{"POST", "/healthz", "", 405, ""},
		{"DELETE", "/readyz", "", 405, ""},
		{"POST", "/metrics", "", 405, ""},
		{"POST", "/v1/check", strings.Repeat(" ", 70<<10), 400, ""},
		{"POST", "/v1/check", `{"domain":"d","descriptors":[{"entries":[{"key":"ip","value":"a` + "\xff" + `b"}]}]}`, 400, "descriptors[0].entries[0].value"},
		{"POST", "/v1/check", `{"domain":"d","descriptors":[{"entries":[{"key":"i` + "\xc3" + `","value":"x"}]}]}`, 400, "descriptors[0].entries[0].key"},
		{"POST", "/v1/check/batch", `{"checks":[{"domain":"d","descriptors":[{"entries":[{"key":"ip","value":"x"}]}]},{"domain":"d` + "\xfe" + `","descriptors":[{"entries":[{"key":"ip","value":"x"}]}]}]}`, 400, "checks[1].domain"},
	} {
		got, v := do(c.method, c.path, c.body)
		if got != c.want {
			t.Errorf("%s %s %.40q: %d %v, want %d", c.method, c.path, c.body, got, v, c.want)
		}
		if field(v) != c.field {
			t.Errorf("%s %s %.40q: field %q, want %q", c.method, c.path, c.body, field(v), c.field)
		}
	}
}

// --mitigations-endpoint=false hides /v1/mitigations (which lists key values).
func TestRunMitigationsEndpointOff(t *testing.T) {
	base, _, _ := start(t, Config{Rules: []string{ruleFileIn(t)}, DataDir: t.TempDir(), Replica: "a", HideMitigations: true})
	resp, err := http.Get(base + "/v1/mitigations")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Fatalf("/v1/mitigations: %d, want 404 when hidden", resp.StatusCode)
	}
	base2, _, _ := start(t, Config{Rules: []string{ruleFileIn(t)}, DataDir: t.TempDir(), Replica: "a"})
	resp, err = http.Get(base2 + "/v1/mitigations")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/v1/mitigations: %d, want 200 by default", resp.StatusCode)
	}
}
