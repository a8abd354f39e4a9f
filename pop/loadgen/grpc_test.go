package loadgen

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// rlsServer is a deterministic stand-in for a PoP's gRPC service:
// OVER_LIMIT for values k0..k9, OK otherwise. It records the values it saw
// (the run's probe apart) and the answers it gave.
type rlsServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	mu     sync.Mutex
	values map[string]int
	status map[int]int64
	bad    int
}

func (s *rlsServer) ShouldRateLimit(_ context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ds := in.GetDescriptors()
	if in.GetDomain() == "refused" {
		return nil, status.Error(codes.PermissionDenied, "refused domain")
	}
	if in.GetDomain() != "edge" || in.GetHitsAddend() != 1 || len(ds) != 1 || len(ds[0].GetEntries()) != 1 || ds[0].GetEntries()[0].GetKey() != "api_key" {
		s.bad++
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
	}
	v := ds[0].GetEntries()[0].GetValue()
	if v == "probe" {
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
	}
	s.values[v]++
	if len(v) == 2 && v[0] == 'k' {
		s.status[429]++
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}, nil
	}
	s.status[200]++
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

func startRLS(t *testing.T) (*rlsServer, *countingListener) {
	t.Helper()
	s, cl, _ := startRLSServer(t)
	return s, cl
}

func startRLSServer(t *testing.T) (*rlsServer, *countingListener, *grpc.Server) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	s := &rlsServer{values: map[string]int{}, status: map[int]int64{}}
	srv := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(srv, s)
	go func() { _ = srv.Serve(cl) }()
	t.Cleanup(srv.Stop)
	return s, cl, srv
}

// TestRunGRPC: with either client, every call is counted once with the
// answer the server gave, the values follow the distribution, and the
// workers' calls share GRPCConns connections (one each when it is 0).
func TestRunGRPC(t *testing.T) {
	for _, raw := range []bool{false, true} {
		for _, tc := range []struct{ conns, wantConns int }{{0, 8}, {1, 1}, {3, 3}} {
			t.Run(fmt.Sprintf("raw=%v/conns=%d", raw, tc.conns), func(t *testing.T) {
				s, ln := startRLS(t)
				rep := runBounded(t, Config{GRPC: ln.Addr().String(), RawGRPC: raw, GRPCConns: tc.conns, Concurrency: 8, Requests: 1500, Dist: Uniform, Keys: 50, Seed: 3})
				s.mu.Lock()
				defer s.mu.Unlock()
				if rep.Requests != 1500 || rep.Decisions != 1500 || rep.Errors != 0 {
					t.Errorf("Requests %d, Decisions %d, Errors %d (%s); want 1500, 1500, 0", rep.Requests, rep.Decisions, rep.Errors, rep.LastError)
				}
				if fmt.Sprint(rep.Status) != fmt.Sprint(s.status) || s.bad != 0 {
					t.Errorf("status mix %v, server answered %v (%d malformed requests)", rep.Status, s.status, s.bad)
				}
				if s.status[429] < 150 || s.status[429] > 450 { // 10 of 50 values → ~300
					t.Errorf("OVER_LIMIT answers %d, want ~300", s.status[429])
				}
				if len(s.values) < 48 || len(s.values) > 50 || rep.DistinctKeys != int64(len(s.values)) || rep.KeySpace != 50 {
					t.Errorf("%d distinct values, want close to 50; report: %d distinct of %d", len(s.values), rep.DistinctKeys, rep.KeySpace)
				}
				if n := ln.n.Load(); n != int64(tc.wantConns) {
					t.Errorf("server accepted %d connections, want %d", n, tc.wantConns)
				}
			})
		}
	}
}

// TestRunGRPCTimed: a run that ends by its duration counts only answered
// calls, and no call cut off by the end as an error; the server answered at
// most one more call per worker than were counted.
func TestRunGRPCTimed(t *testing.T) {
	for _, raw := range []bool{false, true} {
		t.Run(fmt.Sprintf("raw=%v", raw), func(t *testing.T) {
			s, ln := startRLS(t)
			rep, err := Run(context.Background(), Config{GRPC: ln.Addr().String(), RawGRPC: raw, GRPCConns: 2, Concurrency: 8, Duration: 300 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			served := s.status[200] + s.status[429]
			if rep.Errors != 0 || rep.Requests == 0 || served < rep.Requests || served > rep.Requests+8 {
				t.Errorf("counted %d calls with %d errors (%s); the server answered %d", rep.Requests, rep.Errors, rep.LastError, served)
			}
		})
	}
}

// TestRunGRPCRawServerGone: when the server goes away mid-run, the raw
// client's calls fail and its workers stop (it does not redial): the run
// ends early with the calls answered before and the failures counted.
func TestRunGRPCRawServerGone(t *testing.T) {
	s, ln, srv := startRLSServer(t)
	time.AfterFunc(200*time.Millisecond, srv.Stop)
	start := time.Now()
	rep, err := Run(context.Background(), Config{GRPC: ln.Addr().String(), RawGRPC: true, GRPCConns: 2, Concurrency: 8, Duration: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("run took %v after the server stopped at 200ms", d)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	served := s.status[200] + s.status[429]
	if rep.Requests == 0 || rep.Requests > served || rep.Errors == 0 || rep.Errors > 8 || rep.LastError == "" {
		t.Errorf("counted %d calls (server answered %d), %d errors (%q); want some calls and 1..8 errors", rep.Requests, served, rep.Errors, rep.LastError)
	}
}

// TestRunGRPCRefused: a call the server answers with an error status fails
// the run's first call, with either client.
func TestRunGRPCRefused(t *testing.T) {
	for _, raw := range []bool{false, true} {
		_, ln := startRLS(t)
		_, err := Run(context.Background(), Config{GRPC: ln.Addr().String(), RawGRPC: raw, Domain: "refused", Concurrency: 2, Requests: 10})
		if err == nil || !strings.Contains(err.Error(), "refused domain") {
			t.Errorf("raw=%v: Run error %v, want the server's refusal", raw, err)
		}
	}
}

// TestGRPCRequest: the frame GRPCRequest writes, posted over plain HTTP/2
// as h2load posts it, is a call the gRPC server answers with grpc-status 0
// and a RateLimitResponse, and it names the value and the default domain
// and key.
func TestGRPCRequest(t *testing.T) {
	s, ln := startRLS(t)
	body, err := GRPCRequest(Config{}, "k7")
	if err != nil {
		t.Fatal(err)
	}
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	c := &http.Client{Transport: &http.Transport{Protocols: &p}}
	req, err := http.NewRequest("POST", "http://"+ln.Addr().String()+"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.ProtoMajor != 2 || resp.StatusCode != 200 || resp.Trailer.Get("Grpc-Status") != "0" {
		t.Fatalf("HTTP/%d %d, trailers %v", resp.ProtoMajor, resp.StatusCode, resp.Trailer)
	}
	var answer rlsv3.RateLimitResponse
	if len(out) < 5 || int(binary.BigEndian.Uint32(out[1:5])) != len(out)-5 {
		t.Fatalf("response %x is not one gRPC message", out)
	}
	if err := proto.Unmarshal(out[5:], &answer); err != nil || answer.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("answer %v (%v), want OVER_LIMIT for k7", &answer, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bad != 0 || s.values["k7"] != 1 {
		t.Fatalf("server saw %v and %d malformed requests, want k7 once", s.values, s.bad)
	}
	if _, err := GRPCRequest(Config{Batch: 3}, "x"); err == nil {
		t.Error("GRPCRequest with Batch 3: no error")
	}
}

// TestRunGRPCRawFlowControl: against a server that answers every call but
// never returns send window (no WINDOW_UPDATE), the raw client stops
// sending once the connection's 65,535-byte window is spent, and the run
// still ends on time.
func TestRunGRPCRawFlowControl(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var received atomic.Int64 // request body bytes
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		preface := make([]byte, len(http2.ClientPreface))
		if _, err := io.ReadFull(nc, preface); err != nil {
			return
		}
		fr := http2.NewFramer(nc, nc)
		fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		if fr.WriteSettings() != nil {
			return
		}
		var hbuf bytes.Buffer
		enc := hpack.NewEncoder(&hbuf)
		answer, _ := proto.Marshal(&rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK})
		msg := append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(answer))), answer...)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			d, ok := f.(*http2.DataFrame)
			if !ok || !d.StreamEnded() {
				continue
			}
			received.Add(int64(len(d.Data())))
			hbuf.Reset()
			enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: d.StreamID, BlockFragment: hbuf.Bytes(), EndHeaders: true})
			fr.WriteData(d.StreamID, false, msg)
			hbuf.Reset()
			enc.WriteField(hpack.HeaderField{Name: "grpc-status", Value: "0"})
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: d.StreamID, BlockFragment: hbuf.Bytes(), EndHeaders: true, EndStream: true})
		}
	}()
	start := time.Now()
	rep, err := Run(context.Background(), Config{GRPC: ln.Addr().String(), RawGRPC: true, GRPCConns: 1, Concurrency: 4, Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("run took %v, want about its 1s", d)
	}
	body, _ := GRPCRequest(Config{}, "hot")
	if n := received.Load(); n > 65535 || n < 65535-int64(len(body)) {
		t.Errorf("server received %d body bytes, want the window of 65535 spent and not exceeded", n)
	}
	if rep.Errors != 0 || rep.Requests < 65535/int64(len(body))-5 {
		t.Errorf("counted %d calls and %d errors (%s)", rep.Requests, rep.Errors, rep.LastError)
	}
}
