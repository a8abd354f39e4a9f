-- lease.lua: acquire one concurrency slot in every set of KEYS, all or none
-- (store.Redis.AcquireAt); a transcription of store.Leases.AcquireAt and
-- limit.DecideSlot. Each set is a sorted set of lease ids scored by their
-- expiry in microseconds since the epoch (exact in a Lua double until the
-- year 2255).
--
-- ARGV[1] now (µs), ARGV[2] the lease id, then per set i: ARGV[1+2i] its
-- max, ARGV[2+2i] its TTL (µs, > 0). KEYS are the sets, and after them,
-- optionally, the lease marker (store.LeaseMarkerKey; on a standalone
-- server): the time (µs) this Redis's lease sets began. A marker that is
-- missing means the Redis lost its data (it restarted without persistence,
-- or was flushed) and with it the leases held: it is set to now, and a set
-- whose TTL has not passed since the marker counts as full (leases granted
-- before the loss may still be in flight) — redis_leases.go.
-- Returns {admitted (1), not (0), or not because of the marker (2), then
-- per set: leases live before the decision (max while the marker holds it
-- full), the earliest expiry among them when the set was full (else 0; the
-- end of the marker's wait when that holds it full), and, with the marker,
-- the marker's value}.
local now = tonumber(ARGV[1])
local id = ARGV[2]
local sets = (#ARGV - 2) / 2
local born = nil
if #KEYS > sets then
  local m = KEYS[#KEYS]
  born = tonumber(redis.call('GET', m) or '')
  if not born then
    born = now
    redis.call('SET', m, ARGV[1])
  end
end
local out = {0}
local ok = 1
for i = 1, sets do
  local k = KEYS[i]
  -- A lease expires at its expiry instant, as in store.Leases.
  redis.call('ZREMRANGEBYSCORE', k, '-inf', now)
  local n = redis.call('ZCARD', k)
  local max = tonumber(ARGV[1 + 2 * i])
  local oldest = 0
  local unknown = born and now < born + tonumber(ARGV[2 + 2 * i])
  if unknown then
    ok = 2
    if n < max then n = max end
    oldest = born + tonumber(ARGV[2 + 2 * i])
  elseif n >= max then
    if ok == 1 then ok = 0 end
    if n > 0 then
      oldest = tonumber(redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')[2])
    end
  end
  out[2 * i] = n
  out[2 * i + 1] = oldest
end
if born then
  out[2 * sets + 2] = born
end
if ok == 1 then
  for i = 1, sets do
    local k = KEYS[i]
    local ttl = tonumber(ARGV[2 + 2 * i])
    redis.call('ZADD', k, now + ttl, id)
    -- The set outlives its newest lease by a second; never shorten it (a
    -- reload that shortened the TTL must not drop older, longer leases).
    local keep = math.ceil(ttl / 1000) + 1000
    if redis.call('PTTL', k) < keep then
      redis.call('PEXPIRE', k, keep)
    end
  end
end
out[1] = ok
return out
