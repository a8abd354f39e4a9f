package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Two PoPs in two regions, real processes, a global limit with consistency
// strong: a burst over both admits exactly the limit. Then the us region
// is lost (its PoP killed): at eu, a key whose home is eu's PoP is still
// decided exactly, and a key whose home was us's follows its policy — a
// fail_closed one denies everything, an open one admits its region's share
// (half the limit, of two regions) on local knowledge.
func TestStrongAcrossProcesses(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	var y strings.Builder
	y.WriteString("domain: edge\ndescriptors:\n")
	y.WriteString("  - key: s\n    rate_limit: {unit: hour, requests_per_unit: 40, scope: global, consistency: strong}\n")
	y.WriteString("  - key: warm\n    rate_limit: {unit: hour, requests_per_unit: 1000, scope: global}\n")
	const keys = 8 // per policy; the hash homes some at each PoP
	for i := range keys {
		fmt.Fprintf(&y, "  - key: c%d\n    rate_limit: {unit: hour, requests_per_unit: 10, scope: global, consistency: strong, fail_closed: true}\n", i)
		fmt.Fprintf(&y, "  - key: o%d\n    rate_limit: {unit: hour, requests_per_unit: 10, scope: global, consistency: strong}\n", i)
	}
	if err := os.WriteFile(rules, []byte(y.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	port := func() string { return strings.Split(freeAddr(t), ":")[1] }
	leaf := port()
	a, b := freeAddr(t), freeAddr(t)
	common := []string{"--rules", rules, "--topology", "eu=a;us=b", "--flush-interval", "50ms", "--log-level", "warn"}
	startPoP(t, bin, append([]string{"--listen", a, "--data", filepath.Join(dir, "a"), "--region", "eu", "--pop", "a",
		"--nats-leaf-port", leaf}, common...)...)
	pb := startPoP(t, bin, append([]string{"--listen", b, "--data", filepath.Join(dir, "b"), "--region", "us", "--pop", "b",
		"--nats-leaf-remote", "nats-leaf://127.0.0.1:" + leaf}, common...)...)
	warmUp(t, []string{a, b}, a, b)

	burst := burstAdmitted(t, []string{a, b}, "s", 120)
	t.Logf("a burst of 120 over both PoPs admitted %d of a strong 40", burst)
	if burst != 40 {
		t.Fatalf("a burst of 120 over two PoPs admitted %d of a strong 40, want exactly 40", burst)
	}

	// Lose region us.
	if err := pb.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_, _ = pb.Process.Wait()
	got := map[string]int{} // admitted of 15 checks at a, per key
	for i := range keys {
		for _, k := range []string{fmt.Sprintf("c%d", i), fmt.Sprintf("o%d", i)} {
			for range 15 {
				if checkKey(t, a, k) == 200 {
					got[k]++
				}
			}
		}
	}
	t.Logf("admitted at a with us lost, of 15 checks each: %v", got)
	var closedLost, openLost int
	for i := range keys {
		switch c := got[fmt.Sprintf("c%d", i)]; c {
		case 10: // homed at a: exact
		case 0:
			closedLost++
		default:
			t.Errorf("fail_closed key c%d admitted %d: want 10 (homed at a) or 0 (homed at the lost b)", i, c)
		}
		switch o := got[fmt.Sprintf("o%d", i)]; o {
		case 10:
		case 5:
			openLost++
		default:
			t.Errorf("open key o%d admitted %d: want 10 (homed at a) or 5, half of 10 (homed at the lost b)", i, o)
		}
	}
	if closedLost == 0 || openLost == 0 {
		t.Fatalf("no key of either policy was homed at b (%d, %d): the test shows nothing of the cut", closedLost, openLost)
	}
	// The PoP counted what it decided without a home: at least each key's
	// first check (a denial also issues a mitigation bit, which denies the
	// key's next checks without asking anyone until its end).
	deadline := time.Now().Add(time.Minute)
	for {
		m, _ := strconv.ParseFloat(metricValue(t, a, "edgelimit_strong_home_unreachable_total"), 64)
		if m >= float64(closedLost+openLost) {
			t.Logf("edgelimit_strong_home_unreachable_total %v", m)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("edgelimit_strong_home_unreachable_total is %v, want at least %d", m, closedLost+openLost)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
