// Package poptest runs real `edgelimit pop` processes for tests outside
// cmd/edgelimit (the client package's, for one): it builds the binary once
// per test binary, starts PoPs on free loopback ports with a data directory
// of their own, waits until /readyz answers 200, and kills them when the test
// ends, printing their logs when it failed.
//
// It imports the standard library only.
package poptest

import (
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  string
	buildDir  string
)

// Binary builds ./cmd/edgelimit once per test binary and returns its path.
// It skips the test under -short.
func Binary(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs edgelimit; skipped with -short")
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "poptest")
		if err != nil {
			buildErr = err.Error()
			return
		}
		buildDir = dir
		bin := filepath.Join(dir, "edgelimit")
		out, err := exec.Command("go", "build", "-o", bin, "github.com/edgelimit/edgelimit/cmd/edgelimit").CombinedOutput()
		if err != nil {
			buildErr = err.Error() + "\n" + string(out)
			return
		}
		binPath = bin
	})
	if binPath == "" {
		t.Fatalf("go build edgelimit: %s", buildErr)
	}
	return binPath
}

// Cleanup removes the built binary; call it from TestMain after m.Run.
func Cleanup() {
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
}

// FreeAddr returns a loopback address nobody listens on (for a moment).
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// PoP is one running `edgelimit pop`.
type PoP struct {
	// Addr is its HTTP API's host:port; URL the same as http://host:port.
	Addr, URL string
	Cmd       *exec.Cmd
}

// Start runs `edgelimit pop --listen <free> --data <temp> --log-level warn`
// plus args and waits (up to 20 s) until it is ready.
func Start(t testing.TB, args ...string) *PoP {
	t.Helper()
	bin := Binary(t)
	addr := FreeAddr(t)
	all := append([]string{"pop", "--listen", addr, "--data", t.TempDir(), "--log-level", "warn"}, args...)
	cmd := exec.Command(bin, all...)
	logf, err := os.Create(filepath.Join(t.TempDir(), "pop.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	for _, kv := range os.Environ() { // flags only: no EDGELIMIT_* from the caller's shell
		if !strings.HasPrefix(kv, "EDGELIMIT_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_, _ = cmd.Process.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("log of pop %v:\n%s", args, b)
		}
	})
	p := &PoP{Addr: addr, URL: "http://" + addr, Cmd: cmd}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(p.URL + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pop %v not ready after 20s", args)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Rules writes a rule file into a temporary directory and returns its path.
func Rules(t testing.TB, yaml string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
