package store

import (
	"context"
	_ "embed" // the Lua scripts
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/pop/limit"
)

//go:embed scripts/lease.lua
var leaseLua string

//go:embed scripts/release.lua
var releaseLua string

// LeaseMarkerKey is the Redis key holding the time (µs, on the lease clock)
// at which the server's lease sets began: set by the first PoP server that
// finds it missing, and never changed after. Its hash tag puts it in
// OwnerKey's Cluster slot, so that the claim (redis_owner.go) reads and sets
// both in one script run.
const LeaseMarkerKey = "el:leases:{el:replica}"

// A Redis that restarts without persistence (or is flushed) loses every
// lease held, and would then grant a limit's max again while the clients of
// the lost leases are still in flight: twice the max. So the lease sets are
// trusted only from LeaseMarkerKey's time on. When the marker is missing the
// Redis lost its data; the first PoP server to see that sets it, to when the
// leases were lost at the latest (leaseMarkerNow), and until a limit's
// lease_ttl has passed since, a set of that limit counts as full: an
// acquisition is denied, with Retry-After the end of that wait, since a lease
// granted before the loss may be held until then. Releases work as always (a
// lost lease's release answers unknown). A Redis whose data survived its
// restart (AOF; or an RDB snapshot, which holds the marker, so the leases
// granted after the snapshot are lost without a wait) kept the marker and
// pays nothing; neither does a PoP server's restart. A brand-new Redis cannot
// be told from an emptied one: the PoP that first uses it waits a lease_ttl
// from the Redis's start.
//
// Why deny, not the limit's store-failure policy (fail open unless
// fail_closed): Redis answers, and what it answers is that the set may be
// full; failing open would admit every request without a lease for a whole
// lease_ttl after each restart, far more than the max. Why each limit's own
// lease_ttl, not the longest: a set only ever held leases of its own limit
// (a reload that shortened a lease_ttl can leave a longer lease out, as it
// can in a set itself). Why a marker of its own: OwnerKey exists only with a
// replica name, and the claim re-creates it on the very connection that
// meets an emptied Redis, leaving nothing to see; and INFO's run_id changes
// on every restart, AOF or not, so it cannot tell lost leases from kept ones.
//
// Where the loss is met: the claim of OpenRedis, of every new connection and
// of each Ping (every second) reads the marker and sets it when missing, and
// on a standalone server lease.lua reads it (and sets it) in the very script
// run that would grant, so no grant is made on an emptied server before its
// marker is set, whichever PoP server gets there first and whatever its pool
// held. In a Cluster the sets live on every node and the marker on one: only
// the loss of the marker's node is seen (by a claim, within a second).

// leaseLoss is what the store knows of LeaseMarkerKey.
type leaseLoss struct {
	seen    atomic.Bool   // born holds a value read from Redis
	born    atomic.Int64  // the marker's value, µs
	denials atomic.Uint64 // acquisitions denied while the marker's wait held
}

// noteLeaseMarker records the marker's value as a claim or lease.lua read
// it.
func (s *Redis) noteLeaseMarker(v string) {
	if born, err := strconv.ParseInt(v, 10, 64); err == nil {
		s.noteLeaseBorn(born)
	}
}

func (s *Redis) noteLeaseBorn(born int64) {
	s.leaseLoss.born.Store(born)
	s.leaseLoss.seen.Store(true)
}

// LeaseLossDenials is how many acquisitions were denied because the Redis
// had lost its leases less than the limit's lease_ttl before.
func (s *Redis) LeaseLossDenials() uint64 { return s.leaseLoss.denials.Load() }

// LeasesKnownSince returns when (on the store's local clock) the Redis's
// lease sets began, as far as the store has read LeaseMarkerKey, and
// whether it has: a limit's sets count as full until its lease_ttl has
// passed since.
func (s *Redis) LeasesKnownSince() (time.Time, bool) {
	if !s.leaseLoss.seen.Load() {
		return time.Time{}, false
	}
	ns := s.leaseLoss.born.Load() * 1000
	if s.cfg.ClockSource == ClockRedis {
		ns -= s.offset.Load()
	}
	return time.Unix(0, ns), true
}

// leaseMarkerNow is the value a claim on c sets LeaseMarkerKey to when it
// is missing: when the leases were lost, at the latest. A store that has
// read the marker before saw it go since (a restart or a flush while it
// watched): now. A store that has not (it is starting) cannot know when the
// marker went, but a restart lost it no later than the server's start, and
// leases granted before then have expired once their lease_ttl has passed
// since: the start, by INFO's uptime (a second early, for its rounding), or
// now when INFO does not answer.
func (s *Redis) leaseMarkerNow(ctx context.Context, c any) int64 {
	now := s.leaseNow(s.cfg.Clock())
	if s.leaseLoss.seen.Load() {
		return now
	}
	info, ok := c.(interface {
		Info(context.Context, ...string) *redis.StringCmd
	})
	if !ok {
		return now
	}
	txt, err := info.Info(ctx, "server").Result()
	if err != nil {
		return now
	}
	for line := range strings.Lines(txt) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "uptime_in_seconds:"); ok {
			if up, err := strconv.ParseInt(v, 10, 64); err == nil && up >= 0 {
				return now - (up+1)*1_000_000
			}
		}
	}
	return now
}

// leaseWait writes the denial of every item that the marker's wait holds
// full at us and reports whether there was one; the others are not asked.
func (s *Redis) leaseWait(us int64, items []limit.SlotItem, out []limit.SlotDecision) bool {
	if !s.leaseLoss.seen.Load() {
		return false // lease.lua reads the marker (on a standalone server)
	}
	born := s.leaseLoss.born.Load()
	waiting := false
	for i := range items {
		end := born + max(items[i].TTL/1000, 1)
		if us < end {
			out[i] = limit.DecideSlot(items[i], items[i].Max, end*1000, us*1000, false)
			waiting = true
		} else {
			out[i] = limit.SlotDecision{Allowed: true, Remaining: items[i].Max} // not asked
		}
	}
	return waiting
}

// leaseScript and releaseScript are called with EVALSHA, and EVAL when the
// server answers NOSCRIPT (redis.Script.Run), as check.lua is.
var (
	leaseScript   = redis.NewScript(leaseLua)
	releaseScript = redis.NewScript(releaseLua)
)

// appendLeaseKey appends the Redis key of slot set k, el:{<k in hex>}:c. The
// whole key is its hash tag, so each set has its own Cluster slot; the tag's
// 32 hex digits keep it apart from the 16 of counter keys.
func appendLeaseKey(b []byte, k limit.SlotKey) []byte {
	b = append(b, "el:{"...)
	b = append(b, k.String()...)
	return append(b, "}:c"...)
}

// AcquireAt is the Redis form of Leases.AcquireAt: lease.lua drops expired
// leases (ZREMRANGEBYSCORE), counts the live ones (ZCARD) and, when every set
// has room, adds id to each (ZADD, scored by its expiry) — in one script run,
// so it is exact however many PoP servers share the Redis. now is shifted by
// the clock offset as a check's is (ClockRedis), so servers with skewed clocks
// agree on when a lease expires; expiries are kept in microseconds.
//
// On a standalone server all of a request's sets are one script run. In a
// Cluster each set has its own slot and its own run: the sets are taken in
// order, and when one is full the slots already taken are released again, so
// the request never holds more than it was admitted for, but another request
// may see one of those slots taken for that moment.
//
// The script calls do not join the check pipelines: a lease is a round trip
// of its own, bounded by the store's Timeout (or ctx's sooner deadline).
func (s *Redis) AcquireAt(ctx context.Context, now int64, id limit.LeaseID, items []limit.SlotItem, out []limit.SlotDecision) (bool, error) {
	if len(items) == 0 {
		return true, nil
	}
	if s.closed.Load() {
		return false, ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	us := s.leaseNow(now)
	if s.leaseWait(us, items, out) {
		s.leaseLoss.denials.Add(1)
		return false, nil
	}
	if !s.cluster {
		return s.acquire(ctx, us, id, items, out)
	}
	for i := range items {
		ok, err := s.acquire(ctx, us, id, items[i:i+1], out[i:i+1])
		if err == nil && ok {
			continue
		}
		if i > 0 { // give back what this request took
			keys := make([]limit.SlotKey, i)
			for j := range keys {
				keys[j] = items[j].Key
			}
			_, _ = s.release(context.WithoutCancel(ctx), us, limit.Lease{ID: id, Keys: keys})
			for j := range i {
				out[j] = limit.DecideSlot(items[j], out[j].InFlight-1, 0, now, false)
			}
		}
		for j := i + 1; j < len(items); j++ {
			out[j] = limit.SlotDecision{Allowed: true, Remaining: items[j].Max} // not asked
		}
		return false, err
	}
	return true, nil
}

// acquire runs lease.lua over items, whose sets share a slot, at us. On a
// standalone server the script also reads the lease marker (LeaseMarkerKey).
func (s *Redis) acquire(ctx context.Context, us int64, id limit.LeaseID, items []limit.SlotItem, out []limit.SlotDecision) (bool, error) {
	keys := make([]string, len(items), len(items)+1)
	args := make([]any, 2, 2+2*len(items))
	args[0], args[1] = us, id.String()
	var kb [64]byte
	for i := range items {
		keys[i] = string(appendLeaseKey(kb[:0], items[i].Key))
		args = append(args, items[i].Max, max(items[i].TTL/1000, 1))
	}
	want := 1 + 2*len(items)
	if !s.cluster {
		keys = append(keys, LeaseMarkerKey)
		want++
	}
	vals, err := leaseScript.Run(ctx, s.client, keys, args...).Int64Slice()
	if err != nil {
		return false, fmt.Errorf("store: redis lease of %d set(s): %w", len(items), err)
	}
	if len(vals) != want {
		return false, fmt.Errorf("store: redis lease: script returned %d values for %d sets", len(vals), len(items))
	}
	if !s.cluster {
		s.noteLeaseBorn(vals[want-1])
	}
	if vals[0] == 2 {
		s.leaseLoss.denials.Add(1)
	}
	ok := vals[0] == 1
	for i := range items {
		// Back to the caller's nanoseconds: oldest is on the server's
		// clock, as us is.
		oldest := vals[2+2*i] * 1000
		out[i] = limit.DecideSlot(items[i], vals[1+2*i], oldest, us*1000, ok)
	}
	return ok, nil
}

// ReleaseAt is the Redis form of Leases.ReleaseAt (release.lua: ZSCORE and
// ZREM in each set of the lease).
func (s *Redis) ReleaseAt(ctx context.Context, now int64, lease limit.Lease) (limit.ReleaseState, error) {
	if len(lease.Keys) == 0 {
		return limit.Unknown, nil
	}
	if s.closed.Load() {
		return limit.Unknown, ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	us := s.leaseNow(now)
	if !s.cluster {
		return s.release(ctx, us, lease)
	}
	state := limit.Unknown
	for _, k := range lease.Keys {
		st, err := s.release(ctx, us, limit.Lease{ID: lease.ID, Keys: []limit.SlotKey{k}})
		if err != nil {
			return state, err
		}
		state = state.Join(st)
	}
	return state, nil
}

func (s *Redis) release(ctx context.Context, us int64, lease limit.Lease) (limit.ReleaseState, error) {
	keys := make([]string, len(lease.Keys))
	var kb [64]byte
	for i, k := range lease.Keys {
		keys[i] = string(appendLeaseKey(kb[:0], k))
	}
	v, err := releaseScript.Run(ctx, s.client, keys, us, lease.ID.String()).Int64()
	if err != nil {
		return limit.Unknown, fmt.Errorf("store: redis release of %d set(s): %w", len(keys), err)
	}
	if v < 0 || v > int64(limit.Expired) {
		return limit.Unknown, fmt.Errorf("store: redis release: script returned %s", strconv.FormatInt(v, 10))
	}
	return limit.ReleaseState(v), nil
}

// leaseNow is now (ns, local clock) in microseconds on the clock that
// defines lease expiry: the server's with ClockRedis.
func (s *Redis) leaseNow(now int64) int64 {
	if s.cfg.ClockSource == ClockRedis {
		now += s.offset.Load()
	}
	return now / 1000
}
