package pop

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
)

// Leaser holds the leases of concurrency limits (store.Leases, store.Redis).
type Leaser interface {
	// AcquireAt decides items at now (ns) as one step: each set's expired
	// leases are dropped and limit.DecideSlot decides it; only when every
	// item has a free slot is id added to every set, until now + its TTL.
	// It writes one decision per item to out and reports whether the slots
	// were taken. An error means nothing is held (as far as the store
	// knows: a timed-out Redis call may still have taken them; the TTL
	// frees them).
	AcquireAt(ctx context.Context, now int64, id limit.LeaseID, items []limit.SlotItem, out []limit.SlotDecision) (bool, error)
	// ReleaseAt frees lease's slots at now and says what it found
	// (limit.Released, limit.Expired or limit.Unknown). Releasing twice, or
	// a lease no set holds, is not an error.
	ReleaseAt(ctx context.Context, now int64, lease limit.Lease) (limit.ReleaseState, error)
}

// UseLeases makes the engine enforce concurrency limits on checks that ask
// for leases (CheckLeaseAt), holding them in l. Call it before serving.
// Without it, concurrency limits are not applied.
func (e *Engine) UseLeases(l Leaser) { e.leases = l }

// CheckLease decides req at the engine's clock (Now). See CheckLeaseAt.
func (e *Engine) CheckLease(ctx context.Context, req *Request, res *Result) error {
	return e.CheckLeaseAt(ctx, e.Now(), req, res)
}

// CheckLeaseAt is CheckAt that also enforces the request's concurrency
// limits: when the request is admitted it holds one slot of each, and
// res.Lease is the token that frees them (Release), or they expire after
// their lease_ttl. A denied request holds nothing: the slots are taken in one
// store step before the rate limits are counted, and given back when a rate
// limit denies; when a concurrency limit has no free slot, the rate limits
// are only peeked at and spend nothing.
//
// A descriptor counting 0 hits (check only) takes no slot. When the lease
// store fails, concurrency limits fail open — the request is decided by its
// rate limits alone and gets no lease — unless one is fail_closed, which
// then denies.
//
// CheckAt (the gRPC service, /v1/authz, batches) leaves concurrency limits
// out: those callers have no way to release a lease.
func (e *Engine) CheckLeaseAt(ctx context.Context, now time.Time, req *Request, res *Result) error {
	return e.check(ctx, now, req, res, e.leases != nil)
}

// Release frees the slots of the lease whose token is token (Result.Lease).
// A malformed token is a *RequestError naming field; an unknown, expired or
// already released lease is not an error (see limit.ReleaseState).
func (e *Engine) Release(ctx context.Context, now time.Time, token, field string) (limit.ReleaseState, error) {
	lease, err := limit.ParseLease(token)
	if err != nil {
		return limit.Unknown, &RequestError{field, err.Error()}
	}
	if e.leases == nil {
		return limit.Unknown, nil
	}
	st, err := e.leases.ReleaseAt(ctx, now.UnixNano(), lease)
	if err != nil {
		e.metrics.storeError()
		return limit.Unknown, fmt.Errorf("pop: lease store: %w", err)
	}
	return st, nil
}

// addSlot records concurrency limit l of descriptor di, matched with
// entries, in s; a limit reached twice counts once.
func (s *scratch) addSlot(l *rules.Limit, entries []rules.Entry, di int) {
	s.slotKey = l.AppendKey(s.slotKey[:0], entries)
	k := limit.SlotKeyOf(s.slotKey)
	for i := range s.slots {
		if s.slots[i].Key == k {
			return
		}
	}
	s.slots = append(s.slots, limit.SlotItem{Key: k, Max: l.Spec.Limit, TTL: int64(l.LeaseTTL)})
	s.slotLimits = append(s.slotLimits, l)
	s.slotOwner = append(s.slotOwner, di)
}

// acquire takes the slots of s.slots for a new lease id (s.leased says
// whether they are held) and reports whether they admit the request. On a
// store error it fails open (admits, holds nothing, reports no slot
// statuses) unless a slot is fail_closed, which denies.
func (e *Engine) acquire(ctx context.Context, s *scratch, nowNs int64) bool {
	s.leased, s.slotsDecided = false, false
	if len(s.slots) == 0 {
		return true
	}
	// Unguessable by design, so from crypto/rand, not a seeded source: a
	// guessed id would release someone else's slot. It never fails.
	_, _ = rand.Read(s.leaseID[:])
	s.slotOut = append(s.slotOut[:0], make([]limit.SlotDecision, len(s.slots))...)
	ok, err := e.leases.AcquireAt(ctx, nowNs, s.leaseID, s.slots, s.slotOut)
	if err != nil {
		if !errors.Is(err, context.Canceled) || ctx.Err() == nil {
			e.metrics.storeError()
		}
		for i, l := range s.slotLimits {
			if l.FailClosed {
				s.slotOut[i] = limit.SlotDecision{RetryAfter: int64(time.Second)}
				s.slotsDecided = true
				return false
			}
		}
		return true
	}
	s.leased, s.slotsDecided = ok, true
	return ok
}

// settleSlots finishes the slots of an answered check: when the request was
// denied after its slots were taken they are given back (and report the room
// they had); the statuses of the slots join res; an admitted request holding
// slots gets its lease token.
func (e *Engine) settleSlots(ctx context.Context, s *scratch, res *Result, admitted bool, nowNs int64) {
	res.Lease = ""
	if !s.slotsDecided {
		return
	}
	if s.leased && !admitted {
		// Best effort: a release that fails leaves the slots to their TTL.
		if _, err := e.leases.ReleaseAt(context.WithoutCancel(ctx), nowNs, e.lease(s)); err != nil {
			e.metrics.storeError()
		}
		for i := range s.slotOut {
			s.slotOut[i] = limit.DecideSlot(s.slots[i], s.slotOut[i].InFlight-1, 0, nowNs, false)
		}
		s.leased = false
	}
	if s.leased {
		res.Lease = e.lease(s).String()
	}
	for i, l := range s.slotLimits {
		d := s.slotOut[i]
		e.metrics.decision(l, d.Allowed, admitted)
		st := &res.Statuses[s.slotOwner[i]]
		dec := limit.Decision{Allowed: d.Allowed, Remaining: d.Remaining, RetryAfter: d.RetryAfter}
		if morePressing(dec, st) {
			*st = Status{Limit: l, Remaining: d.Remaining, RetryAfter: time.Duration(d.RetryAfter)}
			if !d.Allowed {
				st.Code = OverLimit
			}
		}
	}
}

// lease is the lease s holds; its Keys alias s's memory.
func (e *Engine) lease(s *scratch) limit.Lease {
	s.leaseKeys = s.leaseKeys[:0]
	for i := range s.slots {
		s.leaseKeys = append(s.leaseKeys, s.slots[i].Key)
	}
	return limit.Lease{ID: s.leaseID, Keys: s.leaseKeys}
}
