-- lease.lua: acquire one concurrency slot in every set of KEYS, all or none
-- (store.Redis.AcquireAt); a transcription of store.Leases.AcquireAt and
-- limit.DecideSlot. Each set is a sorted set of lease ids scored by their
-- expiry in microseconds since the epoch (exact in a Lua double until the
-- year 2255).
--
-- ARGV[1] now (µs), ARGV[2] the lease id, then per key i: ARGV[1+2i] its
-- max, ARGV[2+2i] its TTL (µs, > 0).
-- Returns {admitted (0/1), then per key: leases live before the decision,
-- the earliest expiry among them when the set was full (else 0)}.
local now = tonumber(ARGV[1])
local id = ARGV[2]
local out = {0}
local ok = 1
for i = 1, #KEYS do
  local k = KEYS[i]
  -- A lease expires at its expiry instant, as in store.Leases.
  redis.call('ZREMRANGEBYSCORE', k, '-inf', now)
  local n = redis.call('ZCARD', k)
  local oldest = 0
  if n >= tonumber(ARGV[1 + 2 * i]) then
    ok = 0
    if n > 0 then
      oldest = tonumber(redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')[2])
    end
  end
  out[2 * i] = n
  out[2 * i + 1] = oldest
end
if ok == 1 then
  for i = 1, #KEYS do
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
