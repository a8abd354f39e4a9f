package store

import (
	"context"
	_ "embed" // the Lua scripts
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/pop/limit"
)

//go:embed scripts/lease.lua
var leaseLua string

//go:embed scripts/release.lua
var releaseLua string

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

// acquire runs lease.lua over items, whose sets share a slot, at us.
func (s *Redis) acquire(ctx context.Context, us int64, id limit.LeaseID, items []limit.SlotItem, out []limit.SlotDecision) (bool, error) {
	keys := make([]string, len(items))
	args := make([]any, 2, 2+2*len(items))
	args[0], args[1] = us, id.String()
	var kb [64]byte
	for i := range items {
		keys[i] = string(appendLeaseKey(kb[:0], items[i].Key))
		args = append(args, items[i].Max, max(items[i].TTL/1000, 1))
	}
	vals, err := leaseScript.Run(ctx, s.client, keys, args...).Int64Slice()
	if err != nil {
		return false, fmt.Errorf("store: redis lease of %d set(s): %w", len(items), err)
	}
	if len(vals) != 1+2*len(items) {
		return false, fmt.Errorf("store: redis lease: script returned %d values for %d sets", len(vals), len(items))
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
