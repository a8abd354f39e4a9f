package grpcapi

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// The budgets of a Server, as the HTTP API's (httpapi) are: what one
// connection, one stream and the streams still receiving their requests may
// hold, and for how long.
//
// The model. A stream costs the server from its HEADERS frame on: its
// metadata (at most MaxHeaderListSize), the request bytes it has sent (at
// most MaxRequestSize once parsed, and at most the flow-control window
// besides, unread), a goroutine blocked reading the rest, and the
// transport's bookkeeping (~16 KiB together, measured: 100,000 half-open
// streams of grpc's defaults took 1.5 GB, about 15 KiB each). A stream that
// never sends the rest of its request holds all that for as long as the
// server waits. So:
//   - no stream waits longer than the read timeout for its request;
//   - streams receiving at once are counted against a memory budget, each
//     at streamMemory, shared fairly between connections (gate): past it a
//     stream takes the place of the oldest stream of a connection holding
//     more, or is refused (RESOURCE_EXHAUSTED) before grpc starts a
//     goroutine for it;
//   - a connection carries at most MaxStreams streams, and at most MaxConns
//     connections are open, each costing its buffers (~100 KiB);
//   - the flow-control windows are fixed at their HTTP/2 minimum instead of
//     grpc's dynamic window, which grows up to 16 MiB per connection;
//   - idle connections are closed, and dead peers found by keepalive pings.
//
// A RateLimitRequest is small (a domain and a few descriptors, a few hundred
// bytes from Envoy). MaxRequestSize is the HTTP API's cap on a check's JSON
// body (httpapi.DefaultMaxBody): gRPC takes the requests /v1/check takes,
// and the same binary request is smaller than its JSON.
const (
	// MaxRequestSize is the largest request message a Server accepts;
	// larger ones get RESOURCE_EXHAUSTED ("grpc: received message larger
	// than max").
	MaxRequestSize = 64 << 10
	// DefaultMaxStreams is Config.MaxStreams's default: HTTP/2's
	// recommended floor (RFC 9113 §6.5.2), what Envoy's own gRPC
	// clients expect.
	DefaultMaxStreams = 100
	// DefaultMaxConns is Config.MaxConns's default: a PoP's Envoys open a
	// connection or a few per worker thread.
	DefaultMaxConns = 1024
	// DefaultReadTimeout is Config.ReadTimeout's default, the HTTP API's.
	DefaultReadTimeout = 10 * time.Second
	// DefaultReceiveMemory is Config.ReceiveMemory's default, the HTTP
	// API's budget for request bodies (httpapi.DefaultMaxBodyMemory).
	DefaultReceiveMemory = 64 << 20

	// windowSize is the flow-control window of a stream and of a
	// connection: grpc's minimum, and at least one whole request.
	windowSize = 64 << 10
	// maxHeaderList bounds a stream's metadata (grpc's default is 16 MiB);
	// Envoy's calls carry a few hundred bytes.
	maxHeaderList = 16 << 10
	// streamMemory is what one stream receiving its request may hold: its
	// request, a window of unread bytes, its metadata, and its goroutine
	// and bookkeeping.
	streamMemory = MaxRequestSize + windowSize + maxHeaderList + 16<<10
)

// ErrReadTimeout is the cause of a stream's cancellation when it has not
// delivered its request within Config.ReadTimeout.
var ErrReadTimeout = errors.New("grpcapi: request not received within the read timeout")

// limitOptions returns the server options that enforce cfg's budgets.
func limitOptions(cfg *Config, g *gate) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxRequestSize),
		grpc.MaxConcurrentStreams(cfg.MaxStreams),
		grpc.MaxHeaderListSize(maxHeaderList),
		grpc.InitialWindowSize(windowSize),
		grpc.InitialConnWindowSize(windowSize),
		// The HTTP/2 preface and settings, like an HTTP request's headers,
		// within the read timeout.
		grpc.ConnectionTimeout(cfg.ReadTimeout),
		grpc.InTapHandle(g.admit),
		grpc.ChainUnaryInterceptor(g.unary),
		grpc.ChainStreamInterceptor(g.stream),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			// As the HTTP API's IdleTimeout: a connection without
			// streams is closed (GOAWAY), and its client reconnects.
			MaxConnectionIdle: 2 * time.Minute,
			// Ping a quiet connection, and close it when the ping goes
			// unanswered: a vanished peer frees its connection slot.
			Time:    time.Minute,
			Timeout: 20 * time.Second,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			// Envoy pings its connections (connection_keepalive) every
			// few seconds to minutes, streams or not; pings more often
			// than this close the connection (GOAWAY too_many_pings).
			MinTime:             5 * time.Second,
			PermitWithoutStream: true,
		}),
	}
}

// gate counts the streams receiving their requests against a budget and
// cancels those that take longer than the read timeout. It is safe for
// concurrent use.
//
// The budget is shared fairly between connections, so that a flood on some
// connections does not starve the others: when it is spent, a new stream
// takes the place of the oldest stream of the connection receiving the most
// (that stream is cut off, ErrEvicted), provided that connection would still
// hold more than the new stream's connection; otherwise the new stream is
// refused (RESOURCE_EXHAUSTED). An Envoy's connection, whose requests arrive
// whole in microseconds, holds one or two places at a time; a connection
// that opens streams and never finishes them holds many, and loses them
// first.
type gate struct {
	max      int // streams receiving at once
	timeout  time.Duration
	refused  func() // counts a stream refused or cut off for the budget; never nil
	timedOut func() // counts a stream cut off by the read timeout; never nil

	mu    sync.Mutex
	n     int                       // streams receiving now
	conns map[*peer.Peer]*connQueue // by connection (grpc gives each its own *peer.Peer)
}

// connQueue is one connection's streams receiving, oldest first.
type connQueue struct {
	key        *peer.Peer
	head, tail *receiving
	n          int
}

// receiving is one admitted stream's place in the gate.
type receiving struct {
	g          *gate
	q          *connQueue
	prev, next *receiving // in q; requires g.mu
	done       atomic.Bool
	timer      *time.Timer
	cancel     context.CancelCauseFunc
	stop       func() bool // unregisters the release on the stream's end
}

type receivingKey struct{}

// ErrEvicted is the cause of a stream's cancellation when a stream of a
// connection holding fewer of the receive budget's places took its place.
var ErrEvicted = errors.New("grpcapi: request still incomplete when the receive budget was needed for another connection's")

// admit is the gate's grpc tap: it runs on a stream's HEADERS, before grpc
// gives the stream a goroutine. It refuses the stream when the budget is
// spent and no connection holds more of it; else it returns the stream's
// context, which ErrReadTimeout cancels unless the request arrives in time,
// and which releases the stream's place when the stream ends, however it
// ends.
func (g *gate) admit(ctx context.Context, _ *tap.Info) (context.Context, error) {
	key, _ := peer.FromContext(ctx)
	ctx, cancel := context.WithCancelCause(ctx)
	r := &receiving{g: g, cancel: cancel}
	g.mu.Lock()
	q := g.conns[key]
	if q == nil {
		q = &connQueue{key: key}
	}
	var victim *receiving
	if g.n >= g.max {
		var most *connQueue
		for _, c := range g.conns {
			if most == nil || c.n > most.n {
				most = c
			}
		}
		if most == nil || most.n <= q.n+1 {
			g.mu.Unlock()
			cancel(nil)
			g.refused()
			return nil, status.Errorf(codes.ResourceExhausted, "grpcapi: %d streams are receiving their requests, all this server's memory budget allows, and this connection holds its share; retry", g.max)
		}
		victim = most.head
		g.unlink(victim)
		victim.done.Store(true)
	}
	if q.n == 0 {
		g.conns[key] = q
	}
	r.q, r.prev = q, q.tail
	if q.tail != nil {
		q.tail.next = r
	} else {
		q.head = r
	}
	q.tail = r
	q.n++
	g.n++
	// Under g.mu, so that an evicting admit finds them set.
	r.timer = time.AfterFunc(g.timeout, r.expire)
	r.stop = context.AfterFunc(ctx, r.release)
	g.mu.Unlock()
	if victim != nil {
		g.refused()
		victim.timer.Stop()
		victim.cancel(ErrEvicted)
	}
	return context.WithValue(ctx, receivingKey{}, r), nil
}

// unlink removes r from its connection's queue and the count. It requires
// g.mu held and r not yet unlinked.
func (g *gate) unlink(r *receiving) {
	q := r.q
	if r.prev != nil {
		r.prev.next = r.next
	} else {
		q.head = r.next
	}
	if r.next != nil {
		r.next.prev = r.prev
	} else {
		q.tail = r.prev
	}
	r.prev, r.next = nil, nil
	q.n--
	if q.n == 0 {
		delete(g.conns, q.key)
	}
	g.n--
}

// expire cuts off a stream whose request is late: its read fails, grpc
// answers CANCELLED and resets the stream.
func (r *receiving) expire() {
	if !r.done.Load() {
		r.g.timedOut()
		r.cancel(ErrReadTimeout)
	}
}

// release gives back the stream's place, once.
func (r *receiving) release() {
	g := r.g
	g.mu.Lock()
	if r.done.Load() { // released, or evicted
		g.mu.Unlock()
		return
	}
	r.done.Store(true)
	g.unlink(r)
	g.mu.Unlock()
	r.timer.Stop()
}

// received marks ctx's stream as having delivered its request.
func received(ctx context.Context) {
	if r, ok := ctx.Value(receivingKey{}).(*receiving); ok {
		r.release()
		r.stop()
	}
}

// unary runs once a unary call's request has arrived.
func (g *gate) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	received(ctx)
	return handler(ctx, req)
}

// stream releases a streaming call (health's Watch) once its first request
// has arrived.
func (g *gate) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, &receivedStream{ServerStream: ss})
}

type receivedStream struct {
	grpc.ServerStream
	once sync.Once
}

func (s *receivedStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil {
		s.once.Do(func() { received(s.Context()) })
	}
	return err
}

// connLimit is a listener that keeps at most max connections open: it closes
// one past the limit as soon as it is accepted, so that its client fails at
// once and tries again (Envoy: another host, or later) rather than waiting
// in the accept queue. It is safe for concurrent use.
type connLimit struct {
	net.Listener
	max     int64
	n       atomic.Int64
	refused func()
}

func (l *connLimit) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.n.Add(1) > l.max {
			l.n.Add(-1)
			l.refused()
			c.Close()
			continue
		}
		return &limitedConn{Conn: c, l: l}, nil
	}
}

// limitedConn gives back its place in its connLimit when closed, once.
type limitedConn struct {
	net.Conn
	l      *connLimit
	closed atomic.Bool
}

func (c *limitedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.l.n.Add(-1)
	}
	return c.Conn.Close()
}
