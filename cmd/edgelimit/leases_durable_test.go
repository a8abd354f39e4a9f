package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// leaseRules: 3 requests of one key in flight at once, leases of 20 s.
const leaseRules = `domain: edge
descriptors:
  - key: job
    rate_limit: {unit: hour, requests_per_unit: 100000}
    concurrency: {max: 3, lease_ttl: 20s}
`

// acquireLease asks for one slot of key "job"; it returns the status and
// the lease id (empty when denied).
func acquireLease(t *testing.T, addr string) (int, string) {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/v1/check", "application/json",
		strings.NewReader(`{"domain":"edge","descriptors":[{"entries":[{"key":"job","value":"k"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		LeaseID string `json:"lease_id"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body.LeaseID
}

func releaseLease(t *testing.T, addr, id string) string {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/v1/release", "application/json", strings.NewReader(fmt.Sprintf(`{"lease_id":%q}`, id)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Results []struct {
			State string `json:"state"`
		} `json:"results"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	if resp.StatusCode != 200 || len(body.Results) != 1 {
		t.Fatalf("release: %d %+v", resp.StatusCode, body)
	}
	return body.Results[0].State
}

// A PoP on the embedded store holding 3 of 3 concurrency slots, killed with
// kill -9 (or stopped with SIGTERM) and restarted, still knows the 3 slots
// are held: a 4th acquisition is refused until one of the leases granted
// before the restart is released, and then exactly one more is granted.
// Before, the restart forgot the leases and granted 3 more: 6 in flight
// against a maximum of 3.
func TestPoPLeasesSurviveRestart(t *testing.T) {
	bin := buildBinary(t)
	for _, tc := range []struct {
		name string
		stop syscall.Signal
	}{
		{"kill -9", syscall.SIGKILL},
		{"SIGTERM", syscall.SIGTERM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			rules := filepath.Join(dir, "rules.yaml")
			os.WriteFile(rules, []byte(leaseRules), 0o644)
			addr := freeAddr(t)
			args := []string{"--listen", addr, "--rules", rules, "--data", filepath.Join(dir, "data"), "--log-level", "warn"}
			p := startPoP(t, bin, args...)
			var held []string
			for i := range 3 {
				code, id := acquireLease(t, addr)
				if code != 200 || id == "" {
					t.Fatalf("acquisition %d: %d, lease %q; want 200 with a lease", i+1, code, id)
				}
				held = append(held, id)
			}
			if code, _ := acquireLease(t, addr); code != 429 {
				t.Fatalf("4th acquisition before the restart: %d, want 429", code)
			}
			start := time.Now()
			p.Process.Signal(tc.stop)
			p.Wait()
			startPoP(t, bin, args...)
			if code, id := acquireLease(t, addr); code != 429 {
				t.Fatalf("4th acquisition after the restart: %d (lease %q), want 429: 3 of 3 slots are still held", code, id)
			}
			if time.Since(start) < 15*time.Second { // the leases still live: a release frees one
				if st := releaseLease(t, addr, held[0]); st != "released" {
					t.Fatalf("release of a lease granted before the restart: %q, want released", st)
				}
				if code, _ := acquireLease(t, addr); code != 200 {
					t.Fatalf("acquisition after a release: %d, want 200", code)
				}
				if code, _ := acquireLease(t, addr); code != 429 {
					t.Fatalf("acquisition beyond the released slot: %d, want 429", code)
				}
			} else {
				t.Logf("the restart took %v: the release step is skipped (the leases may have expired)", time.Since(start))
			}
		})
	}
}
