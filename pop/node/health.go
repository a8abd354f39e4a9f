package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/edgelimit/edgelimit/pop/store"
)

// DefaultStoreHealthInterval is how often a Redis store is pinged.
const DefaultStoreHealthInterval = time.Second

// storeLogEvery is how often a store failure that persists is logged again.
const storeLogEvery = 30 * time.Second

// storeProbeTimeout bounds one ping.
const storeProbeTimeout = time.Second

// storeHealth pings the counter store and remembers the outcome: it makes
// /readyz fail while Redis is unreachable or refuses the credentials, and
// logs such a failure when it starts, every storeLogEvery while it lasts, and
// when it ends. Its zero value with a nil ping is always healthy. It is safe
// for concurrent use.
type storeHealth struct {
	ping func(context.Context) error // nil: nothing to probe (embedded store)
	log  *slog.Logger

	mu       sync.Mutex
	err      error     // the last probe's failure; requires mu
	since    time.Time // when the current failure began; requires mu
	lastLog  time.Time // when it was last logged; requires mu
	failures int       // probes failed since it began; requires mu
}

// probe pings the store once and logs a change (rate-limited while failing).
func (h *storeHealth) probe(now time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), storeProbeTimeout)
	err := h.ping(ctx)
	cancel()
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case err == nil && h.err != nil:
		h.log.Info("redis store recovered", "down_for", now.Sub(h.since).Round(time.Millisecond).String(), "failed_probes", h.failures)
		h.err, h.failures = nil, 0
	case err != nil && h.err == nil:
		h.err, h.since, h.lastLog, h.failures = err, now, now, 1
		h.logFailure(err, now)
	case err != nil:
		h.err = err
		h.failures++
		if now.Sub(h.lastLog) >= storeLogEvery {
			h.lastLog = now
			h.logFailure(err, now)
		}
	}
}

// logFailure logs err; requires mu held.
func (h *storeHealth) logFailure(err error, now time.Time) {
	what := "redis store unreachable"
	switch {
	case errors.Is(err, store.ErrRedisAuth):
		what = "redis store refuses authentication: check the password (--redis-password-file or the URL)"
	case errors.Is(err, store.ErrReplicaConflict):
		what = "redis store holds another PoP's counts: this PoP publishes nothing from it"
	}
	h.log.Error(what+"; not ready: fail_closed limits deny, other limits decide on this server's counts alone",
		"err", err, "failing_for", now.Sub(h.since).Round(time.Millisecond).String(), "failed_probes", h.failures)
}

// ready returns the reason the store cannot serve, or nil.
func (h *storeHealth) ready() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil {
		return fmt.Errorf("store: %w", h.err)
	}
	return nil
}
