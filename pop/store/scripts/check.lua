-- check.lua: limit.Decide for the items of one request, as one atomic step.
--
-- This is a transcription of pop/limit (limit.go, item.go, ring.go). Every
-- formula keeps the operand order of the Go code, so that IEEE doubles round
-- the same way and the shared table (limittest) agrees to the nanosecond.
--
-- Lua numbers are doubles, exact for integers below 2^53 (104 days in
-- nanoseconds) but not for Unix-epoch nanoseconds (~1.7e18). So no absolute
-- time is ever a Lua number: "now" arrives split as hi = floor(now / 1e9) and
-- lo = now - hi*1e9, stored times are decimal strings, and all arithmetic is on
-- offsets from now (rel) that are small exact integers. Window algorithms store
-- the window index floor(start / window) instead of a time.
--
-- KEYS[i]  the Redis key of item i
-- ARGV[1]  mode: "d" = decide (limit.Decide: peek all, add when admitted);
--                "p" = peek only (advance and peek; the only writes are the
--                      sliding log's expired entries, which advancing drops)
-- ARGV[2]  hits (>= 1)
-- ARGV[3]  now, decimal nanoseconds since the epoch (>= 0)
-- ARGV[4]  now's hi part, ARGV[5] now's lo part
-- then 9 fields per item i, from ARGV[6 + 9*(i-1)]:
--   algorithm (0 sliding_window, 1 fixed_window, 2 token_bucket, 3 gcra,
--   4 sliding_log), limit, window (ns), capacity (burst, or limit when 0),
--   shadow (0/1), window index floor(now / window), now - index*window,
--   remote (0, or r > 0 for an item counted across PoPs: its remote hashes
--   for windows index and index-1 are KEYS[n + r] and KEYS[n + r + 1], n the
--   number of items), total (the hash field holding the remote total the item
--   adds: "~g" global or "~r" region; see merge.lua).
--
-- An item counted across PoPs (window algorithms only) decides on own +
-- remote counts: its own state holds this PoP's hits exactly as for any
-- item, and the peek sees cur and prev raised by the remote running totals
-- merge.lua keeps; only own hits are ever added. When the own state is one
-- window ahead of now (a lagging clock), the remote total of window index
-- counts as prev and the newer window's remote total, not passed, as zero.
--
-- Stored values (all keys expire GRACE_MS after their state turns idle,
-- limit.Spec.IdleAt):
--   window algorithms  STRING "index cur prev"
--   token_bucket       STRING "start tokens"  (start decimal ns, tokens %.17g)
--   gcra               STRING "tat"           (decimal ns)
--   sliding_log        LIST of decimal ns, oldest pushed first
-- and, read only (merge.lua writes them, with their own TTL), the remote
-- HASHes of replicated items, whose "~g" and "~r" fields are the other PoPs'
-- running totals.
--
-- Returns 4 integers per item: allowed (0/1), remaining, reset, retry_after.

local E9 = 1000000000
local MAXNS = 4611686018427387904 -- 2^62: a cap no real duration reaches
-- TOLERANCE is limit.tolerance: float rounding of 1e-9 of a hit is no reason
-- to deny (a client waiting exactly its RetryAfter must fit).
local TOLERANCE = 1e-9
-- GRACE_MS outlives IdleAt by a second. A TTL runs on the server's clock,
-- decisions on the now each check brings; without the grace a server whose
-- now lags the server's clock would find the key of a full window already
-- gone and count that window again from zero.
local GRACE_MS = 1000

local mode = ARGV[1]
local hits = tonumber(ARGV[2])
local nowS, nowHi, nowLo = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])

-- rel returns t - now for a stored decimal time t >= 0, exact below 2^53.
local function rel(s)
  local n = #s
  if n <= 9 then
    return (0 - nowHi) * E9 + (tonumber(s) - nowLo)
  end
  return (tonumber(string.sub(s, 1, n - 9)) - nowHi) * E9 + (tonumber(string.sub(s, n - 8)) - nowLo)
end

-- abs formats now + d as a decimal time; d is an exact integer, now + d >= 0.
local function abs(d)
  if d == 0 then return nowS end
  local lo = nowLo + d
  local r = math.fmod(lo, E9)
  if r < 0 then r = r + E9 end
  local hi = nowHi + (lo - r) / E9
  if hi == 0 then return string.format('%d', r) end
  return string.format('%d%09d', hi, r)
end

-- ceil is limit.ceilNanos.
local function ceil(f)
  if f >= MAXNS then return MAXNS end
  return math.ceil(f)
end

-- interval is limit.Spec.interval: the GCRA emission interval of n hits.
local function interval(it, n)
  if it.limit == 0 then return it.w end
  return ceil(n * it.w / it.limit)
end

local states = {} -- by key, so that items naming the same key share one state

-- load returns the state of item it, reading it once per key.
local function load(it)
  local st = states[it.key]
  if st then return st end
  st = {}
  local a = it.alg
  if a == 4 then
    st.log = true
  else
    local v = redis.call('GET', it.key)
    if a <= 1 then
      st.s, st.c, st.p = 0, 0, 0
      if v then
        local s, c, p = string.match(v, '^(%S+) (%S+) (%S+)$')
        st.s, st.c, st.p = tonumber(s), tonumber(c), tonumber(p)
      end
    elseif a == 2 then
      if v then
        local t, k = string.match(v, '^(%S+) (%S+)$')
        st.r, st.k = rel(t), tonumber(k)
      end
    else
      if v then st.r = rel(v) end
    end
  end
  states[it.key] = st
  return st
end

-- advance is limit.Spec.Advance; it marks st dirty when st changed.
local function advance(it, st)
  local a = it.alg
  if a <= 1 then
    if it.idx <= st.s then
      -- same window, or a lagging clock: keep counting in the newest window
    elseif it.idx == st.s + 1 then
      st.p, st.c, st.s, st.dirty = st.c, 0, it.idx, true
    else
      st.p, st.c, st.s, st.dirty = 0, 0, it.idx, true
    end
  elseif a == 2 then
    local c = it.cap
    if st.r == nil then
      st.k, st.r, st.dirty = c, 0, true
      return
    end
    if 0 > st.r then
      st.k = math.min(c, st.k + (0 - st.r) * it.limit / it.w)
      st.r, st.dirty = 0, true
    end
    local k = math.min(c, st.k)
    if k ~= st.k then st.k, st.dirty = k, true end
  elseif a == 4 then
    local cutoff = 0 - it.w
    while true do
      local v = redis.call('LINDEX', it.key, 0)
      if not v or rel(v) > cutoff then break end
      redis.call('LPOP', it.key)
    end
  end
end

-- peek is limit.Spec.Peek; it returns allowed, remaining, reset, retry_after.
local function peek(it, st)
  local a, w, limit = it.alg, it.w, it.limit
  if a == 0 then
    local elapsed = it.off
    if st.s > it.idx then elapsed = 0 end -- lagging clock
    local startRel = (st.s - it.idx) * w - it.off -- st.Start - now
    local reset = math.max(startRel + w, 0)
    local weight = (w - elapsed) / w
    local est = st.p * weight + st.c
    if est + hits <= limit + TOLERANCE then
      return 1, math.max(math.floor(limit - est - hits + TOLERANCE), 0), reset, 0
    end
    local remaining = math.max(math.floor(limit - est), 0)
    if hits > limit then
      local idle = startRel
      if st.c > 0 then idle = startRel + 2 * w elseif st.p > 0 then idle = startRel + w end
      return 0, remaining, reset, math.max(idle, 1)
    end
    local room = limit - hits
    if st.c <= limit - hits then
      local e = w - (room - st.c) * w / st.p
      return 0, remaining, reset, math.max(ceil(e) - elapsed, 1)
    end
    local e = w - room * w / st.c
    return 0, remaining, reset, (w - elapsed) + math.max(ceil(e), 0)
  elseif a == 1 then
    local endRel = (st.s - it.idx) * w - it.off + w -- end - now
    local reset = math.max(endRel, 0)
    if st.c + hits <= limit then
      return 1, limit - st.c - hits, reset, 0
    end
    return 0, math.max(limit - st.c, 0), reset, math.max(endRel, 1)
  elseif a == 2 then
    local c = it.cap
    local perNano = limit / w
    local allowed, retry = 0, 0
    local left = st.k
    if left + TOLERANCE >= hits then
      allowed = 1
      left = math.max(left - hits, 0)
    elseif perNano > 0 and hits <= c then
      retry = math.max(ceil((hits - left) / perNano), 1)
    else
      retry = w
    end
    local reset = 0
    if perNano > 0 then reset = ceil((c - left) / perNano) end
    return allowed, math.max(math.floor(left), 0), reset, retry
  elseif a == 3 then
    local tau = interval(it, it.cap)
    local tat = 0 -- max(st.Start, now) - now
    if st.r and st.r > 0 then tat = st.r end
    local nextRel = tat + interval(it, hits)
    local allowed, retry = 0, 0
    if limit > 0 and nextRel <= tau then
      allowed = 1
      tat = nextRel
    elseif limit > 0 and hits <= it.cap then
      retry = math.max(nextRel - tau, 1)
    else
      retry = w
    end
    local remaining = 0
    if limit > 0 then
      local one = interval(it, 1)
      local x = tau - tat
      if x > 0 then remaining = math.floor(x / one) end
    end
    return allowed, remaining, tat, retry
  else
    local n = redis.call('LLEN', it.key)
    if n + hits <= limit then
      return 1, limit - n - hits, w, 0
    end
    local remaining = math.max(limit - n, 0)
    local reset = 0
    if n > 0 then reset = rel(redis.call('LINDEX', it.key, -1)) + w end
    if hits > limit or n == 0 then
      return 0, remaining, reset, math.max(reset, 1)
    end
    local at = redis.call('LINDEX', it.key, n + hits - limit - 1)
    return 0, remaining, reset, math.max(rel(at) + w, 1)
  end
end

-- add is limit.Spec.Add.
local function add(it, st)
  local a = it.alg
  if a <= 1 then
    st.c = st.c + hits
  elseif a == 2 then
    st.k = math.max(st.k - hits, 0) -- within tolerance of empty is empty
  elseif a == 3 then
    local tat = 0
    if st.r and st.r > 0 then tat = st.r end
    st.r = tat + interval(it, hits)
  else
    local left = hits
    while left > 0 do
      local n = math.min(left, 100)
      local vals = {}
      for j = 1, n do vals[j] = nowS end
      redis.call('RPUSH', it.key, unpack(vals))
      left = left - n
    end
    redis.call('PEXPIRE', it.key, math.max(ceil(it.w / 1000000), 1) + GRACE_MS)
    return
  end
  st.dirty = true
end

-- idle is limit.Spec.IdleAt(st) - now.
local function idle(it, st)
  local a, w = it.alg, it.w
  if a <= 1 then
    local startRel = (st.s - it.idx) * w - it.off
    if st.c > 0 then
      if a == 0 then return startRel + 2 * w end
      return startRel + w
    end
    if a == 0 and st.p > 0 then return startRel + w end
    return startRel
  elseif a == 2 then
    if it.limit == 0 then return st.r end
    local missing = it.cap - st.k
    return st.r + ceil(missing * w / it.limit)
  end
  return st.r
end

local function encode(it, st)
  local a = it.alg
  if a <= 1 then return string.format('%d %d %d', st.s, st.c, st.p) end
  if a == 2 then return abs(st.r) .. ' ' .. string.format('%.17g', st.k) end
  return abs(st.r)
end

-- nitems is the number of items; KEYS after them are remote hashes.
local nitems = (#ARGV - 5) / 9

-- remoteTotal returns the remote running total field f of hash k, 0 if none.
local function remoteTotal(k, f)
  return tonumber(redis.call('HGET', k, f) or '0') or 0
end

-- view is the state the peek of a replicated item sees: own plus remote.
local function view(it, st)
  if it.rk == 0 or it.alg > 1 then return st end
  local n = nitems -- the remote keys follow the items'
  local rc, rp = 0, 0
  if st.s == it.idx then
    rc = remoteTotal(KEYS[n + it.rk], it.field)
    rp = remoteTotal(KEYS[n + it.rk + 1], it.field)
  elseif st.s == it.idx + 1 then
    rp = remoteTotal(KEYS[n + it.rk], it.field)
  end
  return { s = st.s, c = st.c + rc, p = st.p + rp }
end

-- out holds 4 integers per item: allowed, remaining, reset, retry_after.
local items, out = {}, {}
for i = 1, nitems do
  local b = 6 + 9 * (i - 1)
  local it = {
    key = KEYS[i], alg = tonumber(ARGV[b]), limit = tonumber(ARGV[b + 1]),
    w = tonumber(ARGV[b + 2]), cap = tonumber(ARGV[b + 3]), shadow = ARGV[b + 4] == '1',
    idx = tonumber(ARGV[b + 5]), off = tonumber(ARGV[b + 6]),
    rk = tonumber(ARGV[b + 7]), field = ARGV[b + 8],
  }
  items[i] = it
  local st = load(it)
  advance(it, st)
  local j = 4 * (i - 1)
  out[j + 1], out[j + 2], out[j + 3], out[j + 4] = peek(it, view(it, st))
end
if mode == 'p' then return out end

local ok = true -- limit.Admit
for i = 1, #items do
  if out[4 * i - 3] == 0 and not items[i].shadow then ok = false end
end
for i = 1, #items do
  if out[4 * i - 3] == 1 then
    if ok then
      add(items[i], states[items[i].key])
    else
      out[4 * i - 2] = out[4 * i - 2] + hits -- nothing was spent, so the room is what it was
    end
  end
end

for i = 1, #items do
  local it = items[i]
  local st = states[it.key]
  if st.dirty then
    st.dirty = false -- written once, however many items share the key
    local px = math.max(ceil(idle(it, st) / 1000000), 1) + GRACE_MS
    redis.call('SET', it.key, encode(it, st), 'PX', px)
  end
end
return out
