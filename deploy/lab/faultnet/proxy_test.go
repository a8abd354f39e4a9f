package faultnet

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// echoServer accepts connections on loopback and echoes every line back.
func echoServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return l.Addr().String()
}

// roundTrip sends a line through c and reads it back, or fails.
func roundTrip(c net.Conn) (time.Duration, error) {
	start := time.Now()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return 0, err
	}
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

func TestProxy(t *testing.T) {
	p, err := NewProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	live := dial()
	if _, err := roundTrip(live); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	p.Cut()
	if _, err := roundTrip(live); err == nil {
		t.Fatal("a live connection survived the cut")
	}
	if _, err := roundTrip(dial()); err == nil {
		t.Fatal("a new connection got through a cut link")
	}
	p.Heal()
	healed := dial()
	if _, err := roundTrip(healed); err != nil {
		t.Fatalf("after the heal: %v", err)
	}
	p.Delay(50 * time.Millisecond)
	if d, err := roundTrip(healed); err != nil || d < 100*time.Millisecond {
		t.Fatalf("delayed round trip took %v (%v), want at least 2×50ms", d, err)
	}
}

// TestProxyLink checks the link model: a lost chunk arrives one
// retransmission late, jitter never reorders bytes, and bad values are
// refused with the field named.
func TestProxyLink(t *testing.T) {
	p, err := Listen("127.0.0.1:0", echoServer(t), Options{Seed: 7, LocalAddr: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := p.SetLink(Link{Loss: 1, Retransmit: 60 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if d, err := roundTrip(c); err != nil || d < 120*time.Millisecond {
		t.Fatalf("round trip with every chunk lost once took %v (%v), want at least 2×60ms", d, err)
	}
	if err := p.SetLink(Link{Delay: 5 * time.Millisecond, Jitter: 5 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	// Many small writes, each its own chunk with its own jitter: the echo
	// must come back in the order sent.
	c.SetDeadline(time.Now().Add(5 * time.Second))
	go func() {
		for i := range 200 {
			fmt.Fprintf(c, "%d\n", i)
			time.Sleep(100 * time.Microsecond)
		}
	}()
	br := bufio.NewReader(c)
	for i := range 200 {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		if want := fmt.Sprintf("%d\n", i); line != want {
			t.Fatalf("jitter reordered the stream: got %q, want %q", line, want)
		}
	}
	for _, bad := range []Link{{Delay: -1}, {Jitter: -1}, {Loss: 1.5}, {Retransmit: -1}} {
		if err := p.SetLink(bad); err == nil {
			t.Errorf("SetLink(%+v) accepted", bad)
		}
	}
}
