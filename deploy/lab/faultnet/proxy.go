// Package faultnet is a fault-injecting TCP relay: every connection accepted
// on its address is relayed to a target, through a link that can be cut,
// healed, delayed, jittered and made lossy. Tests use it between embedded
// NATS servers (replication/natstest), and deploy/lab puts one on every link
// between regions of its network-namespace sites, because the kernel there
// has no netem qdisc.
//
// A relay works on TCP, not on packets: what it delays is a chunk of bytes
// as it was read, and it keeps each direction's bytes in order. Loss is
// modelled as TCP sees it — a lost segment is retransmitted, so the chunk
// (and everything behind it) arrives late by one retransmission timeout —
// never as missing bytes.
//
// It imports only the standard library.
package faultnet

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// Link describes what a Proxy does to the bytes it relays, each direction on
// its own. The zero Link relays at once.
type Link struct {
	// Delay is the one-way delay added to every chunk.
	Delay time.Duration
	// Jitter adds a uniform offset in [-Jitter, +Jitter] to Delay, never
	// making the total negative. Chunks still arrive in order: a chunk is
	// never delivered before the one read before it.
	Jitter time.Duration
	// Loss is the probability in [0, 1] that a chunk is "lost" once and
	// retransmitted: it arrives Retransmit later.
	Loss float64
	// Retransmit is the extra delay of a lost chunk; default 200ms, Linux's
	// least retransmission timeout.
	Retransmit time.Duration
}

// DefaultRetransmit is Link.Retransmit's default.
const DefaultRetransmit = 200 * time.Millisecond

// Validate reports a Link whose values are out of range, naming the field.
func (l Link) Validate() error {
	switch {
	case l.Delay < 0:
		return fmt.Errorf("faultnet: Delay must be ≥ 0, got %v", l.Delay)
	case l.Jitter < 0:
		return fmt.Errorf("faultnet: Jitter must be ≥ 0, got %v", l.Jitter)
	case !(l.Loss >= 0 && l.Loss <= 1):
		return fmt.Errorf("faultnet: Loss must be in [0, 1], got %v", l.Loss)
	case l.Retransmit < 0:
		return fmt.Errorf("faultnet: Retransmit must be ≥ 0, got %v", l.Retransmit)
	}
	return nil
}

// Proxy is a fault-injecting TCP relay: every connection accepted on Addr is
// relayed to a target address. Cut closes every live connection and refuses
// new ones (accepts and closes them at once) until Heal; SetLink delays,
// jitters and loses chunks of relayed bytes. A Proxy is safe for concurrent
// use.
type Proxy struct {
	ln     net.Listener
	target string
	dialer net.Dialer

	mu     sync.Mutex
	cut    bool
	link   Link
	rng    *rand.Rand // requires mu held
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewProxy listens on a free loopback port and relays to target.
func NewProxy(target string) (*Proxy, error) { return Listen("127.0.0.1:0", target, Options{}) }

// Options are a Proxy's settings that cannot change once it runs.
type Options struct {
	// Seed seeds the random source of jitter and loss, so that a run can be
	// replayed.
	Seed uint64
	// LocalAddr, when set, is the IP address the proxy dials the target
	// from, choosing the network path to it.
	LocalAddr string
}

// Listen listens on addr and relays to target.
func Listen(addr, target string, opt Options) (*Proxy, error) {
	p := &Proxy{target: target, conns: make(map[net.Conn]struct{}),
		rng: rand.New(rand.NewPCG(opt.Seed, 0x6c62272e07bb0142)), dialer: net.Dialer{Timeout: time.Second}}
	if opt.LocalAddr != "" {
		ip := net.ParseIP(opt.LocalAddr)
		if ip == nil {
			return nil, fmt.Errorf("faultnet: LocalAddr %q is not an IP address", opt.LocalAddr)
		}
		p.dialer.LocalAddr = &net.TCPAddr{IP: ip}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("faultnet: proxy listen on %s: %w", addr, err)
	}
	p.ln = ln
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the proxy's listen address, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every live connection and refuses new ones until Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
}

// Heal lets new connections through again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Delay makes the proxy hold every chunk it relays for d (0 for none), with
// no jitter or loss.
func (p *Proxy) Delay(d time.Duration) { _ = p.SetLink(Link{Delay: d}) }

// SetLink sets what the proxy does to the chunks it reads from now on; an
// invalid link is refused and the old one stays.
func (p *Proxy) SetLink(l Link) error {
	if err := l.Validate(); err != nil {
		return err
	}
	if l.Retransmit == 0 {
		l.Retransmit = DefaultRetransmit
	}
	p.mu.Lock()
	p.link = l
	p.mu.Unlock()
	return nil
}

// Close stops the proxy, closes every connection and waits for its
// goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p.mu.Lock()
		refuse := p.cut || p.closed
		p.mu.Unlock()
		if refuse {
			in.Close()
			continue
		}
		p.wg.Add(1)
		go p.relay(in)
	}
}

// relay connects in to the target and copies both ways until either side
// closes or the proxy cuts them.
func (p *Proxy) relay(in net.Conn) {
	defer p.wg.Done()
	out, err := p.dialer.Dial("tcp", p.target)
	if err != nil {
		in.Close()
		return
	}
	if !p.track(in, out) {
		in.Close()
		out.Close()
		return
	}
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		p.copy(dst, src)
		// Either direction ending ends the connection, as a cut link does.
		dst.Close()
		src.Close()
	}
	go pipe(out, in)
	go pipe(in, out)
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, in)
	delete(p.conns, out)
	p.mu.Unlock()
}

// track records a live connection pair, unless the link was cut or the
// proxy closed in the meantime.
func (p *Proxy) track(in, out net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut || p.closed {
		return false
	}
	p.conns[in] = struct{}{}
	p.conns[out] = struct{}{}
	return true
}

// chunk is bytes read from one side, due at the other at due.
type chunk struct {
	b   []byte
	due time.Time
}

// copy relays src to dst through the link: a reader stamps each chunk with
// its due time, a writer delivers it then. Chunks wait in a bounded queue,
// so a slow link pushes back on the sender as a full TCP window does.
func (p *Proxy) copy(dst, src net.Conn) {
	q := make(chan chunk, 256)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range q {
			if d := time.Until(c.due); d > 0 {
				time.Sleep(d)
			}
			if _, err := dst.Write(c.b); err != nil {
				src.Close() // stop the reader too
				for range q {
				}
				return
			}
		}
	}()
	var last time.Time
	for {
		buf := make([]byte, 32<<10)
		n, err := src.Read(buf)
		if n > 0 {
			due := time.Now().Add(p.hold())
			if due.Before(last) {
				due = last // in order, as TCP delivers
			}
			last = due
			q <- chunk{b: buf[:n], due: due}
		}
		if err != nil {
			break // EOF, or the connection was closed by a cut
		}
	}
	close(q)
	<-done
}

// hold draws how long the next chunk is held: the link's delay, jitter, and
// a retransmission when it is "lost".
func (p *Proxy) hold() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.link
	d := l.Delay
	if l.Jitter > 0 {
		d += time.Duration(p.rng.Int64N(int64(2*l.Jitter)+1)) - l.Jitter
	}
	if l.Loss > 0 && p.rng.Float64() < l.Loss {
		d += l.Retransmit
	}
	return max(d, 0)
}
