package store

import (
	"context"
	"sync"
	"sync/atomic"

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
// A set keeps its leases in a map (for release) and in a queue by expiry
// (for expiry), so an acquisition costs O(1) amortized whatever the limit,
// as a Redis sorted set's O(log n). The queue is in expiry order as long as
// a limit's lease_ttl stays the same; after a reload shortens it, a lease
// that expired behind a longer one counts until that one goes (a denial too
// many, never one too few).
//
// Every sweepEvery acquisitions all sets are swept of expired leases and
// sets left empty are dropped, so memory follows the leases held (and the
// keys of the last sweepEvery acquisitions), not every key seen.
//
// With a journal (SetJournal) the leases survive a crash: every grant is on
// disk before AcquireAt answers, and a restarted PoP restores them
// (RestoreLease) before it serves, so it never has more slots in flight than
// a limit's maximum. Without one, a restart forgets the slots its clients
// still hold.
//
// The zero value is not usable; call NewLeases. A Leases is safe for
// concurrent use.
type Leases struct {
	mu       sync.Mutex
	sets     map[limit.SlotKey]*slotSet
	acquired int // since the last sweep

	journal       LeaseJournal // nil: leases live in memory only
	journalErrors atomic.Uint64
}

// LeaseJournal keeps a Leases' grants on disk (cmd/edgelimit wires it to the
// PoP's Pebble directory; store does not import replication).
//
// Why a grant is written before it is answered, rather than a restarted PoP
// refusing every grant for one lease TTL: a crash is then invisible to the
// clients of concurrency limits — the slots held are known, releases of
// leases granted before the crash free them, and a PoP that crashes in a loop
// does not deny every concurrency-limited request for a TTL after each start;
// a clean restart (a deploy) needs nothing either. The price is one synced
// write per grant, which Pebble groups across concurrent grants: a grant
// waits on the disk as a Redis store's grant waits on Redis, and checks
// without concurrency limits never do.
type LeaseJournal interface {
	// SaveLease durably records that lease id holds a slot of each of keys
	// until the matching expiry of exps (ns); AcquireAt calls it after
	// taking the slots and before answering. On an error (a full disk) the
	// grant stands, held in memory only, and is counted (JournalErrors).
	SaveLease(id limit.LeaseID, keys []limit.SlotKey, exps []int64) error
	// ForgetLease records that lease id was released. It need not be
	// durable: a release lost in a crash keeps its slots taken after the
	// restart until the lease's expiry (a denial too many, never a slot
	// too many).
	ForgetLease(id limit.LeaseID)
}

// SetJournal makes l write every grant to j before answering it, and every
// release after. Call it, and RestoreLease, before l serves.
func (l *Leases) SetJournal(j LeaseJournal) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.journal = j
}

// JournalErrors returns how many grants the journal failed to save (each
// held in memory only).
func (l *Leases) JournalErrors() uint64 { return l.journalErrors.Load() }

// RestoreLease puts back lease id's slot in key's set until exp (ns), as
// saved by a journal before a restart; a slot expired at now is skipped (it
// reports false). A set may hold more leases after a restore than a limit
// now allows (the limit was lowered): acquisitions wait until enough expire
// or are released.
func (l *Leases) RestoreLease(now int64, id limit.LeaseID, key limit.SlotKey, exp int64) bool {
	if exp <= now {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	set := l.sets[key]
	if set == nil {
		set = &slotSet{live: make(map[limit.LeaseID]int64, 4)}
		l.sets[key] = set
	}
	set.live[id] = exp
	// Keep the queue in expiry order: saved leases come back in id order.
	set.queue = append(set.queue, queued{exp, id})
	for i := len(set.queue) - 1; i > set.head && set.queue[i-1].exp > exp; i-- {
		set.queue[i], set.queue[i-1] = set.queue[i-1], set.queue[i]
	}
	return true
}

// slotSet is one key's leases.
type slotSet struct {
	live  map[limit.LeaseID]int64 // lease → expiry (ns)
	queue []queued                // by expiry, from head; holds released leases too
	head  int
}

type queued struct {
	exp int64
	id  limit.LeaseID
}

// NewLeases returns an empty lease store.
func NewLeases() *Leases {
	return &Leases{sets: make(map[limit.SlotKey]*slotSet)}
}

// AcquireAt decides items at now as one atomic step and, when every item has
// a free slot, takes one in each for id, until now + the item's TTL. It
// writes one decision per item to out and reports whether the slots were
// taken. It never fails; the error is for the interface Redis shares.
//
// With a journal, the grant is saved before AcquireAt returns (outside the
// lock: concurrent grants share the disk's syncs).
func (l *Leases) AcquireAt(_ context.Context, now int64, id limit.LeaseID, items []limit.SlotItem, out []limit.SlotDecision) (bool, error) {
	l.mu.Lock()
	ok := l.acquire(now, id, items, out)
	j := l.journal
	l.mu.Unlock()
	if ok && j != nil {
		keys, exps := make([]limit.SlotKey, len(items)), make([]int64, len(items))
		for i := range items {
			keys[i], exps[i] = items[i].Key, now+items[i].TTL
		}
		if err := j.SaveLease(id, keys, exps); err != nil {
			l.journalErrors.Add(1)
		}
	}
	return ok, nil
}

// acquire is AcquireAt's decision and grant; requires l.mu held.
func (l *Leases) acquire(now int64, id limit.LeaseID, items []limit.SlotItem, out []limit.SlotDecision) bool {
	ok := true
	for i := range items {
		var n, oldest int64
		if set := l.sets[items[i].Key]; set != nil {
			n, oldest = set.drop(now)
		}
		out[i] = limit.DecideSlot(items[i], n, oldest, now, false)
		ok = ok && out[i].Allowed
	}
	if !ok {
		return false
	}
	for i := range items {
		it := &items[i]
		set := l.sets[it.Key]
		if set == nil {
			set = &slotSet{live: make(map[limit.LeaseID]int64, 4)}
			l.sets[it.Key] = set
		}
		exp := now + it.TTL
		set.live[id] = exp
		set.queue = append(set.queue, queued{exp, id})
		out[i] = limit.DecideSlot(*it, out[i].InFlight, 0, now, true)
	}
	if l.acquired++; l.acquired >= sweepEvery {
		l.sweep(now)
	}
	return true
}

// ReleaseAt frees lease's slot in each of its sets: limit.Released when any
// set held it live, limit.Expired when the sets held it only past its expiry,
// limit.Unknown when none held it. It never fails.
func (l *Leases) ReleaseAt(_ context.Context, now int64, lease limit.Lease) (limit.ReleaseState, error) {
	l.mu.Lock()
	state := l.release(now, lease)
	j := l.journal
	l.mu.Unlock()
	if j != nil && state != limit.Unknown {
		j.ForgetLease(lease.ID)
	}
	return state, nil
}

// release is ReleaseAt's work; requires l.mu held.
func (l *Leases) release(now int64, lease limit.Lease) limit.ReleaseState {
	state := limit.Unknown
	for _, k := range lease.Keys {
		set := l.sets[k]
		if set == nil {
			continue
		}
		exp, held := set.live[lease.ID]
		if !held {
			continue
		}
		delete(set.live, lease.ID) // its queue entry is now stale
		if len(set.live) == 0 {
			// Kept, empty, until the next sweep: a busy key would
			// otherwise allocate its set again on every request.
			clear(set.queue)
			set.queue, set.head = set.queue[:0], 0
		} else {
			set.compact()
		}
		if exp > now {
			state = state.Join(limit.Released)
		} else {
			state = state.Join(limit.Expired)
		}
	}
	return state
}

// InFlightAt returns how many live leases key's set holds at now.
func (l *Leases) InFlightAt(key limit.SlotKey, now int64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var n int64
	if set := l.sets[key]; set != nil {
		for _, exp := range set.live {
			if exp > now {
				n++
			}
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
		if n, _ := set.drop(now); n == 0 {
			delete(l.sets, k)
		}
	}
}

// drop removes the leases expired at now (a lease expires at its expiry
// instant) and the released ones ahead of the oldest live lease; it returns
// how many leases are left and the oldest one's expiry.
func (s *slotSet) drop(now int64) (n, oldest int64) {
	for s.head < len(s.queue) {
		q := s.queue[s.head]
		exp, ok := s.live[q.id]
		current := ok && exp == q.exp
		if current && exp > now {
			break
		}
		if current {
			delete(s.live, q.id)
		}
		s.queue[s.head] = queued{}
		s.head++
	}
	s.compact()
	if len(s.live) == 0 {
		return 0, 0
	}
	return int64(len(s.live)), s.queue[s.head].exp
}

// compact keeps the queue within a constant factor of the leases held: it
// moves the entries down once half of it is behind head, and drops the
// released entries once they outnumber the live ones.
func (s *slotSet) compact() {
	pending := len(s.queue) - s.head
	switch {
	case pending > 2*len(s.live)+64:
		q := s.queue[:0]
		for _, e := range s.queue[s.head:] {
			if exp, ok := s.live[e.id]; ok && exp == e.exp {
				q = append(q, e)
			}
		}
		clear(s.queue[len(q):])
		s.queue, s.head = q, 0
	case s.head > 64 && 2*s.head >= len(s.queue):
		n := copy(s.queue, s.queue[s.head:])
		clear(s.queue[n:])
		s.queue, s.head = s.queue[:n], 0
	}
}
