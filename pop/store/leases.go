package store

import (
	"context"
	"sync"

	"github.com/edgelimit/edgelimit/pop/limit"
)

// sweepEvery is how many acquisitions Leases lets pass between sweeps of
// every set for expired leases (sets of keys that are no longer checked).
const sweepEvery = 4096

// Leases is the embedded store of concurrency leases: one slot set per
// limit.SlotKey, each lease with its expiry. An acquisition drops the expired
// leases of its sets, decides with limit.DecideSlot and, only when every set
// has a free slot, adds the lease to all of them — one step under one lock,
// so it is exact under any contention. Time is injected: a lease expires when
// an acquisition or release is given a now past its expiry, whatever the
// wall clock says.
//
// Sets without live leases are dropped, and every sweepEvery acquisitions
// all sets are swept, so memory follows the leases held, not the keys seen.
// The zero value is not usable; call NewLeases. A Leases is safe for
// concurrent use.
type Leases struct {
	mu       sync.Mutex
	sets     map[limit.SlotKey]map[limit.LeaseID]int64 // lease → expiry (ns)
	acquired int                                       // since the last sweep
}

// NewLeases returns an empty lease store.
func NewLeases() *Leases {
	return &Leases{sets: make(map[limit.SlotKey]map[limit.LeaseID]int64)}
}

// AcquireAt decides items at now as one atomic step and, when every item has
// a free slot, takes one in each for id, until now + the item's TTL. It
// writes one decision per item to out and reports whether the slots were
// taken. It never fails; the error is for the interface Redis shares.
func (l *Leases) AcquireAt(_ context.Context, now int64, id limit.LeaseID, items []limit.SlotItem, out []limit.SlotDecision) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ok := true
	for i := range items {
		set := l.sets[items[i].Key]
		n, oldest := purge(set, now)
		out[i] = limit.DecideSlot(items[i], n, oldest, now, false)
		ok = ok && out[i].Allowed
	}
	if !ok {
		return false, nil
	}
	for i := range items {
		it := &items[i]
		set := l.sets[it.Key]
		if set == nil {
			set = make(map[limit.LeaseID]int64, 4)
			l.sets[it.Key] = set
		}
		set[id] = now + it.TTL
		out[i] = limit.DecideSlot(*it, out[i].InFlight, 0, now, true)
	}
	if l.acquired++; l.acquired >= sweepEvery {
		l.sweep(now)
	}
	return true, nil
}

// ReleaseAt frees lease's slot in each of its sets: limit.Released when any
// set held it live, limit.Expired when the sets held it only past its expiry,
// limit.Unknown when none held it. It never fails.
func (l *Leases) ReleaseAt(_ context.Context, now int64, lease limit.Lease) (limit.ReleaseState, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	state := limit.Unknown
	for _, k := range lease.Keys {
		set := l.sets[k]
		exp, held := set[lease.ID]
		if !held {
			continue
		}
		delete(set, lease.ID)
		if len(set) == 0 {
			delete(l.sets, k)
		}
		if exp > now {
			state = state.Join(limit.Released)
		} else {
			state = state.Join(limit.Expired)
		}
	}
	return state, nil
}

// InFlightAt returns how many live leases key's set holds at now.
func (l *Leases) InFlightAt(key limit.SlotKey, now int64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var n int64
	for _, exp := range l.sets[key] {
		if exp > now {
			n++
		}
	}
	return n
}

// Len returns how many slot sets are held (with leases live or not yet swept).
func (l *Leases) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.sets)
}

// SweepAt drops every expired lease, and every set left empty, at now.
func (l *Leases) SweepAt(now int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweep(now)
}

// sweep requires l.mu held.
func (l *Leases) sweep(now int64) {
	l.acquired = 0
	for k, set := range l.sets {
		if n, _ := purge(set, now); n == 0 {
			delete(l.sets, k)
		}
	}
}

// purge drops set's leases expired at now and returns how many are left and
// the earliest expiry among them. A lease expires at its expiry instant.
func purge(set map[limit.LeaseID]int64, now int64) (n, oldest int64) {
	for id, exp := range set {
		if exp <= now {
			delete(set, id)
			continue
		}
		if n == 0 || exp < oldest {
			oldest = exp
		}
		n++
	}
	return n, oldest
}
