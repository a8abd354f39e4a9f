package store

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/store/redistest"
)

// benchParallelism × GOMAXPROCS goroutines check at once: a busy PoP.
const benchParallelism = 64

// benchItem is the i-th benchmark key: a sliding window no check fills.
func benchItem(i int64) limit.Item {
	return limit.Item{
		Key:  fmt.Appendf(nil, "bench:%d", i%4096),
		Spec: limit.Spec{Algorithm: limit.SlidingWindow, Limit: 1 << 40, Window: int64(time.Minute)},
	}
}

// The baseline: each check is its own EVALSHA round trip on a pooled
// connection, no batching, at the same concurrency as the pipelined run.
func BenchmarkRedisOneRoundTrip(b *testing.B) {
	srv := redistest.Start(b)
	s := openTestRedis(b, srv.URL(), RedisConfig{ClockSource: ClockLocal})
	ctx := context.Background()
	var next atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := new(request)
		for pb.Next() {
			it := benchItem(next.Add(1))
			r.prepare(s, time.Now().UnixNano(), 1, []limit.Item{it}, nil, time.Time{})
			c := &r.calls[0]
			if err := s.client.EvalSha(ctx, checkScript.Hash(), c.keys, c.blob).Err(); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}

// Checks through the store's batcher: concurrent checks share pipelines, and
// the calls of a pipeline share script runs (up to maxEvalItems items a run).
func BenchmarkRedisPipelined(b *testing.B) { benchPipelined(b, maxEvalItems) }

// As BenchmarkRedisPipelined, but every call is its own script run in the
// pipeline: what packing calls into runs saves.
func BenchmarkRedisPipelinedUnpacked(b *testing.B) { benchPipelined(b, 1) }

func benchPipelined(b *testing.B, evalItems int) {
	srv := redistest.Start(b)
	s := openTestRedis(b, srv.URL(), RedisConfig{ClockSource: ClockLocal})
	s.evalItems = evalItems // before any check: the pipeliners read it
	ctx := context.Background()
	var next atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		items := make([]limit.Item, 1)
		out := make([]limit.Decision, 1)
		for pb.Next() {
			items[0] = benchItem(next.Add(1))
			if err := s.CheckAt(ctx, time.Now().UnixNano(), 1, items, out); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}
