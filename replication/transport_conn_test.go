package replication

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
)

func TestCheckServerVersion(t *testing.T) {
	for _, c := range []struct {
		version string
		ok      bool
	}{
		{"2.9.10", false}, // Debian bookworm's: sourced batches are rejected
		{"2.10.13", false},
		{"2.10.14", true},
		{"2.10.29", true},
		{"2.11.0-RC.1", true},
		{"v2.15.2", true},
		{"3.0.0", true},
		{"1.99.99", false},
		{"", false},
		{"2.x.1", false},
	} {
		t.Run(c.version, func(t *testing.T) {
			err := CheckServerVersion(c.version)
			if (err == nil) != c.ok {
				t.Fatalf("CheckServerVersion(%q) = %v, want ok=%t", c.version, err, c.ok)
			}
			if err != nil && (!errors.Is(err, ErrServerTooOld) || !strings.Contains(err.Error(), MinServerVersion)) {
				t.Fatalf("error %q does not wrap ErrServerTooOld or name %s", err, MinServerVersion)
			}
		})
	}
}

// fakeServer speaks just enough of the NATS protocol to let a client
// connect, announcing version in its INFO. It returns its URL.
func fakeServer(t *testing.T, version string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprintf(c, `INFO {"server_id":"FAKE","server_name":"fake","version":%q,"proto":1,"max_payload":1048576,"headers":true}`+"\r\n", version)
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if strings.HasPrefix(line, "PING") {
						fmt.Fprint(c, "PONG\r\n")
					}
				}
			}()
		}
	}()
	return "nats://" + ln.Addr().String()
}

// A PoP that reaches a nats-server older than MinServerVersion fails to
// connect with an error naming both versions, instead of replicating by
// snapshots only.
func TestConnectRefusesOldServer(t *testing.T) {
	_, err := Connect(ConnConfig{URL: fakeServer(t, "2.9.10")})
	if !errors.Is(err, ErrServerTooOld) {
		t.Fatalf("Connect to a 2.9.10 server: err = %v, want ErrServerTooOld", err)
	}
	for _, want := range []string{"2.9.10", MinServerVersion} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	nc, err := Connect(ConnConfig{URL: fakeServer(t, "2.10.14")})
	if err != nil {
		t.Fatalf("Connect to a 2.10.14 server: %v", err)
	}
	nc.Close()
}
