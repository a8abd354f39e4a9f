package main

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A global limit with consistency bounded, on two PoP processes of two
// regions over real NATS: a burst at both at once admits at most the limit
// (their allowances never sum past it), and a client pinned to one PoP
// gets, once its demand is heard, what the other gave it: the whole limit,
// never more.
func TestBoundedAcrossProcesses(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	os.WriteFile(rules, []byte(`domain: edge
descriptors:
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 40, scope: global, consistency: bounded}
  - key: p
    rate_limit: {unit: hour, requests_per_unit: 40, scope: global, consistency: bounded}
  - key: warm
    rate_limit: {unit: hour, requests_per_unit: 1000, scope: global}
`), 0o644)
	port := func() string { return strings.Split(freeAddr(t), ":")[1] }
	leaf := port()
	a, b := freeAddr(t), freeAddr(t)
	common := []string{"--rules", rules, "--topology", "eu=a;us=b", "--flush-interval", "50ms", "--snapshot-interval", "500ms", "--log-level", "warn"}
	startPoP(t, bin, append([]string{"--listen", a, "--data", filepath.Join(dir, "a"), "--region", "eu", "--pop", "a",
		"--nats-leaf-port", leaf}, common...)...)
	startPoP(t, bin, append([]string{"--listen", b, "--data", filepath.Join(dir, "b"), "--region", "us", "--pop", "b",
		"--nats-leaf-remote", "nats-leaf://127.0.0.1:" + leaf}, common...)...)
	warmUp(t, []string{a, b}, a, b)

	burst := burstAdmitted(t, []string{a, b}, "b", 120)
	t.Logf("a burst of 120 over both PoPs admitted %d of a bounded 40", burst)
	if burst > 40 {
		t.Fatalf("a burst of 120 over two PoPs admitted %d of a bounded 40", burst)
	}
	// A client pinned to a, on another key: a holds half of its limit at
	// first, and b's unused half moves to it once its demand is heard. It
	// keeps asking, 20 ms apart, until it has the whole limit (within a
	// patient bound: a loaded machine is slow, not wrong), then some more,
	// which must all be denied.
	pinned := 0
	deadline := time.Now().Add(2 * time.Minute)
	for pinned < 40 && time.Now().Before(deadline) {
		if checkKey(t, a, "p") == 200 {
			pinned++
		}
		time.Sleep(20 * time.Millisecond)
	}
	if pinned < 40 {
		t.Fatalf("a client pinned to a got %d of a bounded 40 in 2 minutes: b's share did not move to it", pinned)
	}
	pinned += admittedOf(t, a, "p", 20)
	t.Logf("a client pinned to a got %d of a bounded 40", pinned)
	if pinned > 40 {
		t.Fatalf("a client pinned to a got %d, over the bounded 40", pinned)
	}
}

// burstAdmitted sends n checks of key at once, spread over addrs in turn, and
// returns how many were admitted.
func burstAdmitted(t *testing.T, addrs []string, key string, n int) int64 {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if checkKey(t, addrs[i%len(addrs)], key) == 200 {
				admitted.Add(1)
			}
		}()
	}
	wg.Wait()
	return admitted.Load()
}
