package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/edgelimit/edgelimit/deploy/lab"
)

// netnsPair is two network namespaces, hub and leaf, each with an eth0 on
// one bridge of the root namespace, which also has an address on it so the
// test reaches both. Names start with "ei27" and carry the test's pid, so
// they clash neither with deploy/lab's ("elab") nor with another run.
type netnsPair struct {
	hubNS, leafNS   string
	bridge          string
	hubIP, leafIP   string
	rootIP, network string
}

// newNetnsPair makes the namespaces and the bridge, or skips the test
// saying why it cannot; t.Cleanup removes them, also when the test fails.
func newNetnsPair(t *testing.T) *netnsPair {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make network namespaces (ip netns)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs the ip command (iproute2) to make network namespaces")
	}
	id := os.Getpid() % 100000
	octet := 20 + os.Getpid()%200
	n := &netnsPair{
		hubNS: fmt.Sprintf("ei27-%d-hub", id), leafNS: fmt.Sprintf("ei27-%d-leaf", id),
		bridge: fmt.Sprintf("ei27b%d", id),
		hubIP:  fmt.Sprintf("10.227.%d.1", octet), leafIP: fmt.Sprintf("10.227.%d.2", octet),
		rootIP: fmt.Sprintf("10.227.%d.254", octet), network: fmt.Sprintf("10.227.%d.0/24", octet),
	}
	if out, err := exec.Command("ip", "netns", "add", n.hubNS).CombinedOutput(); err != nil {
		t.Skipf("cannot make a network namespace here (ip netns add: %v: %s)", err, bytes.TrimSpace(out))
	}
	t.Cleanup(n.remove)
	ipCmd := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
	}
	ipCmd("netns", "add", n.leafNS)
	ipCmd("link", "add", n.bridge, "type", "bridge")
	ipCmd("addr", "add", n.rootIP+"/24", "dev", n.bridge)
	ipCmd("link", "set", n.bridge, "up")
	for _, h := range []struct{ ns, ip, link string }{
		{n.hubNS, n.hubIP, fmt.Sprintf("ei27h%d", id)},
		{n.leafNS, n.leafIP, fmt.Sprintf("ei27l%d", id)},
	} {
		ipCmd("-n", h.ns, "link", "set", "lo", "up")
		ipCmd("link", "add", h.link, "type", "veth", "peer", "name", h.link+"p")
		ipCmd("link", "set", h.link+"p", "netns", h.ns)
		ipCmd("-n", h.ns, "link", "set", h.link+"p", "name", "eth0")
		ipCmd("-n", h.ns, "addr", "add", h.ip+"/24", "dev", "eth0")
		ipCmd("-n", h.ns, "link", "set", "eth0", "up")
		ipCmd("link", "set", h.link, "master", n.bridge)
		ipCmd("link", "set", h.link, "up")
	}
	return n
}

// remove deletes the namespaces (their veths go with them) and the bridge.
func (n *netnsPair) remove() {
	for _, ns := range []string{n.hubNS, n.leafNS} {
		_ = exec.Command("ip", "netns", "del", ns).Run()
	}
	_ = exec.Command("ip", "link", "del", n.bridge).Run()
}

// startNSPoP runs `edgelimit pop` in namespace ns and waits until addr
// answers /readyz (ready or not, as ready says); t.Cleanup kills it.
func startNSPoP(t *testing.T, bin, ns, name, addr string, ready bool, args ...string) *lab.Proc {
	t.Helper()
	p, err := lab.StartProc(t.TempDir(), ns, name, nil, bin, append([]string{"pop", "--listen", addr}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("log of %s:\n%s", name, p.Tail(8000))
		}
	})
	waitFor(t, name+" answering /readyz", 60*time.Second, func() bool {
		if p.Exited() {
			t.Fatalf("%s exited: %s", name, p.Tail(2000))
		}
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return !ready || resp.StatusCode == 200
	})
	return p
}

// remainingAt is what a look at key at addr says is left: the descriptor's
// own hits_addend 0 counts nothing (the request's 0 would count 1, as in
// Envoy).
func remainingAt(t *testing.T, addr, key string) int {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/v1/check", "application/json",
		strings.NewReader(fmt.Sprintf(`{"domain":"edge","descriptors":[{"entries":[{"key":%q,"value":"k"}],"hits_addend":0}]}`, key)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Statuses []struct {
			Remaining int `json:"limit_remaining"`
		} `json:"statuses"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || len(body.Statuses) != 1 {
		t.Fatalf("look at %s: %v %+v", addr, err, body)
	}
	return body.Statuses[0].Remaining
}

// TestRegionsLinkedAcrossNetns: two regions, each one PoP with its embedded
// NATS server in a network namespace of its own, joined by a bridge. The hub
// (eu) lets in only the keys of edgelimit natsconf (--nats-authorized-keys)
// on a leaf listener bound to its namespace's address (--nats-leaf-host);
// the leaf region (us) logs in with --nats-leaf-nkey. With a credential the
// hub does not list, the leaf PoP is not ready and /readyz names the hub's
// refusal; with leaf.nk, a global limit of 10 an hour is shared: 5 admitted
// at each PoP, and the 11th denied at both.
func TestRegionsLinkedAcrossNetns(t *testing.T) {
	n := newNetnsPair(t)
	bin := buildBinary(t)
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys")
	var out, errb bytes.Buffer
	if code := run([]string{"natsconf", "--topology", "eu=a;us=b", "--keys", keys}, &out, &errb); code != 0 {
		t.Fatalf("natsconf: exit %d: %s", code, errb.String())
	}
	wrong, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	wrongSeed, _ := wrong.Seed()
	wrongFile := filepath.Join(dir, "wrong-leaf.nk")
	if err := os.WriteFile(wrongFile, wrongSeed, 0o600); err != nil {
		t.Fatal(err)
	}
	rules := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rules, []byte("domain: edge\ndescriptors:\n  - key: global\n    rate_limit: {unit: hour, requests_per_unit: 10, scope: global}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// --extrapolate=false: the PoPs decide on what they heard, so the
	// shares below are exact and the test is about the link alone.
	common := []string{"--rules", rules, "--topology", "eu=a;us=b", "--flush-interval", "50ms", "--log-level", "info",
		"--extrapolate=false", "--nats-authorized-keys", filepath.Join(keys, "authorized_keys")}
	hub := n.hubIP + ":8080"
	hubLeaf := "nats-leaf://" + n.hubIP + ":7422"
	startNSPoP(t, bin, n.hubNS, "hub-a", hub, true, append([]string{"--data", filepath.Join(dir, "a"), "--region", "eu", "--pop", "a",
		"--nats-nkey", filepath.Join(keys, "a.nk"), "--nats-leaf-port", "7422", "--nats-leaf-host", n.hubIP}, common...)...)

	// A leaf credential the hub does not list: refused, and b says so.
	leaf := n.leafIP + ":8080"
	bad := startNSPoP(t, bin, n.leafNS, "leaf-b-wrongkey", leaf, false, append([]string{"--data", filepath.Join(dir, "b-wrong"), "--region", "us", "--pop", "b",
		"--nats-nkey", filepath.Join(keys, "b.nk"), "--nats-leaf-remote", hubLeaf, "--nats-leaf-nkey", wrongFile}, common...)...)
	body := waitUnready(t, leaf, "b unready with a wrong leaf credential", "refuses this region's leaf link", 90*time.Second)
	t.Logf("b with a leaf key the hub does not list: /readyz 503: %s", strings.TrimSpace(body))
	if v := metricValue(t, leaf, "edgelimit_nats_leaf_links_down"); v != "1" {
		t.Errorf("edgelimit_nats_leaf_links_down = %q with the link refused, want 1", v)
	}
	bad.Kill()

	// leaf.nk: linked across the namespaces, one global limit.
	startNSPoP(t, bin, n.leafNS, "leaf-b", leaf, true, append([]string{"--data", filepath.Join(dir, "b"), "--region", "us", "--pop", "b",
		"--nats-nkey", filepath.Join(keys, "b.nk"), "--nats-leaf-remote", hubLeaf, "--nats-leaf-nkey", filepath.Join(keys, "leaf.nk")}, common...)...)
	if v := metricValue(t, leaf, "edgelimit_nats_leaf_links_down"); v != "0" {
		t.Errorf("edgelimit_nats_leaf_links_down = %q with leaf.nk, want 0", v)
	}
	if got := admittedOf(t, hub, "global", 5); got != 5 {
		t.Fatalf("a admitted %d of its first 5 checks of a global limit of 10", got)
	}
	waitFor(t, "b to hear a's 5", 60*time.Second, func() bool { return remainingAt(t, leaf, "global") == 5 })
	if got := admittedOf(t, leaf, "global", 5); got != 5 {
		t.Fatalf("b admitted %d of 5 after a's 5, of a global limit of 10", got)
	}
	if c := checkKey(t, leaf, "global"); c != 429 {
		t.Fatalf("the 11th check, at b: %d, want 429", c)
	}
	waitFor(t, "a to hear b's 5", 60*time.Second, func() bool { return remainingAt(t, hub, "global") == 0 })
	if c := checkKey(t, hub, "global"); c != 429 {
		t.Fatalf("a check at a after 10 admitted over both: %d, want 429", c)
	}
	t.Logf("global limit 10/h across %s and %s: 5 admitted at each PoP, the 11th denied at both", n.hubNS, n.leafNS)
}
