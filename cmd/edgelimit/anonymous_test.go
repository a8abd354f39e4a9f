package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// TestEmbeddedNATSAnonymous: a replicating PoP started with the defaults (an
// embedded NATS server, no credentials) gives an anonymous client no way
// into replication: none of the TCP ports the process listens on lets a NATS
// client connect. With --nats-allow-anonymous, the layout that says it needs
// an open port, the same search finds one and an anonymous client connects
// and publishes, which is what every default PoP allowed before.
func TestEmbeddedNATSAnonymous(t *testing.T) {
	if _, err := os.Stat("/proc/self/net/tcp"); err != nil {
		t.Skipf("needs /proc/<pid>/net/tcp to list a process's listening ports: %v", err)
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rules, []byte(durableRules), 0o644); err != nil {
		t.Fatal(err)
	}
	start := func(name string, extra ...string) (addr string, ports []int) {
		addr = freeAddr(t)
		p := startPoP(t, bin, append([]string{"--listen", addr, "--rules", rules, "--data", filepath.Join(dir, name),
			"--region", "eu", "--pop", "a", "--log-level", "warn"}, extra...)...)
		// Ready means the PoP reads its stream: it reached its server.
		if got := admittedOf(t, addr, "global", 6); got != 5 {
			t.Fatalf("%s: admitted %d of a global limit of 5", name, got)
		}
		return addr, listeningPorts(t, p.Process.Pid)
	}

	addr, ports := start("default")
	t.Logf("default PoP listens on %v (HTTP on %s)", ports, addr)
	if len(ports) == 0 {
		t.Fatal("found no listening port of the PoP; its HTTP port at least should be there")
	}
	for _, port := range ports {
		if fmt.Sprint(port) == strings.Split(addr, ":")[1] {
			continue
		}
		nc, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", port), nats.Timeout(3*time.Second), nats.NoReconnect())
		if err == nil {
			nc.Close()
			t.Fatalf("an anonymous NATS client connected to port %d of a PoP with default settings (ports %v): it may publish any PoP's counts", port, ports)
		}
		t.Logf("port %d: %v", port, err)
	}

	addr, ports = start("anonymous", "--nats-allow-anonymous")
	connected := false
	for _, port := range ports {
		if fmt.Sprint(port) == strings.Split(addr, ":")[1] {
			continue
		}
		nc, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", port), nats.Timeout(3*time.Second), nats.NoReconnect())
		if err != nil {
			continue
		}
		if err := nc.Publish("edgelimit.eu.delta.a", []byte("x")); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatalf("flush: %v", err)
		}
		nc.Close()
		connected = true
	}
	if !connected {
		t.Fatalf("with --nats-allow-anonymous no port of the PoP (%v) took an anonymous client: the search above would miss an open port", ports)
	}
}

// listeningPorts returns the TCP ports the process pid listens on: its
// sockets (/proc/pid/fd) matched against the listening sockets of its
// network namespace (/proc/pid/net/tcp and tcp6).
func listeningPorts(t *testing.T, pid int) []int {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	var ports []int
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[3] != "0A" || !inodes[fields[9]] { // 0A: LISTEN
				continue
			}
			_, hexPort, _ := strings.Cut(fields[1], ":")
			port, err := strconv.ParseInt(hexPort, 16, 32)
			if err != nil {
				t.Fatalf("%s: %q: %v", table, fields[1], err)
			}
			ports = append(ports, int(port))
		}
		f.Close()
	}
	return ports
}
