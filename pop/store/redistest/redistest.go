// Package redistest starts private redis-server processes for tests: a
// standalone server or a small cluster, each on free loopback ports (never
// 6379), without persistence, in the test's temporary directory, stopped when
// the test ends. Tests therefore never share state with anything else on the
// machine.
//
// When redis-server (or, for a cluster, redis-cli) is not on PATH the test is
// skipped with a loud reason — except under CI=true, where it fails, so a CI
// image missing Redis cannot turn the Redis tests green by skipping them.
//
// It imports the standard library only and speaks just enough RESP to ask a
// server whether it is up.
package redistest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// startTimeout bounds how long a server may take to answer PING, and a
// cluster to reach cluster_state:ok.
const startTimeout = 15 * time.Second

// Server is one private redis-server process. Its methods are safe for
// concurrent use; the process is stopped at the test's cleanup.
type Server struct {
	// Addr is the server's loopback host:port.
	Addr string
	// Port is Addr's port.
	Port int
	// Password is the server's requirepass ("" for none); Do authenticates
	// with it. Read it only before SetPassword may run (or use URL).
	Password string

	t    testing.TB
	dir  string
	args []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// URL is the server's redis:// URL, with the password when it has one.
func (s *Server) URL() string {
	s.mu.Lock()
	password := s.Password
	s.mu.Unlock()
	if password != "" {
		return "redis://:" + password + "@" + s.Addr
	}
	return "redis://" + s.Addr
}

// require finds bin on PATH, or skips (fails under CI=true) the test.
func require(t testing.TB, bins ...string) {
	t.Helper()
	for _, bin := range bins {
		if _, err := exec.LookPath(bin); err != nil {
			msg := fmt.Sprintf("redistest: %s not found on PATH (%v): "+
				"THIS TEST NEEDS A REAL REDIS; install redis-server (e.g. apt-get install redis-server)", bin, err)
			if os.Getenv("CI") == "true" {
				t.Fatal(msg + " — failing because CI=true")
			}
			t.Skip("SKIPPED: " + msg)
		}
	}
}

// Start starts a standalone redis-server on a free loopback port, with no
// persistence (--save "" --appendonly no) in t.TempDir(), waits until it
// answers PING, and stops it at t's cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	require(t, "redis-server")
	return start(t, nil)
}

// StartWithArgs is Start with extra redis-server arguments after the
// defaults, which they override: "--appendonly", "yes" makes a server whose
// data survives Kill and Restart (its files stay in its directory).
func StartWithArgs(t testing.TB, args ...string) *Server {
	t.Helper()
	require(t, "redis-server")
	return startOpts(t, append([]string{}, args...), "")
}

// StartWithPassword is Start with requirepass set to password: clients must
// authenticate (AUTH password, or redis://:password@host in a URL).
func StartWithPassword(t testing.TB, password string) *Server {
	t.Helper()
	require(t, "redis-server")
	return startOpts(t, nil, password)
}

// StartCluster starts masters cluster-enabled servers, forms a cluster of
// them with redis-cli --cluster create (no replicas), and waits until every
// node reports cluster_state:ok. All are stopped at t's cleanup.
func StartCluster(t testing.TB, masters int) []*Server {
	t.Helper()
	require(t, "redis-server", "redis-cli")
	if masters < 3 {
		t.Fatalf("redistest: a Redis cluster needs at least 3 masters, got %d", masters)
	}
	nodes := make([]*Server, masters)
	addrs := make([]string, masters)
	for i := range nodes {
		nodes[i] = start(t, []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000"})
		addrs[i] = nodes[i].Addr
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.Command("redis-cli", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: redis-cli --cluster create %v: %v\n%s", addrs, err, out)
	}
	deadline := time.Now().Add(startTimeout)
	for _, n := range nodes {
		for {
			info, err := n.Do("CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: cluster node %s not ok after %v: %v %q", n.Addr, startTimeout, err, info)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nodes
}

// start launches one server on a free port, retrying when another process
// takes the port between choosing and binding it.
func start(t testing.TB, extra []string) *Server {
	t.Helper()
	return startOpts(t, extra, "")
}

func startOpts(t testing.TB, extra []string, password string) *Server {
	t.Helper()
	var lastErr error
	for range 5 {
		port, err := freePort(extra != nil)
		if err != nil {
			t.Fatalf("redistest: no free port: %v", err)
		}
		s := &Server{
			Addr:     net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			Port:     port,
			Password: password,
			t:        t,
			dir:      t.TempDir(),
		}
		s.args = append([]string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no",
			"--daemonize", "no", "--protected-mode", "no",
			"--loglevel", "warning",
		}, extra...)
		if password != "" {
			s.args = append(s.args, "--requirepass", password)
		}
		if lastErr = s.launch(); lastErr == nil {
			t.Cleanup(s.stop)
			return s
		}
	}
	t.Fatalf("redistest: starting redis-server: %v", lastErr)
	return nil
}

// freePort returns a loopback port that was free a moment ago; with bus set,
// port+10000 (the cluster bus) was free too.
func freePort(bus bool) (int, error) {
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if port == 6379 || (bus && port+10000 > 65535) {
			continue
		}
		if bus {
			lb, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
			if err != nil {
				continue
			}
			_ = lb.Close()
		}
		return port, nil
	}
	return 0, errors.New("no port pair found in 50 tries")
}

// launch starts the process and waits for PING. Requires the process stopped.
func (s *Server) launch() error {
	cmd := exec.Command("redis-server", s.args...)
	cmd.Dir = s.dir
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("exec redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-done:
			return fmt.Errorf("redis-server on port %d exited at start: %s", s.Port, stderr.Bytes())
		default:
		}
		if r, err := s.Do("PING"); err == nil && r == "PONG" {
			return nil
		}
		if time.Now().After(deadline) {
			s.Kill()
			return fmt.Errorf("redis-server on port %d did not answer PING within %v", s.Port, startTimeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Kill stops the server with SIGKILL, as a crash would, and waits for it to
// exit. Its data is gone unless it was started with persistence (StartWithArgs).
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL) // works on a paused process too
	<-done
}

// Pause stops the server with SIGSTOP: it keeps its connections and data but
// answers nothing, as a hung or partitioned server would, until Resume.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server with SIGCONT.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(sig)
	}
}

// Restart starts the server again on the same port after Kill, empty, and
// waits until it answers PING. It fails the test when it cannot.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	var err error
	for range 20 { // the port may linger briefly after the kill
		if err = s.launch(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("redistest: restarting redis-server on %s: %v", s.Addr, err)
}

func (s *Server) stop() { s.Kill() }

// Do sends one command and returns its reply as text: a simple or bulk
// string, an integer, or the elements of an array joined by newlines. A Redis
// error reply is returned as an error. It opens a fresh connection, so it is
// meant for setup and assertions, not for load.
func (s *Server) Do(args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		return "", fmt.Errorf("redistest: dial %s: %w", s.Addr, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(conn)
	s.mu.Lock()
	password := s.Password
	s.mu.Unlock()
	if password != "" {
		if err := writeCommand(conn, "AUTH", password); err != nil {
			return "", fmt.Errorf("redistest: write to %s: %w", s.Addr, err)
		}
		if _, err := readReply(r); err != nil {
			return "", err
		}
	}
	if err := writeCommand(conn, args...); err != nil {
		return "", fmt.Errorf("redistest: write to %s: %w", s.Addr, err)
	}
	return readReply(r)
}

// SetPassword changes the running server's requirepass (CONFIG SET), and the
// password Do uses.
func (s *Server) SetPassword(password string) error {
	if _, err := s.Do("CONFIG", "SET", "requirepass", password); err != nil {
		return err
	}
	s.mu.Lock()
	s.Password = password
	s.mu.Unlock()
	return nil
}

// writeCommand writes one RESP command.
func writeCommand(w io.Writer, args ...string) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	_, err := w.Write(b.Bytes())
	return err
}

// readReply reads one RESP2 reply.
func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("redistest: read reply: %w", err)
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("redistest: empty reply line")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("redistest: server error: %s", line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", fmt.Errorf("redistest: bad bulk header %q", line)
		}
		if n < 0 {
			return "", nil // a nil bulk string reads as empty
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", fmt.Errorf("redistest: read bulk: %w", err)
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", fmt.Errorf("redistest: bad array header %q", line)
		}
		parts := make([]string, 0, max(n, 0))
		for range n {
			p, err := readReply(r)
			if err != nil {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", fmt.Errorf("redistest: unexpected reply %q", line)
}
