package loadgen

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// runGRPC is Run against a gRPC rate limit service: each worker has one
// ShouldRateLimit call in flight, with the value distribution of the HTTP
// runs, on connection i mod GRPCConns (its own when GRPCConns is 0). Status
// counts the answers as HTTP would: 200 for OK, 429 for OVER_LIMIT.
func runGRPC(ctx context.Context, t *target) (Report, error) {
	cfg := &t.cfg
	workers := make([]*worker, cfg.Concurrency)
	nconns := cfg.grpcConns()
	conns := make([]*grpc.ClientConn, nconns)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	for i := range conns {
		c, err := grpc.NewClient(t.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return Report{}, fmt.Errorf("loadgen: %s: %w", t.addr, err)
		}
		conns[i] = c
	}
	for i := range workers {
		workers[i] = &worker{}
	}
	probe, cancelProbe := context.WithTimeout(ctx, dialTimeout)
	_, err := rlsv3.NewRateLimitServiceClient(conns[0]).ShouldRateLimit(probe, request(cfg, "probe"), grpc.WaitForReady(true))
	cancelProbe()
	if err != nil {
		return Report{}, fmt.Errorf("loadgen: cannot call %s: %w", t.addr, err)
	}

	keys := newKeySet(keySpace(cfg))
	calls := make([]func(context.Context) (int, error), len(workers))
	for i := range workers {
		client := rlsv3.NewRateLimitServiceClient(conns[i%nconns])
		draw := newDrawer(cfg, i)
		var val []byte
		calls[i] = func(ctx context.Context) (int, error) {
			k := draw.next()
			val = appendValue(val[:0], cfg.Dist, k)
			resp, err := client.ShouldRateLimit(ctx, request(cfg, string(val)))
			if err != nil {
				return 0, err
			}
			keys.add(k) // answered, so sent: grpc-go does not say whether a failed call was
			if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
				return 429, nil
			}
			return 200, nil
		}
	}
	return callLoop(ctx, cfg, workers, keys, calls, nil), nil
}

// grpcConns is how many connections the gRPC calls spread over: GRPCConns,
// or one per worker when it is 0.
func (cfg *Config) grpcConns() int {
	if cfg.GRPCConns == 0 {
		return cfg.Concurrency
	}
	return cfg.GRPCConns
}

// callLoop runs the gRPC clients' calls: worker i makes calls[i] one after
// the other until cfg.Duration or cfg.Requests runs out, recording each
// answer's latency and status (as HTTP would count it). The run ends by
// cancellation, not a deadline, so that a call cut off by the end is told
// apart from one that failed; a failed call's worker stops when gone(i)
// says its connection is gone for good (nil: never). onEnd, when set, runs
// once the run's time is up, to wake calls waiting on something else.
func callLoop(ctx context.Context, cfg *Config, workers []*worker, keys *keySet, calls []func(context.Context) (int, error), gone func(i int) bool, onEnd ...func()) Report {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var over atomic.Bool
	stop := time.AfterFunc(cfg.Duration, func() { over.Store(true); cancel() })
	defer stop.Stop()
	for _, f := range onEnd {
		defer context.AfterFunc(runCtx, f)()
	}
	var sent atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for i, w := range workers {
		wg.Go(func() {
			for runCtx.Err() == nil {
				if cfg.Requests > 0 && sent.Add(1) > cfg.Requests {
					return
				}
				t0 := time.Now()
				code, err := calls[i](runCtx)
				lat := time.Since(t0)
				if err != nil {
					if !over.Load() && ctx.Err() == nil {
						w.fail(err)
						if gone != nil && gone(i) {
							return // the connection is gone; its calls all fail
						}
					}
					continue
				}
				w.hist.record(lat)
				w.requests++
				w.decisions++
				w.status[code]++
			}
		})
	}
	wg.Wait()
	return report(time.Since(start), cfg, workers, keys)
}

// request is one check of value in cfg's domain and key.
func request(cfg *Config, value string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: cfg.Domain, HitsAddend: 1, Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: cfg.Key, Value: value}}}}}
}

// GRPCRequest returns one single-check ShouldRateLimit request of value in
// cfg's domain and key (defaults applied) as a gRPC message on the wire:
// the 5-byte prefix (uncompressed, big-endian length) and the serialized
// RateLimitRequest. It is the body for a generic HTTP/2 generator such as
// h2load, posted to /envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
// with content-type: application/grpc and te: trailers.
func GRPCRequest(cfg Config, value string) ([]byte, error) {
	cfg.GRPC = "127.0.0.1:1" // any address: only the defaults matter here
	t, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	msg, err := proto.Marshal(request(&t.cfg, value))
	if err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	frame := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg)))
	return append(frame, msg...), nil
}
