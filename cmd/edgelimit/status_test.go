package main

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/httpapi"
)

// Two PoPs in two regions over embedded NATS linked by a leaf: each one's
// status page names it and its region, its rules, its NATS connection, and
// the other PoP heard from moments ago, its beacons and its counts; GET /
// leads a browser there.
func TestPoPStatusPage(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	rules := warmRules(t, dir, "second", 10)
	port := func() string { return strings.Split(freeAddr(t), ":")[1] }
	leaf := port()
	a, b := freeAddr(t), freeAddr(t)
	common := []string{"--rules", rules, "--topology", "eu=a;us=b", "--log-level", "warn"}
	startPoP(t, bin, append([]string{"--listen", a, "--data", filepath.Join(dir, "a"), "--region", "eu", "--pop", "a",
		"--nats-leaf-port", leaf}, common...)...)
	startPoP(t, bin, append([]string{"--listen", b, "--data", filepath.Join(dir, "b"), "--region", "us", "--pop", "b",
		"--nats-leaf-remote", "nats-leaf://127.0.0.1:" + leaf}, common...)...)

	// b counts a hit, which reaches a with b's next flush: a's page then
	// has heard b's beacons and its counts.
	checkKey(t, b, "warm")
	var st httpapi.Status
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + a + "/status?format=json")
		if err != nil {
			t.Fatal(err)
		}
		st = httpapi.Status{}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if st.Repl != nil && len(st.Repl.Peers) == 1 && st.Repl.Peers[0].BeaconAgoSeconds != nil && st.Repl.Peers[0].DataAgoSeconds != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a's status names no beacon and no counts of b after 20 s: %+v", st.Repl)
		}
		time.Sleep(100 * time.Millisecond)
	}
	p := st.Repl.Peers[0]
	switch {
	case st.PoP != "a" || st.Region != "eu" || st.Listen != a || !strings.HasPrefix(st.Version, "edgelimit "):
		t.Fatalf("a's status: pop %q region %q listen %q version %q", st.PoP, st.Region, st.Listen, st.Version)
	case st.Rules.Limits != 2 || st.Rules.Domains != 1 || len(st.Rules.Files) != 1 || st.Rules.Files[0] != rules:
		t.Fatalf("a's rules: %+v", st.Rules)
	case !st.Repl.Connected || st.Repl.NATS != "CONNECTED" || st.Repl.GlobalShare != 1 || len(st.Repl.Unreachable) != 0:
		t.Fatalf("a's replication: %+v", st.Repl)
	case p.PoP != "b" || p.Region != "us" || *p.BeaconAgoSeconds > 5 || p.RegionUnreachable:
		t.Fatalf("a's peer: %+v, want b in us heard within 5 s", p)
	}

	resp, err := http.Get("http://" + b + "/") // redirected to /status
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET / on b: %s", resp.Header.Get("Content-Type"))
	}
	for _, want := range []string{"PoP b", "in region us", "2 limits in 1 domain", "CONNECTED", ">a<"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("b's page does not show %q", want)
		}
	}
}
