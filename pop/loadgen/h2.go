package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/encoding/protowire"
)

// shouldRateLimitPath is the HTTP/2 path of a ShouldRateLimit call.
const shouldRateLimitPath = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// h2RecvWindow is how much response data a connection lets the server send
// before the generator returns it with a WINDOW_UPDATE: the HTTP/2 default,
// which responses of a few hundred bytes never come near per stream.
const h2RecvWindow = 65535

// runH2 is runGRPC with a lean client: the calls are gRPC messages encoded
// by hand into a reused buffer (renderer) and written as HTTP/2 frames on
// raw connections (golang.org/x/net's framer and HPACK), and an answer is
// read only as far as grpc-status and overall_code. It keeps the
// generator's CPU from hiding the server's, as the HTTP generator's lean
// requests do, where grpc-go's client spends about as much as the server it
// measures.
func runH2(ctx context.Context, t *target) (Report, error) {
	cfg := &t.cfg
	nconns := cfg.grpcConns()
	perConn := uint32((cfg.Concurrency + nconns - 1) / nconns)
	dialer := net.Dialer{Timeout: dialTimeout}
	conns := make([]*h2conn, nconns)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.close(errors.New("loadgen: run over"))
			}
		}
	}()
	for i := range conns {
		c, err := dialH2(ctx, &dialer, t.addr, perConn)
		if err != nil {
			return Report{}, err
		}
		conns[i] = c
	}
	probe, err := GRPCRequest(*cfg, "probe")
	if err != nil {
		return Report{}, err
	}
	probeCtx, cancelProbe := context.WithTimeout(ctx, dialTimeout)
	_, err = conns[0].call(probeCtx, probe)
	cancelProbe()
	if err != nil {
		return Report{}, fmt.Errorf("loadgen: cannot call %s: %w", t.addr, err)
	}

	keys := newKeySet(keySpace(cfg))
	workers := make([]*worker, cfg.Concurrency)
	for i := range workers {
		workers[i] = &worker{req: newRenderer(t, i, keys)}
	}
	calls := make([]func(context.Context) (int, error), len(workers))
	for i, w := range workers {
		c := conns[i%nconns]
		calls[i] = func(ctx context.Context) (int, error) {
			cl, err := c.send(ctx, w.req.render())
			if err != nil {
				return 0, err
			}
			w.req.sent()
			return c.wait(ctx, cl)
		}
	}
	gone := func(i int) bool { return conns[i%nconns].failed() }
	// Wake the calls waiting for a send window when the run ends.
	wake := func() {
		for _, c := range conns {
			c.wmu.Lock()
			c.window.Broadcast()
			c.wmu.Unlock()
		}
	}
	return callLoop(ctx, cfg, workers, keys, calls, gone, wake), nil
}

// h2conn is one HTTP/2 connection carrying many calls. Writes (frames,
// stream ids, the send window) are under wmu; one goroutine reads.
type h2conn struct {
	nc net.Conn

	wmu     sync.Mutex
	bw      *bufio.Writer
	fr      *http2.Framer
	henc    *hpack.Encoder
	hbuf    bytes.Buffer
	nextID  uint32
	sendWin int64      // connection send window (flow control), under wmu
	window  *sync.Cond // signalled when sendWin grows, the connection fails or the run ends
	host    string

	pmu     sync.Mutex
	pending map[uint32]*h2call
	err     error // set once the connection has failed, under pmu
}

// h2call is one call in flight; done receives its outcome once.
type h2call struct {
	data   []byte // the response message, prefix included
	status string // grpc-status
	msg    string // grpc-message
	done   chan error
}

// dialH2 connects, exchanges the connection preface and settings, and
// starts the reader. It fails when the server admits fewer than streams
// calls in flight on a connection.
func dialH2(ctx context.Context, d *net.Dialer, addr string, streams uint32) (*h2conn, error) {
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("loadgen: cannot connect to %s: %w", addr, err)
	}
	c := &h2conn{nc: nc, bw: bufio.NewWriterSize(nc, 16<<10), nextID: 1, sendWin: 65535, host: addr, pending: map[uint32]*h2call{}}
	c.window = sync.NewCond(&c.wmu)
	c.fr = http2.NewFramer(c.bw, bufio.NewReaderSize(nc, 64<<10))
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.henc = hpack.NewEncoder(&c.hbuf)
	if _, err := c.bw.WriteString(http2.ClientPreface); err == nil {
		err = c.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 0})
		if err == nil {
			err = c.bw.Flush()
		}
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("loadgen: %s: %w", addr, err)
	}
	// The server's first frame is its SETTINGS.
	nc.SetReadDeadline(time.Now().Add(dialTimeout))
	f, err := c.fr.ReadFrame()
	nc.SetReadDeadline(time.Time{})
	sf, ok := f.(*http2.SettingsFrame)
	if err != nil || !ok || sf.IsAck() {
		nc.Close()
		return nil, fmt.Errorf("loadgen: %s: no HTTP/2 SETTINGS from the server (%v): is it a gRPC endpoint?", addr, err)
	}
	if max, ok := sf.Value(http2.SettingMaxConcurrentStreams); ok && max < streams {
		nc.Close()
		return nil, fmt.Errorf("loadgen: %s admits %d streams on a connection, %d are asked: use more connections", addr, max, streams)
	}
	if w, ok := sf.Value(http2.SettingInitialWindowSize); ok && w < 1<<10 {
		nc.Close()
		return nil, fmt.Errorf("loadgen: %s: a stream window of %d bytes is too small for a request", addr, w)
	}
	if err := c.write(func() error { return c.fr.WriteSettingsAck() }); err != nil {
		nc.Close()
		return nil, err
	}
	go c.read()
	return c, nil
}

// write runs fn, a frame write, under wmu and flushes.
func (c *h2conn) write(fn func() error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := fn(); err != nil {
		return err
	}
	return c.bw.Flush()
}

// call sends body, a gRPC message, as a ShouldRateLimit call and waits for
// its answer or ctx. It returns 200 for OK and 429 for OVER_LIMIT.
func (c *h2conn) call(ctx context.Context, body []byte) (int, error) {
	cl, err := c.send(ctx, body)
	if err != nil {
		return 0, err
	}
	return c.wait(ctx, cl)
}

// send writes body, a gRPC message, as a ShouldRateLimit call, once the
// connection's send window has room for it. When it returns, body has been
// copied out and may be reused; the call's answer is for wait.
func (c *h2conn) send(ctx context.Context, body []byte) (*h2call, error) {
	cl := &h2call{done: make(chan error, 1)}
	c.wmu.Lock()
	for c.sendWin < int64(len(body)) && !c.failed() {
		if err := ctx.Err(); err != nil {
			c.wmu.Unlock()
			return nil, err
		}
		c.window.Wait()
	}
	id := c.nextID
	c.nextID += 2
	c.pmu.Lock()
	err := c.err
	if err == nil && id > 1<<31-1 {
		err = errors.New("loadgen: stream ids exhausted on a connection")
	}
	if err == nil {
		c.pending[id] = cl
	}
	c.pmu.Unlock()
	if err == nil {
		c.hbuf.Reset()
		for _, f := range [...]hpack.HeaderField{
			{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
			{Name: ":path", Value: shouldRateLimitPath}, {Name: ":authority", Value: c.host},
			{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
		} {
			c.henc.WriteField(f)
		}
		err = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true})
		if err == nil {
			err = c.fr.WriteData(id, true, body)
		}
		if err == nil {
			c.sendWin -= int64(len(body))
			err = c.bw.Flush()
		}
	}
	c.wmu.Unlock()
	if err != nil {
		c.close(err)
		return nil, err
	}
	return cl, nil
}

// wait waits for the answer of a call sent, or ctx. It returns 200 for OK
// and 429 for OVER_LIMIT.
func (c *h2conn) wait(ctx context.Context, cl *h2call) (int, error) {
	var err error
	select {
	case err = <-cl.done:
	case <-ctx.Done():
		return 0, ctx.Err() // the answer, if any, is dropped by the reader
	}
	if err != nil {
		return 0, err
	}
	if cl.status != "0" {
		return 0, fmt.Errorf("loadgen: grpc-status %q: %s", cl.status, cl.msg)
	}
	return overallStatus(cl.data)
}

// overallStatus reads overall_code from a response message: 200 for OK, 429
// for OVER_LIMIT.
func overallStatus(data []byte) (int, error) {
	if len(data) < 5 || data[0] != 0 || int(uint32(data[1])<<24|uint32(data[2])<<16|uint32(data[3])<<8|uint32(data[4])) != len(data)-5 {
		return 0, fmt.Errorf("loadgen: answer of %d bytes is not one uncompressed gRPC message", len(data))
	}
	b := data[5:]
	code := uint64(0) // UNKNOWN when absent
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, protowire.ParseError(n)
			}
			code, b = v, b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		b = b[n:]
	}
	switch code {
	case 1: // OK
		return 200, nil
	case 2: // OVER_LIMIT
		return 429, nil
	}
	return 0, fmt.Errorf("loadgen: overall_code %d", code)
}

// read reads frames until the connection fails, completing calls.
func (c *h2conn) read() {
	var unacked uint32 // response data not yet returned to the server's window
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.close(err)
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				err = c.write(func() error { return c.fr.WriteSettingsAck() })
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				err = c.write(func() error { return c.fr.WritePing(true, f.Data) })
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				c.wmu.Lock()
				c.sendWin += int64(f.Increment)
				c.window.Broadcast()
				c.wmu.Unlock()
			}
		case *http2.MetaHeadersFrame:
			bad := f.PseudoValue("status")
			if bad == "200" {
				bad = ""
			}
			if cl := c.lookup(f.StreamID, f.StreamEnded() || bad != ""); cl != nil {
				if bad != "" {
					cl.done <- fmt.Errorf("loadgen: HTTP status %s", bad)
					break
				}
				for _, h := range f.RegularFields() {
					switch h.Name {
					case "grpc-status":
						cl.status = h.Value
					case "grpc-message":
						cl.msg = h.Value
					}
				}
				if f.StreamEnded() {
					cl.done <- nil
				}
			}
		case *http2.DataFrame:
			if n := f.Length; n > 0 {
				if unacked += n; unacked >= h2RecvWindow/4 {
					u := unacked
					unacked = 0
					err = c.write(func() error { return c.fr.WriteWindowUpdate(0, u) })
				}
			}
			if cl := c.lookup(f.StreamID, f.StreamEnded()); cl != nil {
				cl.data = append(cl.data, f.Data()...)
				if f.StreamEnded() {
					cl.done <- errors.New("loadgen: stream ended without trailers")
				}
			}
		case *http2.RSTStreamFrame:
			if cl := c.lookup(f.StreamID, true); cl != nil {
				cl.done <- fmt.Errorf("loadgen: stream reset: %v", f.ErrCode)
			}
		case *http2.GoAwayFrame:
			err = fmt.Errorf("loadgen: server sent GOAWAY %v", f.ErrCode)
		}
		if err != nil {
			c.close(err)
			return
		}
	}
}

// lookup returns the call of stream id (nil when there is none, as for a
// call given up at the end of the run), forgetting it when done is set: a
// call's outcome is sent once, by whoever removes it from pending.
func (c *h2conn) lookup(id uint32, done bool) *h2call {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	cl := c.pending[id]
	if done {
		delete(c.pending, id)
	}
	return cl
}

func (c *h2conn) failed() bool {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	return c.err != nil
}

// close fails the connection and every call in flight on it, once.
func (c *h2conn) close(err error) {
	c.pmu.Lock()
	if c.err != nil {
		c.pmu.Unlock()
		return
	}
	c.err = err
	for id, cl := range c.pending {
		cl.done <- err
		delete(c.pending, id)
	}
	c.pmu.Unlock()
	c.nc.Close()
	c.wmu.Lock()
	c.window.Broadcast()
	c.wmu.Unlock()
}
