package pgtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
)

// Cluster is a private PostgreSQL server a test may stop and start again
// (initdb and pg_ctl from the machine's PostgreSQL binaries), on a free
// loopback port, removed when the test ends — for tests of a PostgreSQL
// outage, which must never stop the machine's own server.
type Cluster struct {
	t       testing.TB
	bin     string
	dir     string
	Port    int
	running bool
	asUser  string
}

// binDir finds the PostgreSQL server binaries.
func binDir() string {
	if d := os.Getenv("PG_BIN"); d != "" {
		return d
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if len(matches) == 0 {
		return ""
	}
	return filepath.Dir(matches[len(matches)-1])
}

// NewCluster initializes and starts a cluster. Without the binaries it
// fails under CI=true and skips otherwise.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	bin := binDir()
	if bin == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("PostgreSQL server binaries (initdb, pg_ctl) not found under /usr/lib/postgresql/*/bin; set PG_BIN")
		}
		t.Skip("PostgreSQL server binaries (initdb, pg_ctl) not found; set PG_BIN to run this test")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	// The directory is outside t.TempDir: as root, the server runs as the
	// postgres user, who must reach it.
	dir, err := os.MkdirTemp("", "edgelimit-pg-*")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c := &Cluster{t: t, bin: bin, dir: filepath.Join(dir, "data"), Port: port}
	if os.Geteuid() == 0 { // initdb and postgres refuse to run as root
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Skip("running as root without a postgres user to run a private PostgreSQL server as")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		c.asUser = "postgres"
	}
	if out, err := c.command("initdb", "-D", c.dir, "-U", "postgres", "-A", "trust", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	c.Start()
	t.Cleanup(c.Stop)
	return c
}

// command runs a PostgreSQL binary, as the postgres user when we are root.
func (c *Cluster) command(name string, args ...string) *exec.Cmd {
	path := filepath.Join(c.bin, name)
	if c.asUser != "" {
		return exec.Command("runuser", append([]string{"-u", c.asUser, "--", path}, args...)...)
	}
	return exec.Command(path, args...)
}

// URL is the URL of database db on the cluster.
func (c *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable&connect_timeout=2", c.Port, db)
}

// Start starts the server and waits until it accepts connections.
func (c *Cluster) Start() {
	c.t.Helper()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", c.Port, c.dir)
	if out, err := c.command("pg_ctl", "-D", c.dir, "-o", opts, "-l", filepath.Join(c.dir, "log"), "-w", "start").CombinedOutput(); err != nil {
		c.t.Fatalf("pg_ctl start: %v\n%s", err, out)
	}
	c.running = true
}

// Stop stops the server (fast shutdown: connections are cut).
func (c *Cluster) Stop() {
	if !c.running {
		return
	}
	if out, err := c.command("pg_ctl", "-D", c.dir, "-m", "fast", "-w", "stop").CombinedOutput(); err != nil {
		c.t.Errorf("pg_ctl stop: %v\n%s", err, out)
	}
	c.running = false
}
