-- merge.lua: max-merge CRDT slots into a PoP's Redis, O(1) per slot.
--
-- A PoP counting across PoPs (RedisConfig.Replica) keeps, per limit key and
-- window, one hash of the other PoPs' counts, el:{<tag>}:m:<window index>:<key>
-- (the tag of the key's own state, so the same Cluster slot):
--   "=<replica>"  that replica's absolute count for the window (max-register)
--   "~g"          the running total of all "=" fields (global scope)
--   "~r"          the running total of the region peers' fields (region scope)
-- check.lua adds "~g" or "~r" of the current and previous window to the own
-- counts it peeks at, so a check stays O(1) whatever the number of PoPs.
--
-- ARGV[1] is the mode; then 4 fields per key i, from ARGV[2 + 4*(i-1)]:
--
-- "r" (remote): KEYS[i] is a remote hash; the fields are replica, count
--   (decimal), region (1 when the replica is a region peer, else 0), and the
--   TTL in ms (the end of the window after next, when the window is no longer
--   the previous one and so useless). A count above the one held replaces it
--   and adds the difference to the totals; a lower or equal one changes
--   nothing. So merging is idempotent and commutative: the totals are the sums
--   of per-replica maxima whatever the order or number of deliveries.
--
-- "o" (own restore): KEYS[i] is the own state of a window algorithm,
--   "index cur prev" as check.lua keeps it; the fields are the window index,
--   the count (decimal), the TTL in ms and an unused field. The own count of
--   that window is raised to at least count (never lowered); a window older
--   than the state's previous one is ignored. The key's TTL is never shortened.
--
-- Counts are Lua doubles: exact below 2^53, far above any real count.
-- Returns the number of slots that changed something.

local mode = ARGV[1]
local changed = 0

if mode == 'r' then
  for i = 1, #KEYS do
    local b = 2 + 4 * (i - 1)
    local k, field, n = KEYS[i], '=' .. ARGV[b], tonumber(ARGV[b + 1])
    local held = tonumber(redis.call('HGET', k, field) or '0') or 0
    if n > held then
      local diff = string.format('%d', n - held)
      redis.call('HSET', k, field, ARGV[b + 1])
      redis.call('HINCRBY', k, '~g', diff)
      if ARGV[b + 2] == '1' then redis.call('HINCRBY', k, '~r', diff) end
      redis.call('PEXPIRE', k, ARGV[b + 3])
      changed = changed + 1
    end
  end
  return changed
end

if mode == 'o' then
  for i = 1, #KEYS do
    local b = 2 + 4 * (i - 1)
    local k, wi, n, px = KEYS[i], tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
    local v = redis.call('GET', k)
    local s, c, p = wi, 0, 0
    if v then
      local vs, vc, vp = string.match(v, '^(%S+) (%S+) (%S+)$')
      s, c, p = tonumber(vs), tonumber(vc), tonumber(vp)
    end
    local write = false
    if not v or wi > s + 1 then
      s, c, p, write = wi, n, 0, true
    elseif wi == s then
      if n > c then c, write = n, true end
    elseif wi == s + 1 then
      s, c, p, write = wi, n, c, true
    elseif wi == s - 1 then
      if n > p then p, write = n, true end
    end
    if write then
      local ttl = redis.call('PTTL', k)
      if ttl > px then px = ttl end
      redis.call('SET', k, string.format('%d %d %d', s, c, p), 'PX', px)
      changed = changed + 1
    end
  end
  return changed
end

return redis.error_reply('merge.lua: unknown mode ' .. tostring(mode))
