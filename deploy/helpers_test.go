package deploy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/deploy/lab"
)

// binDir holds the binaries the tests build, once per test binary run.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "edgelimit-deploy-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var builds sync.Map // package path -> *build

type build struct {
	once sync.Once
	bin  string
	err  error
}

// goBuild builds the main package pkg (a path go.mod resolves: the module's
// own, or a dependency at go.mod's version) once per test binary run and
// returns the binary's path.
func goBuild(t *testing.T, pkg string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs binaries; skipped with -short")
	}
	v, _ := builds.LoadOrStore(pkg, &build{})
	b := v.(*build)
	b.once.Do(func() {
		b.bin = filepath.Join(binDir, strings.ReplaceAll(pkg, "/", "_"))
		out, err := exec.Command("go", "build", "-o", b.bin, pkg).CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.bin
}

// edgelimitBin builds cmd/edgelimit.
func edgelimitBin(t *testing.T) string {
	return goBuild(t, "github.com/edgelimit/edgelimit/cmd/edgelimit")
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// proc is a process a test started (a lab.Proc); it is killed at the
// test's cleanup, and its output is shown when the test failed.
type proc struct{ *lab.Proc }

// start runs bin with args and env (added to the test's environment).
func start(t *testing.T, name, bin string, env []string, args ...string) *proc {
	t.Helper()
	lp, err := lab.StartProc(t.TempDir(), "", name, env, bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{lp}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("log of %s (%s):\n%s", name, strings.Join(args, " "), p.Tail(8000))
		}
	})
	return p
}

func (p *proc) stop()        { p.Kill() }
func (p *proc) terminate()   { p.Terminate() }
func (p *proc) exited() bool { return p.Exited() }

// patience bounds the waits for what a loaded machine may be slow to get
// done (a process starting, a cluster forming, a message crossing, a scrape):
// far above what it takes on an idle machine, since the bound only decides
// when a test that fails anyway says so.
const patience = 2 * time.Minute

// waitFor polls cond every 50 ms until it returns nil, and fails the test
// with its last error after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v: %v", what, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startPoP runs `edgelimit pop` listening on listen and waits until /readyz
// answers 200.
func startPoP(t *testing.T, name, listen string, env []string, args ...string) *proc {
	t.Helper()
	p := start(t, name, edgelimitBin(t), env, append([]string{"pop", "--listen", listen}, args...)...)
	waitReady(t, p, listen)
	return p
}

// waitReady waits until the PoP p, listening on listen, answers /readyz with
// 200.
func waitReady(t *testing.T, p *proc, listen string) {
	t.Helper()
	name := p.Name
	waitFor(t, patience, name+" ready", func() error {
		if p.exited() {
			t.Fatalf("%s exited before it was ready", name)
		}
		resp, err := http.Get("http://" + listen + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	})
}

// sample is one line of a Prometheus text exposition.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)`)
var labelPair = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

// scrape reads addr's /metrics.
func scrape(addr string) ([]sample, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	return parseExposition(resp.Body)
}

func parseExposition(r io.Reader) ([]sample, error) {
	var out []sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m := sampleLine.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("unparsable metrics line %q", line)
		}
		v, err := strconv.ParseFloat(m[4], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %v", line, err)
		}
		s := sample{name: m[1], labels: map[string]string{}, value: v}
		for _, lp := range labelPair.FindAllStringSubmatch(m[3], -1) {
			s.labels[lp[1]] = lp[2]
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

// metric returns the value of the sample named name whose labels include
// those given as name, value pairs, or an error when there is none.
func metric(samples []sample, name string, labels ...string) (float64, error) {
	for _, s := range samples {
		if s.name != name {
			continue
		}
		ok := true
		for i := 0; i+1 < len(labels); i += 2 {
			ok = ok && s.labels[labels[i]] == labels[i+1]
		}
		if ok {
			return s.value, nil
		}
	}
	return 0, fmt.Errorf("no sample %s%v", name, labels)
}

// check sends one /v1/check to addr and returns its HTTP status.
func check(t *testing.T, addr, body string) int {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// template returns text with every old replaced by its new, and fails the
// test when an old does not occur: the file changed under the test.
func template(t *testing.T, file, text string, pairs ...string) string {
	t.Helper()
	for i := 0; i+1 < len(pairs); i += 2 {
		if !strings.Contains(text, pairs[i]) {
			t.Fatalf("%s no longer contains %q: update the test along with the file", file, pairs[i])
		}
		text = strings.ReplaceAll(text, pairs[i], pairs[i+1])
	}
	return text
}

// readRepoFile reads a file by its path from the repository root.
func readRepoFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// popFlags returns the flag names `edgelimit pop --help` lists: the binary's
// own flag set, the one source of truth for every file that passes flags.
func popFlags(t *testing.T) []string {
	t.Helper()
	out, _ := exec.Command(edgelimitBin(t), "pop", "--help").CombinedOutput()
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		names = append(names, m[1])
	}
	if len(names) < 20 || !slices.Contains(names, "listen") {
		t.Fatalf("could not read the flags of 'edgelimit pop --help' (%d found):\n%s", len(names), out)
	}
	return names
}
