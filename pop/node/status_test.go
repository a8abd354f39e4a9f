package node

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/httpapi"
)

// getStatus fetches base's /status as JSON.
func getStatus(t *testing.T, base string) httpapi.Status {
	t.Helper()
	resp, err := http.Get(base + "/status?format=json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st httpapi.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// A running PoP's status page states its version, address, store, the rules
// it loaded and the reload that failed, and the decisions it made.
func TestRunStatusPage(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	os.WriteFile(file, []byte(rulesFile("2")), 0o644)
	base, _, _ := start(t, Config{Rules: []string{file}, RulesInterval: 10 * time.Millisecond, DataDir: filepath.Join(dir, "data"), Version: "edgelimit test-build"})
	for range 3 {
		check(t, base)
	}
	st := getStatus(t, base)
	switch {
	case "http://"+st.Listen != base, st.Version != "edgelimit test-build", !st.Ready, st.Repl != nil:
		t.Fatalf("listen %q version %q ready %v replication %+v", st.Listen, st.Version, st.Ready, st.Repl)
	case st.Store.Kind != "embedded" || !st.Store.Reachable || st.Store.Keys != 1:
		t.Fatalf("store %+v, want embedded with the one key checked", st.Store)
	case st.Rules.Limits != 1 || st.Rules.Domains != 1 || len(st.Rules.Files) != 1 || st.Rules.Files[0] != file || st.Rules.Loads != 1 || st.Rules.LastError != "":
		t.Fatalf("rules %+v, want the one limit of %s loaded once", st.Rules, file)
	case !regexp.MustCompile(`^[0-9a-f]{12}$`).MatchString(st.Rules.Version):
		t.Fatalf("rules version %q, want 12 hex digits", st.Rules.Version)
	case st.Traffic.Requests != 3 || st.Traffic.Decisions != 3 || st.Traffic.Denied != 1:
		t.Fatalf("traffic %+v, want 3 requests, 1 denied", st.Traffic)
	}

	os.WriteFile(file, []byte("domain: d\ndescriptors: [oops"), 0o644)
	deadline := time.Now().Add(5 * time.Second)
	for st = getStatus(t, base); st.Rules.Failures == 0; st = getStatus(t, base) {
		if time.Now().After(deadline) {
			t.Fatal("a broken rule file is not on the status page after 5 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st.Rules.LastError == "" || st.Rules.LastErrorAt == nil || st.Rules.Limits != 1 {
		t.Fatalf("rules %+v, want the failure, and the last good limit in force", st.Rules)
	}
	resp, err := http.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	version := st.Rules.Version
	for _, want := range []string{"1 limit in 1 domain", version, filepath.Base(file), "failed", "the rules above stay in force", "3 since start", "1 since start"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("GET / (redirected to the page) does not show %q", want)
		}
	}

	os.WriteFile(file, []byte(rulesFile("2")+"  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o644)
	for st = getStatus(t, base); st.Rules.Limits != 2; st = getStatus(t, base) {
		if time.Now().After(deadline.Add(5 * time.Second)) {
			t.Fatalf("the fixed rule file is not on the status page: %+v", st.Rules)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st.Rules.Loads != 2 || st.Rules.LastError != "" || st.Rules.Version == version || st.Rules.Version == "" {
		t.Fatalf("rules %+v, want a second load, no error, and a version other than the first's %s", st.Rules, version)
	}
}

// What Replicate reports shows on the page, with the global share the engine
// enforces.
func TestRunStatusReplication(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	os.WriteFile(file, []byte(rulesFile("2")), 0o644)
	heard := 0.3
	repl := func(ctx context.Context, h ReplicaHooks) (func() error, func() error, error) {
		h.ReportStatus(func() httpapi.ReplicationStatus {
			return httpapi.ReplicationStatus{NATS: "CONNECTED", Connected: true, Unreachable: []string{},
				Peers: []httpapi.PeerStatus{{PoP: "b", Region: "eu", BeaconAgoSeconds: &heard}}}
		})
		h.SetGlobalShare(0.5)
		return func() error { <-ctx.Done(); return nil }, nil, nil
	}
	base, _, _ := start(t, Config{Rules: []string{file}, DataDir: filepath.Join(dir, "data"), Replica: "a", Region: "eu", Replicate: repl})
	st := getStatus(t, base)
	if st.PoP != "a" || st.Region != "eu" || st.Repl == nil || len(st.Repl.Peers) != 1 || st.Repl.Peers[0].PoP != "b" || st.Repl.GlobalShare != 0.5 {
		t.Fatalf("status %+v, replication %+v", st, st.Repl)
	}
}
