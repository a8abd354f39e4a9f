package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
)

// Checker is the store contract: CheckAt evaluates items at now as one atomic
// step with the semantics of limit.Decide, writing one decision per item to
// out. Memory, Redis and Fallback implement it.
type Checker interface {
	CheckAt(ctx context.Context, now, hits int64, items []limit.Item, out []limit.Decision) error
}

// Defaults of FallbackConfig.
const (
	DefaultBreakerFailures = 5
	DefaultBreakerCooldown = time.Second
)

// ErrInvalidCheck marks a check that no store could answer because its input
// is wrong (see Redis.CheckAt). Fallback passes such errors to its caller
// instead of counting them against the primary.
var ErrInvalidCheck = errors.New("invalid check")

// BreakerState is the state of a Fallback's circuit breaker.
type BreakerState int32

const (
	// BreakerClosed: checks go to the primary.
	BreakerClosed BreakerState = iota
	// BreakerOpen: the primary failed repeatedly; checks go to the
	// secondary until the cooldown ends.
	BreakerOpen
	// BreakerHalfOpen: the cooldown ended and one probe check is trying the
	// primary; the others still go to the secondary.
	BreakerHalfOpen
)

func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half_open"
	}
	return fmt.Sprintf("BreakerState(%d)", int32(s))
}

// FallbackConfig configures a Fallback. Its zero value is the default.
type FallbackConfig struct {
	// Failures is how many consecutive primary errors (timeouts included)
	// open the breaker; 0 means DefaultBreakerFailures.
	Failures int
	// Cooldown is how long the breaker stays open before it lets one probe
	// through; 0 means DefaultBreakerCooldown. It is also the RetryAfter of
	// fail-closed denials.
	Cooldown time.Duration
	// Now is the breaker's clock (real time, for the cooldown; the decisions
	// still use the now each check is given). nil means time.Now.
	Now func() time.Time
}

// Fallback is a store that keeps limiting when its primary (the shared Redis
// store) cannot answer: it answers from a secondary (the PoP's own Memory
// store), with local knowledge only, rather than letting everything through.
//
// A circuit breaker decides where checks go. Closed, they go to the primary;
// a check whose primary call fails is answered by the secondary, and after
// Failures consecutive failures the breaker opens. Open, every check goes to
// the secondary, without waiting on the primary, for Cooldown; then the
// breaker is half-open and lets one probe check try the primary: success
// closes it, failure opens it for another Cooldown.
//
// Items marked FailClosed are never decided on local knowledge: a request
// with such an item, while the primary is unusable (open, probing, or just
// failed), is denied. Its fail-closed items get Allowed=false with RetryAfter
// and Reset set to Cooldown; its other items are asked of the secondary
// without spending quota, as for any denied request.
//
// So a primary error never reaches the caller: the check is answered within
// the primary's own deadline plus a secondary check, which for Memory is
// microseconds. The primary must return by the deadline it is given (Redis
// does: its Timeout or ctx's deadline). Errors that come from the check's
// input (ErrInvalidCheck) are returned as they are, and do not count against
// the primary; so are the secondary's errors (Memory has none).
//
// A replicated Redis primary's region and global limits are decided, while
// it is away, on its own in-process counts of them, which it publishes and
// puts back into Redis when Redis answers again (redis_offline.go; the
// secondary is then made with MemoryConfig.Primary).
//
// When the secondary is the embedded store, the two are reconciled
// (reconcile.go): the secondary follows what the primary reports, so that it
// goes on from there when the primary goes away, and the primary is given
// back what the secondary counted that it lacks (the hits admitted while it
// was away, or everything, when it restarted empty) the next time the key is
// checked.
//
// A Fallback is safe for concurrent use. Its zero value is not usable; call
// NewFallback.
type Fallback struct {
	primary, secondary Checker
	failures           int32
	cooldown           time.Duration
	now                func() time.Time

	state       atomic.Int32 // BreakerState
	consecutive atomic.Int32 // primary failures in a row while closed
	mu          sync.Mutex   // serializes state changes; never held during a check
	openedAt    time.Time    // when the breaker last opened; requires mu

	primaryDecisions  atomic.Uint64
	primaryErrors     atomic.Uint64
	fallbackDecisions atomic.Uint64
	failClosedDenials atomic.Uint64
	opens             atomic.Uint64
	reconciled        atomic.Uint64  // hits added to the primary from the secondary's knowledge
	reconcileDenials  atomic.Uint64  // checks the primary allowed and the secondary's knowledge denied
	seeding           sync.Map       // keys whose seed is in flight (reconcile.go)
	inFlight          atomic.Int32   // seeds in flight
	seeds             sync.WaitGroup // seeds in flight, for tests
}

// NewFallback returns a Fallback over primary and secondary, closed.
func NewFallback(primary, secondary Checker, cfg FallbackConfig) *Fallback {
	f := &Fallback{
		primary:   primary,
		secondary: secondary,
		failures:  int32(cfg.Failures),
		cooldown:  cfg.Cooldown,
		now:       cfg.Now,
	}
	if f.failures <= 0 {
		f.failures = DefaultBreakerFailures
	}
	if f.cooldown <= 0 {
		f.cooldown = DefaultBreakerCooldown
	}
	if f.now == nil {
		f.now = time.Now
	}
	return f
}

// FallbackStats counts what a Fallback did. Counts only grow.
type FallbackStats struct {
	// PrimaryDecisions counts checks the primary answered.
	PrimaryDecisions uint64
	// PrimaryErrors counts primary calls that failed (timeouts included).
	PrimaryErrors uint64
	// FallbackDecisions counts checks answered without the primary: by the
	// secondary, or denied because of a fail-closed item.
	FallbackDecisions uint64
	// FailClosedDenials counts the FallbackDecisions denied because of a
	// fail-closed item.
	FailClosedDenials uint64
	// BreakerOpens counts the times the breaker opened.
	BreakerOpens uint64
	// ReconciledHits counts hits added to the primary because the
	// secondary knew of more than the primary reported (reconcile.go).
	ReconciledHits uint64
	// ReconcileDenials counts checks the primary allowed but the
	// secondary's knowledge denied.
	ReconcileDenials uint64
	// State is the breaker's state now.
	State BreakerState
}

// Stats reports the counts so far and the breaker's state. Each count is read
// atomically; together they are not one snapshot.
func (f *Fallback) Stats() FallbackStats {
	return FallbackStats{
		PrimaryDecisions:  f.primaryDecisions.Load(),
		PrimaryErrors:     f.primaryErrors.Load(),
		FallbackDecisions: f.fallbackDecisions.Load(),
		FailClosedDenials: f.failClosedDenials.Load(),
		BreakerOpens:      f.opens.Load(),
		ReconciledHits:    f.reconciled.Load(),
		ReconcileDenials:  f.reconcileDenials.Load(),
		State:             f.BreakerState(),
	}
}

// BreakerState reports the breaker's state.
func (f *Fallback) BreakerState() BreakerState { return BreakerState(f.state.Load()) }

// CheckAt answers the check from the primary when the breaker lets it, and
// otherwise, or when the primary fails, from the secondary (see Fallback).
// It returns an error only for an invalid check (ErrInvalidCheck, from the
// primary), when the caller's ctx was canceled while the primary had the
// check (context.Canceled), or when the secondary fails.
func (f *Fallback) CheckAt(ctx context.Context, now, hits int64, items []limit.Item, out []limit.Decision) error {
	usePrimary, probe := f.route()
	if usePrimary {
		err := f.primary.CheckAt(ctx, now, hits, items, out)
		switch {
		case err == nil:
			f.primaryDecisions.Add(1)
			f.succeeded(probe)
			if r, ok := f.secondary.(reconciler); ok && hits > 0 {
				f.reconcile(r, f.decisionTime(now), hits, items, out)
			}
			return nil
		case errors.Is(err, ErrInvalidCheck):
			if probe {
				f.reopen() // the probe proved nothing; try again after a cooldown
			}
			return err
		}
		if errors.Is(err, context.Canceled) && ctx.Err() != nil {
			// The caller gave up (its client went away), not the primary: no
			// verdict on the primary, no store error, and no fallback answer
			// — nobody waits for it, and counting it would spend quota on a
			// request that will not be served.
			if probe {
				f.reopen()
			}
			return err
		}
		f.primaryErrors.Add(1)
		f.failed(probe)
	}
	return f.fallback(ctx, f.decisionTime(now), hits, items, out)
}

// decisionTime is the instant the primary decides a check given now at, on
// its clock (Redis.DecisionTime with ClockRedis). The secondary decides and
// mirrors at the same instant: on its own clock it would count the hits
// around each boundary in the other window than the primary did, and a
// window could admit up to twice its limit across a breaker trip
// (TestFallbackCountsInRedisWindows).
func (f *Fallback) decisionTime(now int64) int64 {
	if c, ok := f.primary.(interface{ DecisionTime(int64) int64 }); ok {
		return c.DecisionTime(now)
	}
	return now
}

// route says whether this check may use the primary, and whether it is the
// half-open breaker's probe.
func (f *Fallback) route() (usePrimary, probe bool) {
	switch BreakerState(f.state.Load()) {
	case BreakerClosed:
		return true, false
	case BreakerHalfOpen:
		return false, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if BreakerState(f.state.Load()) != BreakerOpen || f.now().Sub(f.openedAt) < f.cooldown {
		return false, false
	}
	f.state.Store(int32(BreakerHalfOpen))
	return true, true
}

func (f *Fallback) succeeded(probe bool) {
	if f.consecutive.Load() != 0 {
		f.consecutive.Store(0)
	}
	if probe {
		f.mu.Lock()
		f.consecutive.Store(0) // failures seen while open are history
		f.state.Store(int32(BreakerClosed))
		f.mu.Unlock()
	}
}

func (f *Fallback) failed(probe bool) {
	if probe {
		f.reopen()
		return
	}
	if f.consecutive.Add(1) < f.failures {
		return
	}
	f.mu.Lock()
	if BreakerState(f.state.Load()) == BreakerClosed {
		f.openedAt = f.now()
		f.state.Store(int32(BreakerOpen))
		f.consecutive.Store(0)
		f.opens.Add(1)
	}
	f.mu.Unlock()
}

// reopen ends a probe without closing the breaker.
func (f *Fallback) reopen() {
	f.mu.Lock()
	f.openedAt = f.now()
	f.state.Store(int32(BreakerOpen))
	f.mu.Unlock()
}

// failClosedKey names the always-denying item that lets the secondary report
// on a request's other items without spending their quota.
var failClosedKey = []byte("\x00edgelimit:fail-closed")

// fallback answers a check without the primary.
func (f *Fallback) fallback(ctx context.Context, now, hits int64, items []limit.Item, out []limit.Decision) error {
	f.fallbackDecisions.Add(1)
	closed := 0
	for i := range items {
		if items[i].FailClosed {
			closed++
		}
	}
	if closed == 0 {
		// Servers sharing the primary each decide alone now: each takes
		// its part of every limit (redis_servers.go).
		if sh, ok := f.primary.(shared); ok {
			if k := sh.Servers(); k > 1 {
				var buf [maxInline]limit.Item
				items = splitItems(items, k, buf[:])
			}
		}
		// A replicated Redis store's region and global limits are decided
		// on its own in-process counts, and it publishes and restores what
		// the secondary counts there (redis_offline.go).
		o, _ := f.primary.(offliner)
		if o != nil {
			o.offlineBefore(now, items)
		}
		if err := f.secondary.CheckAt(ctx, now, hits, items, out); err != nil {
			return fmt.Errorf("store: fallback: secondary store: %w", err)
		}
		if o != nil {
			o.offlineAfter(now, items)
		}
		return nil
	}
	f.failClosedDenials.Add(1)

	// Ask the secondary about the other items alongside an item with a zero
	// limit: the request is denied there too, so it spends nothing, and the
	// items that had room report it as limit.Decide does.
	var (
		itemBuf [maxInline]limit.Item
		decBuf  [maxInline]limit.Decision
	)
	rest := itemBuf[:0]
	for i := range items {
		if !items[i].FailClosed {
			rest = append(rest, items[i])
		}
	}
	if len(rest) > 0 {
		rest = append(rest, limit.Item{Key: failClosedKey, Spec: limit.Spec{Algorithm: limit.FixedWindow, Limit: 0, Window: int64(time.Second)}})
		decs := decBuf[:0]
		if len(rest) <= len(decBuf) {
			decs = decBuf[:len(rest)]
		} else {
			decs = make([]limit.Decision, len(rest))
		}
		if err := f.secondary.CheckAt(ctx, now, hits, rest, decs); err != nil {
			return fmt.Errorf("store: fallback: secondary store: %w", err)
		}
		j := 0
		for i := range items {
			if !items[i].FailClosed {
				out[i] = decs[j]
				j++
			}
		}
	}
	for i := range items {
		if items[i].FailClosed {
			out[i] = limit.Decision{Allowed: false, Remaining: 0, Reset: int64(f.cooldown), RetryAfter: int64(f.cooldown)}
		}
	}
	return nil
}
