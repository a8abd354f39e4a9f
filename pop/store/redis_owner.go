package store

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// A Redis belongs to one replica (DESIGN.md "How counts flow between PoPs").
// The servers of one PoP share their Redis under one replica name, and every
// hit is counted once in it; a second PoP counting into the same Redis would
// publish the first one's hits as its own and the first would publish the
// second's, so every hit of a region or global limit would count twice
// everywhere (a global limit of 100 admitting about 50).
//
// So the Redis holds a marker, the key OwnerKey, whose value names the
// replica that counts into it. A store with a replica name claims it (sets it
// when it is absent) and checks it:
//
//   - at open, when Redis answers: a marker naming another replica is an
//     error, and the PoP does not start;
//   - on every new connection (standalone servers; go-redis's OnConnect), so
//     that after a reconnect or a Redis restart nothing is counted on a
//     connection before the claim is checked;
//   - on every Ping (each second, the PoP's readiness probe; the only check on
//     a Cluster, where a connection is to one node and the marker in one slot).
//
// While the marker names another replica the store is in conflict: checks
// fail with an error wrapping ErrReplicaConflict (the Fallback then decides
// on this server's own counts), Delta, Own and Remote publish nothing, and
// Ping reports the conflict (/readyz fails and the error is logged). It ends
// when a check finds the marker this store's again — the operator gave the
// PoPs their own servers and deleted the marker, as the error says.
//
// A store without a replica name (a PoP that does not replicate) claims
// nothing; it checks that the marker, if any, names no replica, since its
// hits would be published as that replica's own.

// OwnerKey is the Redis key naming the replica whose counts the server holds.
const OwnerKey = "el:replica"

// ErrReplicaConflict is wrapped by the errors of a store whose Redis is
// claimed by another replica.
var ErrReplicaConflict = errors.New("redis is used by another PoP")

// claimScript sets OwnerKey (KEYS[1]) to ARGV[1] unless it is set (or
// ARGV[1] is empty), and LeaseMarkerKey (KEYS[2]) to ARGV[2], the store's
// lease clock in µs, unless it is set; it returns both values (the owner empty
// when none). The lease marker rides on the claim because the claim runs
// where a Redis that lost its data is first met — at open, on every new
// connection, on every Ping — and re-creates OwnerKey there, which would
// hide the loss from anything that looked at OwnerKey later
// (redis_leases.go).
var claimScript = redis.NewScript(`
local born = redis.call('GET', KEYS[2])
if not (born and tonumber(born)) then
  born = ARGV[2]
  redis.call('SET', KEYS[2], born)
end
local v = redis.call('GET', KEYS[1])
if not v then
  v = ARGV[1]
  if v ~= '' then redis.call('SET', KEYS[1], v) end
end
return {v, born}`)

// ownerState is the outcome of the store's last claim.
type ownerState struct {
	conflict atomic.Pointer[error] // non-nil while another replica owns the Redis
}

// claim claims the Redis for the store's replica on c (the client, or one
// new connection) and records the outcome. It returns nil when the Redis is
// this replica's (or, for a store without a replica name, no replica's), an
// error wrapping ErrReplicaConflict when it is another's, or the call's
// error, which changes nothing recorded.
func (s *Redis) claim(ctx context.Context, c redis.Scripter) error {
	vals, err := claimScript.Run(ctx, c, []string{OwnerKey, LeaseMarkerKey}, s.cfg.Replica, s.leaseMarkerNow(ctx, c)).StringSlice()
	if err == nil && len(vals) != 2 {
		err = fmt.Errorf("script returned %d values, want 2", len(vals))
	}
	if err != nil {
		if conflict := s.ownerConflict(); conflict != nil && errors.Is(err, ErrReplicaConflict) {
			return conflict // a new connection's check (onConnect) found it; go-redis may keep only its sentinel
		}
		return fmt.Errorf("store: redis: checking the PoP marker %s: %w", OwnerKey, err)
	}
	owner := vals[0]
	s.noteLeaseMarker(vals[1])
	if owner == s.cfg.Replica {
		s.owner.conflict.Store(nil)
		return nil
	}
	err = s.conflictErr(owner)
	s.owner.conflict.Store(&err)
	return err
}

// conflictErr names both replicas and the fix.
func (s *Redis) conflictErr(owner string) error {
	url := RedactURL(s.cfg.URL)
	if s.cfg.Replica == "" {
		return fmt.Errorf("%w: %s holds the counts of PoP %q and this server has no --pop; run it with --pop %s "+
			"(it is one of that PoP's servers) or give it a Redis of its own", ErrReplicaConflict, url, owner, owner)
	}
	return fmt.Errorf("%w: %s holds the counts of PoP %q, and this server is PoP %q; two PoPs on one Redis would each "+
		"publish the other's hits as their own and count every region and global hit twice. Give each PoP its own Redis "+
		"(the servers of one PoP share it under one --pop name), or, if PoP %q no longer uses this Redis, delete the "+
		"marker: redis-cli -u <url> DEL %s", ErrReplicaConflict, url, owner, s.cfg.Replica, owner, OwnerKey)
}

// conflictErr returns the recorded conflict, or nil.
func (s *Redis) ownerConflict() error {
	if p := s.owner.conflict.Load(); p != nil {
		return *p
	}
	return nil
}

// onConnect checks the marker on a new connection (RedisConfig of a
// standalone server): a connection to a Redis of another replica fails.
func (s *Redis) onConnect(ctx context.Context, cn *redis.Conn) error {
	err := s.claim(ctx, cn)
	if errors.Is(err, ErrReplicaConflict) {
		return err
	}
	return nil // a failed call is the connection's own problem, reported by the command that follows
}
