package main

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/deploy/lab/faultnet"
)

// A replicated PoP restarted after kill -9 while another PoP of its region
// admitted decides region limits on what that PoP admitted meanwhile: until
// it has applied its region's stream up to where the stream ended when it
// started, /readyz fails ("catching up") and a check of a region limit
// waits, then is decided on a's admissions: the two never admit more than the
// limit. Its link to NATS is slowed (300 ms a chunk) so that
// reading the stream takes a second or more. Before, the restarted PoP
// answered ready at once and admitted on its own counts (the soak: 57
// admitted against 51 on a limit of 50). With NATS unreachable, it serves
// after --catchup-timeout and says why in its log.
func TestPoPCatchUpAfterRestart(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	os.WriteFile(rules, []byte(durableRules), 0o644)
	natsPort := strings.Split(freeAddr(t), ":")[1]
	link, err := faultnet.NewProxy("127.0.0.1:" + natsPort)
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	a, b := freeAddr(t), freeAddr(t)
	common := []string{"--rules", rules, "--region", "eu", "--topology", "eu=a,b", "--flush-interval", "50ms", "--log-level", "info"}
	startPoP(t, bin, append([]string{"--listen", a, "--data", filepath.Join(dir, "a"), "--pop", "a", "--nats-allow-anonymous", "--nats-port", natsPort}, common...)...)
	argsB := append([]string{"--listen", b, "--data", filepath.Join(dir, "b"), "--pop", "b", "--nats", "nats://" + link.Addr()}, common...)
	popB := startPoP(t, bin, argsB...)

	for i := range 2 {
		if c := checkKey(t, b, "region"); c != 200 {
			t.Fatalf("b's check %d: %d, want 200", i+1, c)
		}
	}
	time.Sleep(300 * time.Millisecond) // saved and published
	popB.Process.Kill()
	popB.Wait()
	// The rest of the limit of 5, while b is down. a may stop short of it:
	// its estimate of b guesses what b admits while b is silent.
	byA := 0
	for range 3 {
		if checkKey(t, a, "region") == 200 {
			byA++
		}
		time.Sleep(100 * time.Millisecond)
	}
	if byA == 0 {
		t.Fatal("a admitted nothing while b was down: nothing for b to catch up on")
	}
	time.Sleep(300 * time.Millisecond) // in the stream

	link.Delay(300 * time.Millisecond)
	popB, logB := startServing(t, bin, filepath.Join(dir, "b.log"), append(argsB, "--catchup-timeout", "20s")...)
	if c, body := getBody(t, "http://"+b+"/readyz"); c != 503 || !strings.Contains(body, "catching up") {
		t.Errorf("b restarted, reading the stream over a slow link: /readyz %d %q, want 503 catching up", c, body)
	}
	began := time.Now()
	byB := 0
	for i := range 3 {
		if checkKey(t, b, "region") == 200 {
			byB++
		}
		if i == 0 {
			t.Logf("b's first check after the restart took %v (it waits for the catch-up)", time.Since(began).Round(time.Millisecond))
		}
	}
	if 2+byA+byB > 5 {
		t.Errorf("b restarted admitted %d more of the region limit of 5, after its own 2 and a's %d while it was down: %d in all",
			byB, byA, 2+byA+byB)
	}
	if c := checkKey(t, b, "sw"); c != 200 {
		t.Errorf("b restarted: a pop-scope check got %d, want 200", c)
	}
	waitFor(t, "b ready once caught up", 20*time.Second, func() bool { c, _ := getBody(t, "http://"+b+"/readyz"); return c == 200 })
	if out, _ := os.ReadFile(logB); !strings.Contains(string(out), "caught up on the stream") {
		t.Errorf("b's log does not say it caught up:\n%s", out)
	}

	// NATS unreachable: b serves after --catchup-timeout, and says why.
	popB.Process.Kill()
	popB.Wait()
	link.Cut()
	began = time.Now()
	_, logB = startServing(t, bin, filepath.Join(dir, "b2.log"), append(argsB, "--catchup-timeout", "1s")...)
	waitFor(t, "b ready after --catchup-timeout with NATS unreachable", 15*time.Second, func() bool {
		c, _ := getBody(t, "http://"+b+"/readyz")
		return c == 200
	})
	if took := time.Since(began); took < time.Second {
		t.Errorf("b was ready %v after its start with NATS unreachable, before --catchup-timeout 1s", took)
	}
	if out, _ := os.ReadFile(logB); !strings.Contains(string(out), "serving before catching up") {
		t.Errorf("b's log does not say why it serves before catching up:\n%s", out)
	}
}

// startServing runs `edgelimit pop` logging to logFile and returns once it
// answers /healthz, ready or not.
func startServing(t *testing.T, bin, logFile string, args ...string) (*exec.Cmd, string) {
	t.Helper()
	lf, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"pop"}, args...)...)
	cmd.Stdout, cmd.Stderr, cmd.Env = lf, lf, demoEnv()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		lf.Close()
		if t.Failed() {
			out, _ := os.ReadFile(logFile)
			t.Logf("log of pop %v:\n%s", args, out)
		}
	})
	waitFor(t, "serving", 30*time.Second, func() bool {
		resp, err := http.Get("http://" + args[1] + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return cmd, logFile
}
