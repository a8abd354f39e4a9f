package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/pop/limit"
)

// The servers sharing one Redis.
//
// Servers that share a Redis (the servers of one PoP) count every hit once
// there. When Redis cannot answer, each falls back on its own embedded store
// (Fallback), which knows only its own hits: k servers deciding alone would
// admit up to k times a limit's room. So each server keeps, in Redis, how
// many servers share it — a sorted set of their ids, scored by Redis's clock
// at each one's last Ping — and while it falls back it admits within 1/k of
// each limit, so that together they stay within it. The count is the one
// last read; a server that never reached Redis counts itself alone.

// ServersKey is the sorted set of the servers using a Redis database.
const ServersKey = "el:servers"

// serverTTL is how long a server that stopped pinging still counts: several
// health intervals, so that a slow ping does not drop a live server.
const serverTTL = 10 * time.Second

var serversScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return redis.call('ZCARD', KEYS[1])`)

// serverSet is a Redis store's id among the servers and their last count.
type serverSet struct {
	id    string
	count atomic.Int64 // 0: never read
}

// register adds this server to ServersKey and reads how many there are.
func (s *Redis) register(ctx context.Context) {
	if s.servers.id == "" {
		return
	}
	n, err := serversScript.Run(ctx, s.client, []string{ServersKey}, s.servers.id, serverTTL.Milliseconds()).Int64()
	if err == nil && n > 0 {
		s.servers.count.Store(n)
	}
}

// unregister takes this server out of ServersKey on a clean close, so that a
// restart does not count it twice; after a crash it ages out (serverTTL).
func (s *Redis) unregister() {
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_ = s.client.ZRem(ctx, ServersKey, s.servers.id).Err()
}

// Servers returns how many servers shared this Redis when it last answered
// a Ping (this one included), and 1 before any.
func (s *Redis) Servers() int { return int(max(s.servers.count.Load(), 1)) }

// newServerID returns a random id for this process's store.
func newServerID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// shared is a primary that several servers share (Redis); Fallback splits
// the limits among them while it decides without it.
type shared interface{ Servers() int }

// splitItems returns items with every limit and burst divided by k,
// rounded down, in buf when it is large enough: what one of k servers
// deciding alone may admit so that all k together stay within each limit.
// A burst that divides to nothing leaves no capacity (a burst of 0 would
// mean the whole limit).
func splitItems(items []limit.Item, k int, buf []limit.Item) []limit.Item {
	out := buf[:0]
	for _, it := range items {
		it.Spec.Limit /= int64(k)
		if it.Spec.Burst > 0 {
			it.Spec.Burst /= int64(k)
			if it.Spec.Burst == 0 {
				it.Spec.Limit = 0
			}
		}
		out = append(out, it)
	}
	return out
}
