package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// durableRules has one limit of 5 an hour for each algorithm, scope pop, and
// (for a PoP with --region) one of scope region and one of scope global.
const durableRules = `domain: edge
descriptors:
  - key: sw
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: fw
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: fixed_window}
  - key: tb
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: token_bucket}
  - key: gcra
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: gcra}
  - key: log
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: sliding_log}
  - key: region
    rate_limit: {unit: hour, requests_per_unit: 5, scope: region}
  - key: global
    rate_limit: {unit: hour, requests_per_unit: 5, scope: global}
`

var durableKeys = []string{"sw", "fw", "tb", "gcra", "log", "region", "global"}

func checkKey(t *testing.T, addr, key string) int {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/v1/check", "application/json",
		strings.NewReader(fmt.Sprintf(`{"domain":"edge","descriptors":[{"entries":[{"key":%q,"value":"k"}]}]}`, key)))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// admittedOf makes n checks of key at addr one after another and returns
// how many were admitted.
func admittedOf(t *testing.T, addr, key string, n int) int {
	t.Helper()
	admitted := 0
	for range n {
		if checkKey(t, addr, key) == 200 {
			admitted++
		}
	}
	return admitted
}

// A PoP restarted — cleanly or by kill -9 a flush interval after its last
// admission — admits no key of any scope and any algorithm beyond its limit
// across the restart, with or without --region: each key gets 5 admissions
// in all, 3 before the restart and 2 after. Before, a restart re-granted
// every scope-pop limit (10 admitted of 5 here).
func TestPoPDurableAcrossRestart(t *testing.T) {
	bin := buildBinary(t)
	for _, tc := range []struct {
		name   string
		region bool
		stop   syscall.Signal
	}{
		{"standalone kill -9", false, syscall.SIGKILL},
		{"standalone SIGTERM", false, syscall.SIGTERM},
		{"region kill -9", true, syscall.SIGKILL},
		{"region SIGTERM", true, syscall.SIGTERM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			rules := filepath.Join(dir, "rules.yaml")
			os.WriteFile(rules, []byte(durableRules), 0o644)
			addr := freeAddr(t)
			args := []string{"--listen", addr, "--rules", rules, "--data", filepath.Join(dir, "data"), "--log-level", "warn"}
			keys := durableKeys[:5]
			if tc.region {
				args = append(args, "--region", "eu", "--pop", "a")
				keys = durableKeys
			}
			p := startPoP(t, bin, args...)
			admitted := map[string]int{}
			for _, k := range keys {
				for range 3 {
					if checkKey(t, addr, k) == 200 {
						admitted[k]++
					}
				}
			}
			time.Sleep(300 * time.Millisecond) // a few flush intervals
			p.Process.Signal(tc.stop)
			p.Wait()
			startPoP(t, bin, args...)
			for _, k := range keys {
				for range 5 {
					if checkKey(t, addr, k) == 200 {
						admitted[k]++
					}
				}
				if admitted[k] != 5 {
					t.Errorf("%s: admitted %d across the restart, limit 5", k, admitted[k])
				}
			}
		})
	}
}

// runPoPFails runs a PoP that must refuse to start, and returns its output.
func runPoPFails(t *testing.T, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"pop"}, args...)...)
	cmd.Env = demoEnv()
	out, err := cmd.CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("PoP started (or hung) on damaged data: %v\n%s", err, out)
	}
	return string(out)
}

// flipBytes inverts 4 bytes of file at off (from the end when negative).
func flipBytes(t *testing.T, file string, off int) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if off < 0 {
		off += len(b)
	}
	for i := range 4 {
		b[off+i] ^= 0xff
	}
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func largestFile(t *testing.T, dir, suffix string) string {
	t.Helper()
	ls, _ := filepath.Glob(filepath.Join(dir, "*"+suffix))
	best, size := "", int64(-1)
	for _, f := range ls {
		if fi, err := os.Stat(f); err == nil && fi.Size() > size {
			best, size = f, fi.Size()
		}
	}
	if best == "" {
		t.Fatalf("no %s file in %s", suffix, dir)
	}
	return best
}

// A PoP whose data directory was damaged — bytes flipped in the WAL (middle
// or tail, after a kill -9), in a table or at the head of the MANIFEST
// (after a clean stop) — refuses to start, naming the damaged file and the
// way out; moving the directory aside as told lets it start. Before, a
// flipped WAL restarted the PoP with its counts lost.
func TestPoPRefusesDamagedData(t *testing.T) {
	bin := buildBinary(t)
	for _, tc := range []struct {
		name   string
		stop   syscall.Signal
		suffix string // the file to damage: the largest one ending so
		off    int
		want   string
	}{
		{"WAL middle", syscall.SIGKILL, ".log", -600, "damaged write-ahead log"},
		{"WAL tail", syscall.SIGKILL, ".log", -8, "damaged write-ahead log"},
		{"table", syscall.SIGTERM, ".sst", 40, ".sst"},
		{"MANIFEST", syscall.SIGTERM, "", 4, "MANIFEST"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			rules := filepath.Join(dir, "rules.yaml")
			os.WriteFile(rules, []byte(durableRules), 0o644)
			addr := freeAddr(t)
			data := filepath.Join(dir, "data")
			args := []string{"--listen", addr, "--rules", rules, "--data", data, "--flush-interval", "20ms"}
			p := startPoP(t, bin, args...)
			for i := range 40 {
				checkKey(t, addr, durableKeys[i%5])
				time.Sleep(25 * time.Millisecond) // one save each
			}
			time.Sleep(100 * time.Millisecond)
			p.Process.Signal(tc.stop)
			p.Wait()
			state := filepath.Join(data, "state")
			var file string
			if tc.suffix == "" {
				cur, err := os.ReadFile(filepath.Join(state, "CURRENT"))
				if err != nil {
					ms, _ := filepath.Glob(filepath.Join(state, "MANIFEST-*"))
					cur = []byte(filepath.Base(ms[len(ms)-1]))
				}
				file = filepath.Join(state, strings.TrimSpace(string(cur)))
			} else {
				file = largestFile(t, state, tc.suffix)
			}
			flipBytes(t, file, tc.off)
			out := runPoPFails(t, bin, args...)
			for _, want := range []string{tc.want, "mv " + state + " " + state + ".damaged"} {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			if bytes.Count([]byte(out), []byte("\n")) > 5 {
				t.Errorf("more than a few lines of output:\n%s", out)
			}
			if err := os.Rename(state, state+".damaged"); err != nil {
				t.Fatal(err)
			}
			startPoP(t, bin, args...)
		})
	}
}

// A replicated PoP whose state directory was moved aside (the documented
// way out of a damaged one) gets back, from its region's stream, the counts
// it published before: it does not start lower than it was under its name.
// Before, it counted a global limit from zero again and admitted it twice.
func TestPoPStateMovedAsideRecoversFromStream(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	os.WriteFile(rules, []byte(durableRules), 0o644)
	addr := freeAddr(t)
	data := filepath.Join(dir, "data")
	args := []string{"--listen", addr, "--rules", rules, "--data", data, "--region", "eu", "--pop", "a", "--log-level", "warn"}
	p := startPoP(t, bin, args...)
	admitted := admittedOf(t, addr, "global", 3)
	time.Sleep(500 * time.Millisecond) // saved and published
	p.Process.Kill()
	p.Wait()
	state := filepath.Join(data, "state")
	if err := os.Rename(state, state+".damaged"); err != nil {
		t.Fatal(err)
	}
	startPoP(t, bin, args...)
	time.Sleep(time.Second) // the stream replays
	admitted += admittedOf(t, addr, "global", 5)
	if admitted != 5 {
		t.Fatalf("admitted %d of a global limit of 5 across a restart without the state directory", admitted)
	}
}
