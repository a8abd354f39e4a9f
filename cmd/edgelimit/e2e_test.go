package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/deploy/lab/faultnet"
	"github.com/edgelimit/edgelimit/pop/poptest"
	"github.com/edgelimit/edgelimit/pop/store/redistest"
)

// buildBinary builds edgelimit once per test binary run.
func buildBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	bin := filepath.Join(t.TempDir(), "edgelimit")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func freeAddr(t *testing.T) string {
	t.Helper()
	return poptest.FreeAddr(t)
}

// freeBase returns the first of n consecutive loopback ports free now, for
// `edgelimit demo --base-port`, which listens on the base and the ports after
// it. The run is taken below the kernel's ephemeral range (32768 and up on
// Linux), where the client side of every other test's connections keeps
// taking ports: a base from that range lost a later port of its run to one
// now and then ("bind: address already in use", TestDemo).
func freeBase(t *testing.T, n int) string {
	t.Helper()
	for range 200 {
		base := 20000 + rand.IntN(12000-n)
		free := true
		for p := base; p < base+n && free; p++ {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				free = false
				continue
			}
			ln.Close()
		}
		if free {
			return strconv.Itoa(base)
		}
	}
	t.Fatalf("no %d consecutive free ports in 20000–32000", n)
	return ""
}

// startPoP runs `edgelimit pop` and waits until it serves checks.
func startPoP(t *testing.T, bin string, args ...string) *exec.Cmd {
	t.Helper()
	cmd, _ := startPoPLog(t, bin, args...)
	return cmd
}

// startPoPLog is startPoP, and also returns the file the PoP logs to.
func startPoPLog(t *testing.T, bin string, args ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"pop"}, args...)...)
	logf, err := os.Create(filepath.Join(t.TempDir(), "pop.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = demoEnv()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("log of pop %v:\n%s", args, b)
		}
	})
	addr := args[1] // --listen is the first flag
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return cmd, logf.Name()
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pop %v not ready after 20s", args)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func popCheck(t *testing.T, addr string) int {
	t.Helper()
	return checkKey(t, addr, "api_key")
}

// Two PoPs of one region share a global limit over a real embedded NATS
// JetStream. One is killed with SIGKILL and restarted: it resumes from
// Pebble and the stream, so nothing it counted before its last flush is
// forgotten and the pair never admits more than the limit plus what the
// crash lost (the hits after the last flush: none here, since the test waits
// a flush interval before the kill).
func TestPoPCrashRestart(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	os.WriteFile(rules, []byte("domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 20, scope: global}\n"), 0o644)
	natsPort := strings.Split(freeAddr(t), ":")[1]
	a, b := freeAddr(t), freeAddr(t)
	common := []string{"--rules", rules, "--region", "eu", "--topology", "eu=a,b", "--flush-interval", "50ms", "--log-level", "warn"}
	argsA := append([]string{"--listen", a, "--data", filepath.Join(dir, "a"), "--pop", "a", "--nats-allow-anonymous", "--nats-port", natsPort}, common...)
	popA := startPoP(t, bin, argsA...)
	startPoP(t, bin, append([]string{"--listen", b, "--data", filepath.Join(dir, "b"), "--pop", "b", "--nats", "nats://127.0.0.1:" + natsPort}, common...)...)

	admitted := 0
	for range 12 {
		if popCheck(t, a) == 200 {
			admitted++
		}
	}
	time.Sleep(300 * time.Millisecond) // several flush intervals: a's counts are saved and published
	if err := popA.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	popA.Wait()
	// b keeps serving while a is down (its NATS server is a's embedded one:
	// b reconnects when a is back).
	for range 4 {
		if popCheck(t, b) == 200 {
			admitted++
		}
	}
	startPoP(t, bin, argsA...)
	time.Sleep(500 * time.Millisecond)
	// Three flush intervals between checks, so that each PoP knows the
	// other's hits: what remains is the crash, not the async overshoot.
	for range 10 {
		for _, p := range []string{a, b} {
			if popCheck(t, p) == 200 {
				admitted++
			}
			time.Sleep(150 * time.Millisecond)
		}
	}
	time.Sleep(300 * time.Millisecond)
	for range 5 {
		if popCheck(t, a) == 200 || popCheck(t, b) == 200 {
			admitted++
		}
	}
	// Exactly the limit: the restarted PoP forgot none of its 12, and after
	// the restart both PoPs share one count again. (A few over the limit would
	// be the async overshoot of hits racing one flush interval; sequential
	// checks with pauses leave none.)
	if admitted != 20 {
		t.Fatalf("admitted %d across a kill -9 and restart, want the limit of 20", admitted)
	}
}

// The demo prints one line per PoP, serves checks on each, and stops every
// process on SIGINT.
func TestDemo(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	os.WriteFile(rules, []byte("domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 6, scope: global}\n"+
		"  - key: warm\n    rate_limit: {unit: hour, requests_per_unit: 100000, scope: global}\n"), 0o644)
	port := freeBase(t, 4)
	cmd := exec.Command(bin, "demo", "--rules", rules, "--regions", "eu,us", "--pops", "2", "--base-port", port, "--data", filepath.Join(dir, "demo"))
	cmd.Env = demoEnv()
	stdout, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(stdout)
	var urls []string
	for len(urls) < 4 && sc.Scan() {
		var region, pop, url string
		if _, err := fmt.Sscan(sc.Text(), &region, &pop, &url); err != nil {
			t.Fatalf("demo line %q: %v", sc.Text(), err)
		}
		urls = append(urls, strings.TrimPrefix(url, "http://"))
	}
	if len(urls) != 4 {
		t.Fatalf("demo printed %d PoPs, want 4; stderr:\n%s", len(urls), stderr.String())
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, u := range urls {
		for {
			resp, err := http.Get("http://" + u + "/readyz")
			if err == nil {
				resp.Body.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not serving; stderr:\n%s", u, stderr.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// On a busy machine the regions link a while after the PoPs answer
	// /readyz, and until then each enforces its partition share of a global
	// limit. Wait until every PoP counts hits it did not take, on a key of
	// their own.
	waitCountsOthers(t, urls, 2*time.Minute)
	// Three hits in each region spend the global limit of 6: no more than 6
	// are admitted, and then every PoP of both regions denies it. Whether
	// each of the six is admitted is the estimate's accuracy, which the
	// simulator and the lab measure: an eventual limit may deny while it
	// still guesses at what another PoP admits.
	admitted := 0
	for _, u := range []string{urls[0], urls[0], urls[0], urls[2], urls[2], urls[2]} {
		if popCheck(t, u) == 200 {
			admitted++
		}
	}
	if admitted < 3 || admitted > 6 {
		t.Fatalf("%d of 6 hits admitted on a global limit of 6, want 3 (the first region's) to 6", admitted)
	}
	deadline = time.Now().Add(time.Minute)
	converged := false
	for time.Now().Before(deadline) && !converged {
		time.Sleep(200 * time.Millisecond)
		converged = true
		for _, u := range urls {
			converged = converged && popCheck(t, u) == 429
		}
	}
	if !converged {
		t.Fatalf("the PoPs of two regions did not converge on the global limit; stderr:\n%s", stderr.String())
	}
	cmd.Process.Signal(os.Interrupt)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("demo did not stop within 20s of SIGINT")
	}
	for _, u := range urls {
		if c, err := net.DialTimeout("tcp", u, 200*time.Millisecond); err == nil {
			c.Close()
			t.Fatalf("%s still serving after the demo stopped", u)
		}
	}
}

// Two PoPs in two regions, each on its own Redis, share a global limit: the
// Redis store replicates through its max-merge script, over real NATS
// servers linked as leaf nodes.
func TestPoPsOnRedisReplicate(t *testing.T) {
	bin := buildBinary(t)
	ra, rb := redistest.Start(t), redistest.Start(t)
	a, b := startRedisPoPs(t, bin, ra, rb, 10)
	admitted := 0
	for range 6 {
		if popCheck(t, a) == 200 {
			admitted++
		}
	}
	waitApplied(t, b)
	time.Sleep(200 * time.Millisecond) // a's last flush
	for range 10 {
		if popCheck(t, b) == 200 {
			admitted++
		}
		time.Sleep(150 * time.Millisecond)
	}
	if admitted != 10 {
		t.Fatalf("admitted %d across two regions on two Redis servers, want the global limit of 10", admitted)
	}
}

// While a PoP's Redis is shut down (SHUTDOWN NOSAVE), the PoP decides a
// global limit on the counts it heard from the other PoP, and the other PoP
// hears of what it admits; when Redis returns, empty, the hits are in it
// once: across the outage the two PoPs admit the limit, no more.
func TestPoPsOnRedisShutdown(t *testing.T) {
	bin := buildBinary(t)
	ra, rb := redistest.Start(t), redistest.Start(t)
	a, b := startRedisPoPs(t, bin, ra, rb, 10)
	count := func(addr string, n int, gap time.Duration) int {
		admitted := 0
		for range n {
			if popCheck(t, addr) == 200 {
				admitted++
			}
			time.Sleep(gap)
		}
		return admitted
	}
	if got := count(a, 4, 0); got != 4 {
		t.Fatalf("a admitted %d of its first 4", got)
	}
	waitApplied(t, b)
	time.Sleep(200 * time.Millisecond) // a's last flush
	if got := count(b, 3, 150*time.Millisecond); got != 3 {
		t.Fatalf("b admitted %d of 3 after a's 4", got)
	}
	waitApplied(t, a)
	time.Sleep(200 * time.Millisecond) // b's last flush

	_, _ = ra.Do("SHUTDOWN", "NOSAVE") // the connection closes instead of a reply
	ra.Kill()                          // reaps the exited server
	down := count(a, 10, 50*time.Millisecond)
	time.Sleep(300 * time.Millisecond) // a's flushes while Redis is away
	downB := count(b, 5, 50*time.Millisecond)
	ra.Restart()                        // empty
	time.Sleep(1500 * time.Millisecond) // a's breaker cooldown, and a flush
	after := count(a, 5, 50*time.Millisecond) + count(b, 5, 50*time.Millisecond)
	t.Logf("admitted: 7 before, %d by a while its Redis was down, %d by b then, %d after it returned", down, downB, after)
	// The guess of unheard hits may deny a hit early, never admit one more.
	if total := 7 + down + downB + after; down < 1 || total > 10 {
		t.Fatalf("a admitted %d while its Redis was down (want 1 to 3), b %d then, both %d after it returned: %d in all, over the limit of 10",
			down, downB, after, total)
	}
}

// startRedisPoPs starts two PoPs of two regions, a on ra and b on rb, linked
// by their embedded NATS servers as leaf nodes, with one global limit of n
// an hour on api_key; it returns their addresses.
func startRedisPoPs(t *testing.T, bin string, ra, rb *redistest.Server, n int) (a, b string) {
	t.Helper()
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	os.WriteFile(rules, fmt.Appendf(nil, "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: %d, scope: global}\n", n), 0o644)
	port := func() string { return strings.Split(freeAddr(t), ":")[1] }
	leaf := port()
	a, b = freeAddr(t), freeAddr(t)
	common := []string{"--rules", rules, "--topology", "eu=a;us=b", "--flush-interval", "50ms", "--redis-timeout", "100ms", "--log-level", "warn"}
	startPoP(t, bin, append([]string{"--listen", a, "--data", filepath.Join(dir, "a"), "--region", "eu", "--pop", "a",
		"--store", ra.URL(), "--nats-leaf-port", leaf}, common...)...)
	startPoP(t, bin, append([]string{"--listen", b, "--data", filepath.Join(dir, "b"), "--region", "us", "--pop", "b",
		"--store", rb.URL(), "--nats-leaf-remote", "nats-leaf://127.0.0.1:" + leaf}, common...)...)
	return a, b
}

// waitApplied waits until the PoP at addr has applied another PoP's counts:
// the leaf link is up and a batch or snapshot crossed it.
func waitApplied(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !appliedSome(t, addr) {
		if time.Now().After(deadline) {
			t.Fatalf("%s applied nothing from the other PoP within 20s", addr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// appliedSome reports whether the PoP at addr has applied another PoP's
// batch or snapshot, from its replication metrics.
// waitCountsOthers checks the key "warm" (a global limit of 100,000) at each
// of urls in turn until each one's remaining shows hits it did not take
// itself: every PoP then hears from the others.
func waitCountsOthers(t *testing.T, urls []string, patience time.Duration) {
	t.Helper()
	const limit = 100000
	own := make([]int, len(urls))
	sent := 0
	heard := make([]bool, len(urls))
	deadline := time.Now().Add(patience)
	for slices.Contains(heard, false) {
		if time.Now().After(deadline) {
			t.Fatalf("PoPs %v: some never counted another PoP's hits within %v (heard %v)", urls, patience, heard)
		}
		for i, u := range urls {
			resp, err := http.Post("http://"+u+"/v1/check", "application/json",
				strings.NewReader(`{"domain":"edge","descriptors":[{"entries":[{"key":"warm","value":"w"}]}]}`))
			if err != nil {
				continue
			}
			var body struct {
				Statuses []struct {
					Remaining int `json:"limit_remaining"`
				} `json:"statuses"`
			}
			err = json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			if err != nil || len(body.Statuses) != 1 {
				continue
			}
			own[i]++
			sent++
			// Another's hits, and no more than were sent (with room for an
			// estimate of some): a PoP at a partition share of the limit
			// would show far less remaining.
			if r := body.Statuses[0].Remaining; r < limit-own[i] && r > limit-2*sent-10 {
				heard[i] = true
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func appliedSome(t *testing.T, addr string) bool {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		for _, m := range []string{"edgelimit_replication_applied_batches_total ", "edgelimit_replication_applied_snapshots_total "} {
			if v, ok := strings.CutPrefix(line, m); ok && v != "0" {
				return true
			}
		}
	}
	return false
}

// A PoP process given a wrong Redis password (in a file, as operators should)
// logs the refusal, reports not ready with the reason, and prints neither the
// password it was given nor one in --store's URL. With the right password it
// becomes ready.
func TestPoPRedisPassword(t *testing.T) {
	bin := buildBinary(t)
	const right, wrong, inURL = "e2e-right-pw", "e2e-wrong-pw", "e2e-url-pw"
	srv := redistest.StartWithPassword(t, right)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	os.WriteFile(rules, []byte("domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 20, fail_closed: true}\n"), 0o644)
	pwFile := filepath.Join(dir, "redis-password")
	os.WriteFile(pwFile, []byte(wrong+"\n"), 0o600)
	addr := freeAddr(t)
	cmd := exec.Command(bin, "pop", "--listen", addr, "--rules", rules, "--data", filepath.Join(dir, "data"),
		"--store", "redis://:"+inURL+"@"+srv.Addr, "--redis-password-file", pwFile)
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.Env = demoEnv()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }() // Wait: logs is complete once it returns
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })

	var code int
	var body string
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			code, body = resp.StatusCode, string(b)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pop not serving after 20s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code != 503 || !strings.Contains(body, "WRONGPASS") || !strings.HasPrefix(body, "{") {
		t.Errorf("/readyz %d %s, want 503 with a JSON reason naming WRONGPASS", code, body)
	}
	if c := popCheck(t, addr); c != 429 {
		t.Errorf("check with fail_closed and no Redis: %d, want 429", c)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		t.Fatal("pop did not exit on SIGTERM")
	}
	out := logs.String()
	if !strings.Contains(out, "refuses authentication") {
		t.Errorf("the log does not report the refused authentication:\n%s", out)
	}
	for _, secret := range []string{right, wrong, inURL} {
		if strings.Contains(out, secret) {
			t.Errorf("the log holds the password %q:\n%s", secret, out)
		}
	}

	// The right password in the file: ready.
	os.WriteFile(pwFile, []byte(right+"\n"), 0o600)
	startPoP(t, bin, "--listen", freeAddr(t), "--rules", rules, "--data", filepath.Join(dir, "data2"),
		"--store", "redis://"+srv.Addr, "--redis-password-file", pwFile)
}

// The hardening flags reach a real PoP process: --mitigations-endpoint=false
// hides /v1/mitigations (a JSON 404), --read-timeout cuts off a client that
// stalls mid-body (408), and an empty rules directory stops the PoP at start
// with a message naming --allow-empty-rules.
func TestPoPHardeningFlags(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	os.WriteFile(rules, []byte("domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 20}\n"), 0o644)
	addr := freeAddr(t)
	startPoP(t, bin, "--listen", addr, "--rules", rules, "--data", filepath.Join(dir, "data"), "--pop", "a", "--region", "eu",
		"--mitigations-endpoint=false", "--read-timeout", "300ms")

	resp, err := http.Get("http://" + addr + "/v1/mitigations")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 || !strings.HasPrefix(string(b), `{"error"`) {
		t.Errorf("/v1/mitigations with --mitigations-endpoint=false: %d %s, want a JSON 404", resp.StatusCode, b)
	}

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"domain\":")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	r, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusRequestTimeout {
		t.Errorf("stalled body: %d, want 408", r.StatusCode)
	}

	empty := t.TempDir()
	out, err := exec.Command(bin, "pop", "--listen", freeAddr(t), "--rules", empty, "--data", filepath.Join(dir, "d2")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--allow-empty-rules") {
		t.Errorf("start on an empty rules directory: %v\n%s\nwant a failure naming --allow-empty-rules", err, out)
	}
}

// Three PoPs share a global limit across two regions whose link is held up
// behind a lost segment (every chunk on it arrives 3 s late). b, in region
// us, has a connection of its own to region eu's NATS server
// (--nats-direct); c, in us too, has not. After a, in eu, admits the whole
// limit, c, which hears them only over the stalled link, still admits, and b
// denies: it heard a's counts on the direct path.
func TestPoPsDirectPath(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	rules := warmRules(t, dir, "hour", 10)
	port := func() string { return strings.Split(freeAddr(t), ":")[1] }
	leaf, natsA, natsB := port(), port(), port()
	link, err := faultnet.NewProxy("127.0.0.1:" + leaf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { link.Close() })
	a, b, c := freeAddr(t), freeAddr(t), freeAddr(t)
	common := []string{"--rules", rules, "--topology", "eu=a;us=b,c", "--flush-interval", "50ms", "--log-level", "warn"}
	startPoP(t, bin, append([]string{"--listen", a, "--data", filepath.Join(dir, "a"), "--region", "eu", "--pop", "a",
		"--nats-allow-anonymous", "--nats-port", natsA, "--nats-leaf-port", leaf}, common...)...)
	startPoP(t, bin, append([]string{"--listen", b, "--data", filepath.Join(dir, "b"), "--region", "us", "--pop", "b",
		"--nats-allow-anonymous", "--nats-port", natsB, "--nats-leaf-remote", "nats-leaf://" + link.Addr(),
		"--nats-direct", "eu=nats://127.0.0.1:" + natsA}, common...)...)
	// c uses b's server, as the PoPs of a region share theirs.
	startPoP(t, bin, append([]string{"--listen", c, "--data", filepath.Join(dir, "c"), "--region", "us", "--pop", "c",
		"--nats", "nats://127.0.0.1:" + natsB}, common...)...)
	// Wait until the link is up: a's counts of another key reach both.
	warmUp(t, []string{a}, b, c)
	if err := link.SetLink(faultnet.Link{Loss: 1, Retransmit: 3 * time.Second}); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if code := popCheck(t, a); code != 200 {
			t.Fatalf("a's check %d of a global limit of 10: %d", i+1, code)
		}
	}
	time.Sleep(500 * time.Millisecond) // a's flush, and the direct path's few ms
	// c first: b's denial issues a mitigation bit, which reaches c within
	// the region at once.
	if code := popCheck(t, c); code != 200 {
		t.Errorf("c (stream only) answered %d within the stall, want 200: the link was not held up", code)
	}
	if code := popCheck(t, b); code != 429 {
		t.Errorf("b (direct path to eu) answered %d after a admitted the whole limit, want 429", code)
	}
}

// Two PoPs in two regions share a global limit of 20 a second, each sent
// about twice it for 3 s: each finds the key at its limit in the windows of
// those seconds, and once every window has settled (the other PoP's count
// of it arrived) reports how far over the limit both together admitted in
// it, edgelimit_settled_excess_percent.
func TestPoPsSettledExcess(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	rules := warmRules(t, dir, "second", 20)
	port := func() string { return strings.Split(freeAddr(t), ":")[1] }
	leaf := port()
	a, b := freeAddr(t), freeAddr(t)
	common := []string{"--rules", rules, "--topology", "eu=a;us=b", "--flush-interval", "50ms", "--log-level", "warn"}
	startPoP(t, bin, append([]string{"--listen", a, "--data", filepath.Join(dir, "a"), "--region", "eu", "--pop", "a",
		"--nats-leaf-port", leaf}, common...)...)
	startPoP(t, bin, append([]string{"--listen", b, "--data", filepath.Join(dir, "b"), "--region", "us", "--pop", "b",
		"--nats-leaf-remote", "nats-leaf://127.0.0.1:" + leaf}, common...)...)
	warmUp(t, []string{a, b}, a, b)
	admitted := 0
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		for _, p := range []string{a, b} {
			if popCheck(t, p) == 200 {
				admitted++
			}
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Logf("admitted %d in 3 s against 20 a second", admitted)
	// The last windows settle 300 ms on; a PoP reports them as news is
	// applied, and the other's flushes keep coming.
	name := `edgelimit_settled_excess_percent_count{scope="global"}`
	var n [2]float64
	for deadline := time.Now().Add(10 * time.Second); ; {
		checkKey(t, a, "warm")
		checkKey(t, b, "warm")
		for i, p := range []string{a, b} {
			n[i], _ = strconv.ParseFloat(metricValue(t, p, name), 64)
		}
		if n[0] >= 1 && n[1] >= 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n[0] < 1 || n[1] < 1 {
		t.Fatalf("windows settled at the limit: a reported %v, b %v; want each at least one", n[0], n[1])
	}
	for _, p := range []string{a, b} {
		sum, _ := strconv.ParseFloat(metricValue(t, p, `edgelimit_settled_excess_percent_sum{scope="global"}`), 64)
		count, _ := strconv.ParseFloat(metricValue(t, p, name), 64)
		// Both PoPs at the limit all along: each window settled near it,
		// not at half of it, as one counted without the other PoP's hits
		// would.
		mean := sum / count
		t.Logf("%s: %v windows settled at the limit, %.1f%% over it on average", p, count, mean)
		if mean < -25 || mean > 50 {
			t.Errorf("%s: windows settled %.1f%% over the limit on average, want within −25%%…+50%%", p, mean)
		}
	}
}

// warmRules writes, in dir, rules of a global limit of n per unit on
// api_key (popCheck) and of a key "warm" (1000 an hour) whose checks get
// the PoPs' links going, and returns the file's path.
func warmRules(t *testing.T, dir, unit string, n int) string {
	t.Helper()
	rules := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rules, fmt.Appendf(nil, "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: %s, requests_per_unit: %d, scope: global}\n"+
		"  - key: warm\n    rate_limit: {unit: hour, requests_per_unit: 1000, scope: global}\n", unit, n), 0o644); err != nil {
		t.Fatal(err)
	}
	return rules
}

// warmUp checks the key "warm" (warmRules) at the PoPs at from until each
// PoP of to has applied another PoP's counts, for at most 20 s.
func warmUp(t *testing.T, from []string, to ...string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for slices.ContainsFunc(to, func(p string) bool { return !appliedSome(t, p) }) {
		if time.Now().After(deadline) {
			t.Fatalf("%v applied nothing from the other PoPs within 20s", to)
		}
		for _, p := range from {
			checkKey(t, p, "warm")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
