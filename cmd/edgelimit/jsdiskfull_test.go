package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A replicated PoP whose embedded NATS server's JetStream store fills up (a
// real tmpfs mounted at --data/nats, filled by another writer) keeps deciding
// from its own store, fails /readyz naming the JetStream store,
// sets edgelimit_jetstream_disk_full, neither spins nor floods its log, and
// once space returns gets its stream writing again, so that what it admitted
// meanwhile reaches the other PoP of its region (which reads the same
// stream): that PoP then admits no more than what is left of the limit. Before,
// nats-server marked the stream's file store with a "critical write error"
// on the first ENOSPC and refused every later write until the process
// restarted; nothing in edgelimit noticed, /readyz stayed 200, and the other
// PoP never heard of the admissions (it admitted the whole limit again).
func TestPoPJetStreamDiskFull(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	dataA := filepath.Join(dir, "a")
	if err := os.MkdirAll(filepath.Join(dataA, "nats"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Only the JetStream store is on the small disk: Pebble's --data/state
	// stays on the roomy one, so what this test sees is JetStream's.
	mnt := filepath.Join(dataA, "nats")
	mountTmpfsAt(t, mnt, 16)
	rules := filepath.Join(dir, "rules.yaml")
	os.WriteFile(rules, []byte(durableRules), 0o644)
	natsPort := strings.Split(freeAddr(t), ":")[1]
	a, b := freeAddr(t), freeAddr(t)
	common := []string{"--rules", rules, "--region", "eu", "--topology", "eu=a,b", "--flush-interval", "50ms",
		"--data-min-free-mib", "4", "--log-level", "info"}
	popA, logFile := startPoPLog(t, bin, append([]string{"--listen", a, "--data", dataA, "--pop", "a", "--nats-allow-anonymous", "--nats-port", natsPort}, common...)...)
	startPoP(t, bin, append([]string{"--listen", b, "--data", filepath.Join(dir, "b"), "--pop", "b",
		"--nats", "nats://127.0.0.1:" + natsPort}, common...)...)
	waitFor(t, "a ready", 10*time.Second, func() bool { c, _ := getBody(t, "http://"+a+"/readyz"); return c == 200 })

	fillDisk(t, filepath.Join(mnt, "filler"))
	// a decides on: three admissions of the region limit of 5, spread over
	// several flush intervals so that each is published (and fails).
	for i := range 3 {
		if c := checkKey(t, a, "region"); c != 200 {
			t.Fatalf("check %d at a with its JetStream disk full: %d, want 200", i+1, c)
		}
		time.Sleep(200 * time.Millisecond)
	}
	waitUnready(t, a, "a unready on the full JetStream disk", "JetStream", 10*time.Second)
	if v := metricValue(t, a, "edgelimit_jetstream_disk_full"); v != "1" {
		t.Errorf("edgelimit_jetstream_disk_full = %q on a full disk, want 1", v)
	}
	cpu0 := cpuSeconds(t, popA.Process.Pid)
	for range 6 { // admissions of other keys: more publishes that fail
		checkKey(t, a, "global")
		time.Sleep(500 * time.Millisecond)
	}
	if used := cpuSeconds(t, popA.Process.Pid) - cpu0; used > 0.6 {
		t.Errorf("a used %.2fs of CPU in 3s with its JetStream disk full: spinning", used)
	}
	for range 4 { // and more: the full disk lasts
		checkKey(t, a, "global")
		time.Sleep(500 * time.Millisecond)
	}
	logged, _ := os.ReadFile(logFile)
	if n := strings.Count(string(logged), "no space left"); n > 3 {
		t.Errorf("%d log lines about the full disk while the JetStream disk was full: a flood, want one per change of state", n)
	}
	// Publishes fail all along; the replicator's warning about them may
	// come before the guard's first look, not every second.
	if n := strings.Count(string(logged), "message not acknowledged"); n > 2 {
		t.Errorf("%d \"message not acknowledged\" warnings while the JetStream disk was full, want at most 2", n)
	}
	if err := os.Remove(filepath.Join(mnt, "filler")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a ready once space returned", 15*time.Second, func() bool { c, _ := getBody(t, "http://"+a+"/readyz"); return c == 200 })
	if v := metricValue(t, a, "edgelimit_jetstream_disk_full"); v != "0" {
		t.Errorf("edgelimit_jetstream_disk_full = %q once space returned, want 0", v)
	}
	// b hears a's three admissions: 2 are left of the limit of 5.
	waitFor(t, "b to hear a's admissions", 20*time.Second, func() bool {
		return metricValue(t, b, `edgelimit_replication_applied_slots_total`) != "0"
	})
	time.Sleep(500 * time.Millisecond)
	got := admittedOf(t, b, "region", 5)
	// At most the 2 left; b's estimate of what a admits since its last
	// message may keep it under that, but it must admit something.
	if got > 2 || got == 0 {
		t.Errorf("b admitted %d of the region limit of 5 after a admitted 3 while its JetStream disk was full, want 1 or 2", got)
	}
}
