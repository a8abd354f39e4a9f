package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// routeRedisLog sends go-redis's log lines, for the whole process, to log.
func routeRedisLog(log *slog.Logger) { redis.SetLogger(newRedisLog(log)) }

// redisLog routes go-redis's own log lines (a dial that failed, a pool that
// could not reconnect) into the PoP's structured log, where they were plain
// text on stderr beside it. They come at every retry — 20 in 6 s while a Redis
// is down — and the PoP reports an unreachable Redis itself (when it starts,
// every 30 s, when it ends), so at most one line a quiet interval is logged,
// at warn, and the next one says how many were left out. Safe for concurrent
// use, as go-redis calls it from its pool's goroutines.
type redisLog struct {
	log   *slog.Logger
	quiet time.Duration    // the least time between two lines logged
	now   func() time.Time // the clock; time.Now outside tests

	mu      sync.Mutex
	last    time.Time // when the last line was logged
	dropped int       // lines left out since
}

func newRedisLog(log *slog.Logger) *redisLog {
	return &redisLog{log: log, quiet: 10 * time.Second, now: time.Now}
}

// Printf is go-redis's logging interface (redis.SetLogger).
func (r *redisLog) Printf(ctx context.Context, format string, v ...any) {
	r.mu.Lock()
	now := r.now()
	if !r.last.IsZero() && now.Sub(r.last) < r.quiet {
		r.dropped++
		r.mu.Unlock()
		return
	}
	dropped := r.dropped
	r.last, r.dropped = now, 0
	r.mu.Unlock()
	attrs := []any{"component", "go-redis"}
	if dropped > 0 {
		attrs = append(attrs, "left_out", dropped)
	}
	r.log.WarnContext(ctx, strings.TrimSpace(fmt.Sprintf(format, v...)), attrs...)
}
