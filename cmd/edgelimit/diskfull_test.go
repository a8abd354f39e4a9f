package main

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// mountTmpfs mounts a tmpfs of sizeMiB at a new directory and unmounts it at
// the end; the test skips when it may not mount (not root), and fails under
// CI=true.
func mountTmpfs(t *testing.T, sizeMiB int) string {
	t.Helper()
	dir := t.TempDir()
	mountTmpfsAt(t, dir, sizeMiB)
	return dir
}

// mountTmpfsAt is mountTmpfs on the directory dir, which must exist.
func mountTmpfsAt(t *testing.T, dir string, sizeMiB int) {
	t.Helper()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+strconv.Itoa(sizeMiB)+"m", "tmpfs", dir).CombinedOutput()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mount tmpfs: %v %s", err, out)
		}
		t.Skipf("cannot mount a tmpfs (needs root): %v %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", dir, err, out)
		}
	})
}

// fillDisk writes a file until the filesystem is full.
func fillDisk(t *testing.T, file string) {
	t.Helper()
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill: %v", err)
			}
			break
		}
	}
	for { // and the last bytes
		if _, err := f.Write(buf[:512]); err != nil {
			return
		}
	}
}

func getBody(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func metricValue(t *testing.T, addr, name string) string {
	t.Helper()
	_, body := getBody(t, "http://"+addr+"/metrics")
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == name {
			return f[1]
		}
	}
	return ""
}

// cpuSeconds is the user+system CPU time of process pid so far.
func cpuSeconds(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / 100 // USER_HZ
}

func waitFor(t *testing.T, what string, limit time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not %s after %v", what, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitUnready waits until the PoP at addr answers /readyz with 503 and a
// reason containing reason, and returns that answer.
func waitUnready(t *testing.T, addr, what, reason string, limit time.Duration) string {
	t.Helper()
	var body string
	waitFor(t, what, limit, func() bool {
		var c int
		c, body = getBody(t, "http://"+addr+"/readyz")
		return c == 503 && strings.Contains(body, reason)
	})
	return body
}

// A PoP whose data disk fills up (a real tmpfs, filled by another writer)
// keeps answering from memory, fails /readyz naming the full disk, sets
// edgelimit_durable_disk_full, neither spins nor floods its log, and saves
// again once space returns — what it admitted meanwhile included, so a
// kill -9 after that loses nothing. Restarted while the disk is still full,
// it opens its state read-only, restores it, serves (not ready), and stops on
// SIGTERM within --shutdown-timeout. Before, Pebble panicked ("sync: unlock
// of unlocked mutex" in rotateWAL), and a restart on the full disk spun in
// pebble.Open, logged about once a millisecond and ignored SIGTERM.
func TestPoPDiskFull(t *testing.T) {
	bin := buildBinary(t)
	mnt := mountTmpfs(t, 48)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	os.WriteFile(rules, []byte(durableRules), 0o644)
	addr := freeAddr(t)
	logFile := filepath.Join(dir, "pop.log")
	args := []string{"pop", "--listen", addr, "--rules", rules, "--data", filepath.Join(mnt, "data"),
		"--data-min-free-mib", "8", "--shutdown-timeout", "2s"}
	start := func() *exec.Cmd {
		lf, err := os.OpenFile(logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr, cmd.Env = lf, lf, demoEnv()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); lf.Close() })
		waitFor(t, "serving", 20*time.Second, func() bool {
			resp, err := http.Get("http://" + addr + "/healthz")
			if err == nil {
				resp.Body.Close()
			}
			return err == nil
		})
		return cmd
	}
	defer func() {
		if t.Failed() || testing.Verbose() {
			b, _ := os.ReadFile(logFile)
			t.Logf("PoP log:\n%s", b)
		}
	}()
	p := start()
	waitFor(t, "ready", 5*time.Second, func() bool { c, _ := getBody(t, "http://"+addr+"/readyz"); return c == 200 })
	for range 2 {
		checkKey(t, addr, "sw")
	}
	filler := filepath.Join(mnt, "filler")
	fillDisk(t, filler)
	// The PoP answers from memory, right, while its disk is full.
	for i := range 2 {
		if c := checkKey(t, addr, "sw"); c != 200 {
			t.Fatalf("check %d on a full disk: %d, want 200", i+3, c)
		}
	}
	waitUnready(t, addr, "unready on the full disk", "disk full", 5*time.Second)
	if v := metricValue(t, addr, "edgelimit_durable_disk_full"); v != "1" {
		t.Errorf("edgelimit_durable_disk_full = %q on a full disk, want 1", v)
	}
	cpu0 := cpuSeconds(t, p.Process.Pid)
	time.Sleep(3 * time.Second)
	if used := cpuSeconds(t, p.Process.Pid) - cpu0; used > 0.5 {
		t.Errorf("the PoP used %.2fs of CPU in 3s on a full disk: spinning", used)
	}
	logged, _ := os.ReadFile(logFile)
	if n := strings.Count(string(logged), "level=ERROR"); n > 3 {
		t.Errorf("%d error lines in a few seconds on a full disk: a flood", n)
	}
	// Space returns: it saves again, the hits admitted meanwhile included.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "ready once space returned", 10*time.Second, func() bool { c, _ := getBody(t, "http://"+addr+"/readyz"); return c == 200 })
	checkKey(t, addr, "sw") // the 5th
	time.Sleep(300 * time.Millisecond)
	p.Process.Kill()
	p.Wait()
	p = start()
	if c := checkKey(t, addr, "sw"); c != 429 {
		t.Fatalf("after a kill -9 the 6th hit of a limit of 5 got %d, want 429: hits admitted while the disk was full were lost", c)
	}
	// A restart on a disk still full: read-only, restored, serving, not ready.
	fillDisk(t, filler)
	p.Process.Kill()
	p.Wait()
	if err := os.Remove(filepath.Join(mnt, "data", "state", "EDGELIMIT-BALLAST")); err != nil && !os.IsNotExist(err) {
		t.Fatal(err) // as if Pebble had used the ballast already
	}
	fillDisk(t, filler+"2")
	p = start()
	if c := checkKey(t, addr, "sw"); c != 429 {
		t.Errorf("restarted on a full disk, the 6th hit of a limit of 5 got %d, want 429", c)
	}
	if c, body := getBody(t, "http://"+addr+"/readyz"); c != 503 || !strings.Contains(body, "disk full") {
		t.Errorf("restarted on a full disk: /readyz %d %s, want 503 naming the full disk", c, body)
	}
	// Space returns: it reopens read-write and saves again, idle or not.
	os.Remove(filler)
	os.Remove(filler + "2")
	waitFor(t, "ready once space returned after a start on a full disk", 10*time.Second, func() bool {
		c, _ := getBody(t, "http://"+addr+"/readyz")
		return c == 200
	})
	fillDisk(t, filler)
	waitFor(t, "unready on the full disk again", 5*time.Second, func() bool {
		checkKey(t, addr, "tb")
		c, _ := getBody(t, "http://"+addr+"/readyz")
		return c == 503
	})
	began := time.Now()
	p.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.Wait() }()
	select {
	case <-done:
		if took := time.Since(began); took > 2*time.Second+500*time.Millisecond {
			t.Errorf("SIGTERM on a full disk took %v, --shutdown-timeout 2s", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("SIGTERM on a full disk: still running after 10s")
	}
}
