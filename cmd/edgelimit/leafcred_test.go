package main

import (
	"bytes"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// startPoPUnready runs `edgelimit pop` and waits until it answers /readyz,
// ready or not.
func startPoPUnready(t *testing.T, bin string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"pop"}, args...)...)
	var logb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logb, &logb
	cmd.Env = demoEnv()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
		if t.Failed() {
			t.Logf("log of pop %v:\n%s", args, logb.String())
		}
	})
	waitFor(t, "answering /readyz", 30*time.Second, func() bool {
		resp, err := http.Get("http://" + args[1] + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	})
	return cmd
}

// TestPoPsLinkWithLeafCredential re-runs probe 4 of issue 27: a hub region
// started with --nats-authorized-keys refuses a leaf region's embedded
// server that logs in without a credential, and that region's PoP then
// fails /readyz saying the hub refuses its leaf link (and
// edgelimit_nats_leaf_links_down is 1); with --nats-leaf-nkey (the leaf.nk
// edgelimit natsconf writes) the link comes up, the PoP is ready, and each
// region applies the other's counts.
func TestPoPsLinkWithLeafCredential(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys")
	var out, errb bytes.Buffer
	if code := run([]string{"natsconf", "--topology", "eu=a;us=b", "--keys", keys}, &out, &errb); code != 0 {
		t.Fatalf("natsconf: exit %d: %s", code, errb.String())
	}
	rules := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rules, []byte(durableRules), 0o644); err != nil {
		t.Fatal(err)
	}
	port := func() string { return strings.Split(freeAddr(t), ":")[1] }
	leaf := port()
	a, b, b2 := freeAddr(t), freeAddr(t), freeAddr(t)
	common := []string{"--rules", rules, "--topology", "eu=a;us=b", "--flush-interval", "50ms", "--log-level", "info",
		"--nats-authorized-keys", filepath.Join(keys, "authorized_keys")}
	startPoP(t, bin, append([]string{"--listen", a, "--data", filepath.Join(dir, "a"), "--region", "eu", "--pop", "a",
		"--nats-nkey", filepath.Join(keys, "a.nk"), "--nats-port", port(), "--nats-leaf-port", leaf}, common...)...)

	// Without a credential: the hub refuses the link, and b says so.
	nocred := startPoPUnready(t, bin, append([]string{"--listen", b, "--data", filepath.Join(dir, "b-nocred"), "--region", "us", "--pop", "b",
		"--nats-nkey", filepath.Join(keys, "b.nk"), "--nats-port", port(), "--nats-leaf-remote", "nats-leaf://127.0.0.1:" + leaf}, common...)...)
	body := waitUnready(t, b, "b unready for its refused leaf link", "refuses this region's leaf link", 60*time.Second)
	t.Logf("b without --nats-leaf-nkey: /readyz 503: %s", strings.TrimSpace(body))
	if v := metricValue(t, b, "edgelimit_nats_leaf_links_down"); v != "1" {
		t.Errorf("edgelimit_nats_leaf_links_down = %q with the link refused, want 1", v)
	}
	_ = nocred.Process.Kill()
	_, _ = nocred.Process.Wait()

	// With the leaf links' credential: linked, ready, counting together.
	startPoP(t, bin, append([]string{"--listen", b2, "--data", filepath.Join(dir, "b"), "--region", "us", "--pop", "b",
		"--nats-nkey", filepath.Join(keys, "b.nk"), "--nats-port", port(), "--nats-leaf-remote", "nats-leaf://127.0.0.1:" + leaf,
		"--nats-leaf-nkey", filepath.Join(keys, "leaf.nk")}, common...)...)
	if v := metricValue(t, b2, "edgelimit_nats_leaf_links_down"); v != "0" {
		t.Errorf("edgelimit_nats_leaf_links_down = %q with the credential, want 0", v)
	}
	for range 3 {
		if c := checkKey(t, a, "global"); c != 200 {
			t.Fatalf("check at a: %d", c)
		}
	}
	waitFor(t, "b to apply a's counts", 60*time.Second, func() bool {
		return metricValue(t, b2, "edgelimit_replication_applied_slots_total") != "0" ||
			metricValue(t, b2, "edgelimit_replication_direct_batches_total") != "0"
	})
	if c := checkKey(t, b2, "global"); c != 200 {
		t.Fatalf("check at b: %d", c)
	}
	waitFor(t, "a to apply b's counts", 60*time.Second, func() bool {
		return metricValue(t, a, "edgelimit_replication_applied_slots_total") != "0" ||
			metricValue(t, a, "edgelimit_replication_direct_batches_total") != "0"
	})
}
