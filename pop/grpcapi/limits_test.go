package grpcapi

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// rawConn is an HTTP/2 client on a raw TCP connection that writes frames as
// an attacker would: a stream's HEADERS and the start of its request, and
// never the rest. A goroutine reads what the server sends and reports it on
// frames.
type rawConn struct {
	c      net.Conn
	w      *http2.Framer
	hpack  bytes.Buffer
	enc    *hpack.Encoder
	next   uint32 // the next stream's id
	frames chan frame
	done   chan struct{} // closed when the server's side ends (err holds why)
	err    error
}

// dialRaw opens a connection to addr and sends the client preface and an
// empty SETTINGS frame.
func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rc := &rawConn{c: c, w: http2.NewFramer(c, nil), next: 1, frames: make(chan frame, 1024), done: make(chan struct{})}
	rc.enc = hpack.NewEncoder(&rc.hpack)
	// A write fails when the server has closed the connection already;
	// the reader then reports why.
	if _, err := io.WriteString(c, http2.ClientPreface); err == nil {
		_ = rc.w.WriteSettings()
	}
	go func() {
		defer close(rc.done)
		r := http2.NewFramer(nil, c)
		r.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		for {
			f, err := r.ReadFrame()
			if err != nil {
				rc.err = err
				return
			}
			select {
			case rc.frames <- copyFrame(f):
			default: // nobody is looking: a flood's answers are dropped
			}
		}
	}()
	return rc
}

// halfOpen opens a ShouldRateLimit stream whose request announces a message
// of announce bytes and sends only send of them. It returns the stream's id.
func (rc *rawConn) halfOpen(t *testing.T, announce uint32, send int) uint32 {
	t.Helper()
	id, err := rc.tryHalfOpen(announce, send)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// tryHalfOpen is halfOpen, for goroutines other than the test's.
func (rc *rawConn) tryHalfOpen(announce uint32, send int) (uint32, error) {
	rc.hpack.Reset()
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", shouldRateLimitPath},
		{":authority", "edgelimit"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = rc.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	id := rc.next
	rc.next += 2
	if err := rc.w.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: rc.hpack.Bytes(), EndHeaders: true}); err != nil {
		return 0, err
	}
	data := make([]byte, 5+send) // gRPC's message prefix: uncompressed, length
	binary.BigEndian.PutUint32(data[1:5], announce)
	return id, rc.w.WriteData(id, false, data)
}

// sync sends a PING and waits for its answer: the server has then read
// every frame sent before it.
func (rc *rawConn) sync(t *testing.T) {
	t.Helper()
	if err := rc.trySync(); err != nil {
		t.Fatal(err)
	}
}

// trySync is sync, for goroutines other than the test's.
func (rc *rawConn) trySync() error {
	data := [8]byte{'s', 'y', 'n', 'c'}
	if err := rc.w.WritePing(false, data); err != nil {
		return err
	}
	deadline := time.After(within)
	for {
		select {
		case f := <-rc.frames:
			if f.Type == http2.FramePing && f.Flags.Has(http2.FlagPingAck) && f.ping == data {
				return nil
			}
		case <-rc.done:
			return fmt.Errorf("connection ended before the PING's answer: %v", rc.err)
		case <-deadline:
			return fmt.Errorf("no answer to PING within %v", within)
		}
	}
}

// frame is what a test reads of a frame the server sent: the framer's own
// frames are valid only until it reads the next.
type frame struct {
	http2.FrameHeader
	ping     [8]byte
	settings map[http2.SettingID]uint32
	fields   map[string]string // of HEADERS
}

func copyFrame(f http2.Frame) frame {
	c := frame{FrameHeader: f.Header()}
	switch f := f.(type) {
	case *http2.PingFrame:
		c.ping = f.Data
	case *http2.SettingsFrame:
		c.settings = map[http2.SettingID]uint32{}
		_ = f.ForeachSetting(func(s http2.Setting) error { c.settings[s.ID] = s.Val; return nil })
	case *http2.MetaHeadersFrame:
		c.fields = map[string]string{}
		for _, h := range f.Fields {
			c.fields[h.Name] = h.Value
		}
	}
	return c
}

// grpcStatus is the grpc-status of trailers.
func (f frame) grpcStatus() codes.Code {
	var c codes.Code
	if err := c.UnmarshalJSON([]byte(f.fields["grpc-status"])); err != nil {
		return codes.Unknown
	}
	return c
}

// end waits for the server to end stream id (a RST_STREAM, or trailers with
// END_STREAM) and returns the frame, or fails after within.
func (rc *rawConn) end(t *testing.T, id uint32) frame {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case f := <-rc.frames:
			if f.StreamID != id {
				continue
			}
			switch {
			case f.Type == http2.FrameRSTStream:
				return f
			case f.Type == http2.FrameHeaders && f.Flags.Has(http2.FlagHeadersEndStream):
				return f
			}
		case <-rc.done:
			t.Fatalf("connection ended before stream %d: %v", id, rc.err)
		case <-deadline:
			t.Fatalf("stream %d: the server did not end it within %v", id, within)
		}
	}
}

// liveMemory is the heap and stacks in use after a collection.
func liveMemory() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc + m.StackInuse
}

// TestHalfOpenStreamFlood: 5,000 half-open streams (HEADERS and 1 KiB of an
// announced request of MaxRequestSize bytes, as a probe did with 4 MB) over
// 50 connections hold no more memory than the budgets allow, and a normal
// client's checks keep being answered while they stand. Without the
// budgets every stream held a goroutine and its buffers: 100,000 such
// streams took a PoP from 0.57 to 2.07 GB.
func TestHalfOpenStreamFlood(t *testing.T) {
	const (
		conns   = 50
		streams = 100 // per connection, DefaultMaxStreams
		budget  = 8 << 20
	)
	// The read timeout outlasts the test: the budget alone bounds memory.
	f := start(t, func(c *Config) { c.ReceiveMemory, c.ReadTimeout = budget, within })
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", "normal")}}
	check(t, f, req) // the client's connection is up before the flood

	before := liveMemory()
	rcs := make([]*rawConn, conns)
	var wg sync.WaitGroup
	for i := range rcs {
		rcs[i] = dialRaw(t, f.addr)
		wg.Go(func() {
			for range streams {
				if _, err := rcs[i].tryHalfOpen(MaxRequestSize, 1<<10); err != nil {
					t.Error(err)
					return
				}
			}
			if err := rcs[i].trySync(); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait() // the server has read every stream's HEADERS and DATA
	if t.Failed() {
		t.FailNow()
	}
	during := liveMemory()

	// Checks during the flood.
	lat := make([]time.Duration, 200)
	for i := range lat {
		began := time.Now()
		check(t, f, req)
		lat[i] = time.Since(began)
	}
	slices.Sort(lat)
	during = max(during, liveMemory())
	p99 := lat[len(lat)*99/100]

	// The stated budget: the streams receiving (ReceiveMemory), and each
	// connection's buffers (grpc's 32 KiB read and write buffers, framer,
	// HPACK tables: under 256 KiB), the test's own side included.
	const want = budget + conns*256<<10
	grew := int64(during) - int64(before)
	t.Logf("%d half-open streams over %d connections: live memory %d → %d MiB (+%.1f MiB, budget %.1f MiB); %d checks during the flood: p50 %v, p99 %v, max %v",
		conns*streams, conns, before>>20, during>>20, float64(grew)/(1<<20), float64(want)/(1<<20), len(lat), lat[len(lat)/2], p99, lat[len(lat)-1])
	if n := refusedCount(t, f, "memory"); n == 0 {
		t.Errorf("the flood never reached the receive budget (edgelimit_grpc_refused_total{reason=memory} 0)")
	}
	if grew > want {
		t.Errorf("the flood grew live memory by %.1f MiB, over the budget of %.1f MiB", float64(grew)/(1<<20), float64(want)/(1<<20))
	}
	// A check takes microseconds; a second is what a busy machine may add.
	if p99 > time.Second {
		t.Errorf("checks during the flood: p99 %v, want under 1s", p99)
	}
}

// TestPartialStreamCutOff: a stream that does not deliver its request within
// the read timeout is ended by the server (and counted), no later than the
// timeout and a loaded machine's slack; without the deadline one was held
// for as long as its client kept the connection open.
func TestPartialStreamCutOff(t *testing.T) {
	const timeout = time.Second
	f := start(t, func(c *Config) { c.ReadTimeout = timeout })
	rc := dialRaw(t, f.addr)
	began := time.Now()
	id := rc.halfOpen(t, 100, 10)
	end := rc.end(t, id)
	took := time.Since(began)
	t.Logf("partial stream ended after %v by %v %v", took, end.Type, end.fields)
	if took < timeout*9/10 {
		t.Errorf("stream ended after %v, before the read timeout %v", took, timeout)
	}
	if end.Type == http2.FrameHeaders {
		if got := end.grpcStatus(); got != codes.Canceled {
			t.Errorf("grpc-status %v, want CANCELLED", got)
		}
	}
	if got := refusedCount(t, f, "read_timeout"); got != 1 {
		t.Errorf("edgelimit_grpc_refused_total{reason=read_timeout} = %v, want 1", got)
	}
	// The connection stays usable: a whole request on it is answered.
	rc.sync(t)
}

// TestSilentConnectionClosed: a connection that never sends the HTTP/2
// preface is closed within the read timeout (grpc's own wait is 120 s).
func TestSilentConnectionClosed(t *testing.T) {
	const timeout = time.Second
	f := start(t, func(c *Config) { c.ReadTimeout = timeout })
	c, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	began := time.Now()
	// A loaded machine's slack, well short of grpc's default of 120 s.
	const slack = 30 * time.Second
	_ = c.SetReadDeadline(began.Add(timeout + slack))
	_, err = io.Copy(io.Discard, c) // the server's SETTINGS, then its close
	took := time.Since(began)
	if err != nil {
		t.Fatalf("after %v: %v, want the server to close the connection within the read timeout %v", took, err, timeout)
	}
	t.Logf("silent connection closed after %v", took)
	if took < timeout*9/10 {
		t.Errorf("closed after %v, before the read timeout %v", took, timeout)
	}
}

// TestWatchOutlivesReadTimeout: the read timeout bounds a stream's wait for
// its request, not a streaming call that has it: a health Watch stays open
// past the timeout and still hears a change.
func TestWatchOutlivesReadTimeout(t *testing.T) {
	const timeout = 500 * time.Millisecond
	f := start(t, func(c *Config) { c.ReadTimeout = timeout })
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	watch, err := f.health.Watch(ctx, &healthpb.HealthCheckRequest{Service: ServiceName})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := watch.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first status: %v %v", r, err)
	}
	time.Sleep(3 * timeout) // the subject: the timeout passes
	f.srv.SetServing(false)
	if r, err := watch.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("after %v: %v %v, want NOT_SERVING on the same stream", 3*timeout, r, err)
	}
	if got := refusedCount(t, f, "read_timeout"); got != 0 {
		t.Errorf("edgelimit_grpc_refused_total{reason=read_timeout} = %v, want 0", got)
	}
}

// TestReceiveBudget: a stream past the memory budget is refused with
// RESOURCE_EXHAUSTED, and the place of a stream that ends — here its client
// resets it — is given back.
func TestReceiveBudget(t *testing.T) {
	f := start(t, func(c *Config) { c.ReceiveMemory = streamMemory }) // one stream receiving at once
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", "k")}}
	check(t, f, req)

	rc := dialRaw(t, f.addr)
	id := rc.halfOpen(t, 100, 10)
	rc.sync(t)
	_, err := f.client.ShouldRateLimit(context.Background(), req)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "memory budget") {
		t.Fatalf("a check while the budget is held: %v, want RESOURCE_EXHAUSTED naming the memory budget", err)
	}
	if got := refusedCount(t, f, "memory"); got != 1 {
		t.Errorf("edgelimit_grpc_refused_total{reason=memory} = %v, want 1", got)
	}
	if err := rc.w.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
		t.Fatal(err)
	}
	rc.sync(t)
	// The reset reaches the gate through the stream's context, soon after.
	deadline := time.Now().Add(within)
	for {
		_, err := f.client.ShouldRateLimit(context.Background(), req)
		if err == nil {
			break
		}
		if status.Code(err) != codes.ResourceExhausted || time.Now().After(deadline) {
			t.Fatalf("after the held stream's reset: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReceiveBudgetFair: when the budget is spent, a stream of a connection
// holding none of it takes the place of the oldest stream of the connection
// holding the most, which is cut off.
func TestReceiveBudgetFair(t *testing.T) {
	f := start(t, func(c *Config) { c.ReceiveMemory = 2 * streamMemory })
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", "k")}}
	rc := dialRaw(t, f.addr)
	first := rc.halfOpen(t, 100, 10)
	rc.halfOpen(t, 100, 10)
	rc.sync(t)
	check(t, f, req)
	if end := rc.end(t, first); end.Type == http2.FrameHeaders && end.grpcStatus() != codes.Canceled {
		t.Errorf("evicted stream: %v, want CANCELLED", end.fields)
	}
	// The check is done and its place free: the flooding connection takes
	// it, and then, holding the whole budget, cannot take its own places.
	rc.halfOpen(t, 100, 10)
	fourth := rc.halfOpen(t, 100, 10)
	if end := rc.end(t, fourth); end.Type != http2.FrameHeaders || end.grpcStatus() != codes.ResourceExhausted {
		t.Errorf("a fourth stream on the flooding connection: %v %v, want RESOURCE_EXHAUSTED", end.Type, end.fields)
	}
}

// TestRequestTooLarge: a request over MaxRequestSize is refused at once with
// RESOURCE_EXHAUSTED saying so, before it is read (grpc's default allows 4 MiB).
func TestRequestTooLarge(t *testing.T) {
	f := start(t)
	req := &rlsv3.RateLimitRequest{Domain: strings.Repeat("d", MaxRequestSize)}
	if n := proto.Size(req); n <= MaxRequestSize {
		t.Fatalf("request of %d bytes is not over %d", n, MaxRequestSize)
	}
	_, err := f.client.ShouldRateLimit(context.Background(), req)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "larger than max") {
		t.Fatalf("oversized request: %v, want RESOURCE_EXHAUSTED, larger than max", err)
	}
	// A raw stream announcing 4 MB is refused on its first 5 bytes.
	rc := dialRaw(t, f.addr)
	id := rc.halfOpen(t, 4<<20, 0)
	if end := rc.end(t, id); end.Type != http2.FrameHeaders || end.grpcStatus() != codes.ResourceExhausted {
		t.Errorf("stream announcing 4 MB: %v %v, want trailers with RESOURCE_EXHAUSTED", end.Type, end.fields)
	}
}

// TestConnLimit: the server advertises its stream limit, keeps MaxConns
// connections, closes one past them at once, and takes a new one when a
// place is free again.
func TestConnLimit(t *testing.T) {
	f := start(t, func(c *Config) { c.MaxConns = 2 })                                               // the fixture's client holds one
	if _, err := f.health.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil { // its connection is up
		t.Fatal(err)
	}
	second := dialRaw(t, f.addr)
	settings := func(rc *rawConn) map[http2.SettingID]uint32 {
		t.Helper()
		deadline := time.After(within)
		for {
			select {
			case fr := <-rc.frames:
				if fr.Type == http2.FrameSettings && !fr.Flags.Has(http2.FlagSettingsAck) {
					return fr.settings
				}
			case <-rc.done:
				return nil
			case <-deadline:
				t.Fatalf("neither SETTINGS nor the connection's end within %v", within)
			}
		}
	}
	s := settings(second)
	if s == nil {
		t.Fatalf("second connection closed: %v", second.err)
	}
	if v, ok := s[http2.SettingMaxConcurrentStreams]; !ok || v != DefaultMaxStreams {
		t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS %d (sent: %v), want %d", v, ok, DefaultMaxStreams)
	}
	third := dialRaw(t, f.addr)
	if s := settings(third); s != nil {
		t.Fatal("third connection served, past MaxConns 2")
	}
	if !errors.Is(third.err, io.EOF) && !isReset(third.err) {
		t.Errorf("third connection ended by %v, want EOF or a reset", third.err)
	}
	if got := refusedCount(t, f, "conns"); got != 1 {
		t.Errorf("edgelimit_grpc_refused_total{reason=conns} = %v, want 1", got)
	}
	second.c.Close()
	deadline := time.Now().Add(within)
	for {
		if settings(dialRaw(t, f.addr)) != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no connection taken after one closed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func isReset(err error) bool { return err != nil && strings.Contains(err.Error(), "reset") }

// refusedCount reads edgelimit_grpc_refused_total{reason}.
func refusedCount(t *testing.T, f *fixture, reason string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "edgelimit_grpc_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
