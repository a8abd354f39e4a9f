package grpcapi

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/store"
)

// benchRequests are single checks of api_key (100/min in testRules): one
// hot value, or 100k distinct ones.
func benchRequests(keys int) []*rlsv3.RateLimitRequest {
	reqs := make([]*rlsv3.RateLimitRequest, keys)
	for i := range reqs {
		v := "hot"
		if keys > 1 {
			v = fmt.Sprintf("k%d", i)
		}
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 1, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", v)}}
	}
	return reqs
}

// benchServer is a Server as a PoP builds it: the real engine on the
// embedded store, with metrics and the request counter.
func benchServer(b *testing.B) *Server {
	reg := prometheus.NewRegistry()
	m := pop.NewMetrics(reg)
	eng := pop.NewEngine(store.NewMemory(store.MemoryConfig{}), testRules(b), m)
	return New(Config{Engine: eng, Metrics: m, Requests: NewRequestCounter(reg)})
}

// BenchmarkShouldRateLimit is the handler alone, without transport: the
// decoding, the engine's check and the building of the response.
func BenchmarkShouldRateLimit(b *testing.B) {
	for _, keys := range []int{1, 100000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			s, reqs := benchServer(b), benchRequests(keys)
			ctx := context.Background()
			b.ReportAllocs()
			var n atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				i := int(n.Add(7919))
				for pb.Next() {
					i++
					if _, err := s.ShouldRateLimit(ctx, reqs[i%len(reqs)]); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkShouldRateLimitLoopback is a whole call over loopback, client
// and server in this process, 64 calls in flight on one connection (the
// client's costs are in the figure too: compare runs, not absolutes).
func BenchmarkShouldRateLimitLoopback(b *testing.B) {
	for _, keys := range []int{1, 100000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			s, reqs := benchServer(b), benchRequests(keys)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			go func() { _ = s.Serve(ln) }()
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				s.Stop(ctx)
			}()
			conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			c := rlsv3.NewRateLimitServiceClient(conn)
			ctx := context.Background()
			if _, err := c.ShouldRateLimit(ctx, reqs[0]); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.SetParallelism(max(64/runtime.GOMAXPROCS(0), 1))
			var n atomic.Int64
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(n.Add(7919))
				for pb.Next() {
					i++
					if _, err := c.ShouldRateLimit(ctx, reqs[i%len(reqs)]); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
