-- check.lua: limit.Decide for a batch of calls. A call is the items of one
-- request (or, in a Cluster, those of one slot of a request); each call is
-- one atomic step, and so is the whole batch, since a script runs alone. The
-- store packs many concurrent requests' calls into one script run so that
-- Redis pays its fixed cost of a script call (command dispatch, the call
-- setup, the KEYS and ARGV tables) once per batch rather than once per call.
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
-- ARGV[1] holds the calls back to back, packed in binary (struct.pack
-- formats, little-endian; integers i8 are int64, so tonumber's rounding of a
-- decimal and struct's conversion of an int64 give the same double). Binary
-- and one argument for the whole batch, because Redis spends about as much
-- per command argument (parsing it, an object, a Lua string) as on the
-- arithmetic of an item, and the client formats each one too. Each call is
-- a header "<c1i8i8i8i4":
--   mode: "d" = decide (limit.Decide: peek all, add when admitted);
--         "p" = peek only (advance and peek; the only writes are the
--               sliding log's expired entries, which advancing drops)
--         "c" = count the hits of the items marked to count denied hits,
--               and nothing else (a denied request spanning slots)
--   hits (>= 1), now's hi part, now's lo part (now >= 0), n (its items)
-- then its n items, each "<BBi8i8" and its algorithm's own fields:
--   algorithm (0 sliding_window, 1 fixed_window, 2 token_bucket, 3 gcra,
--   4 sliding_log), shadow (0, 1 shadow, 2 counts its hits even when the
--   request is denied: limit.Item.CountDenied, 3 both: a shadow item that
--   counts its hits past its limit too), limit, window (ns), then
--     sliding_window, fixed_window "<i8i8i4BdB": window index
--       floor(now / window), now - index*window, remote (0, or r > 0 for an
--       item counted across PoPs: its remote hashes for windows index and
--       index-1 are the call's remote keys r and r + 1), total (with a '~'
--       before it, the hash field holding the remote total the item adds:
--       "g" global or "r" region, 0 when remote is 0; see merge.lua), and
--       unheard: limit.State.Unheard, the hits the other PoPs probably
--       admitted since their last news, guessed by the server
--       (redis_estimate.go; 0 when not counted across PoPs), and shrunk (1:
--       limit.Item.Shrunk, the previous window counts at most the limit;
--       only for an item counted across PoPs)
--     token_bucket, gcra "<i8": capacity (burst, or limit when 0)
--     sliding_log: nothing more
-- KEYS holds, call after call, the Redis key of each of the call's items,
-- then the call's remote keys: two per item counted across PoPs, in item
-- order.
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
-- Returns, call after call, 4 integers per item: allowed (0/1), remaining,
-- reset, retry_after; or, for a call that failed (a command error such as
-- WRONGTYPE), one error reply in place of all of that call's integers, so
-- that one bad call does not fail the others of its batch.

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

-- The current call's hits and now, set by the loop at the end before each
-- call; the functions below read them as upvalues. nowS, now as a decimal
-- string, is made only when a call writes a time (nowStr).
local hits, nowHi, nowLo, nowS

-- nowStr returns now as a decimal string.
local function nowStr()
  if not nowS then
    if nowHi == 0 then
      nowS = string.format('%d', nowLo)
    else
      nowS = string.format('%d%09d', nowHi, nowLo)
    end
  end
  return nowS
end

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
  if d == 0 then return nowStr() end
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

-- states holds the current call's states by key, so that items naming the
-- same key share one state. It is fresh for each call: a state holds times
-- relative to its call's now, and each call writes back what it changed, so
-- the next call reads it again.
local states

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
    local unheard = st.u or 0
    local est = st.p * weight + st.c + unheard
    if est + hits <= limit + TOLERANCE then
      return 1, math.max(math.floor(limit - est - hits + TOLERANCE), 0), reset, 0
    end
    local remaining = math.max(math.floor(limit - est), 0)
    if hits > limit then
      local idle = startRel
      if st.c > 0 then idle = startRel + 2 * w elseif st.p > 0 then idle = startRel + w end
      return 0, remaining, reset, math.max(idle, 1)
    end
    -- Denied on the guess alone: retry at once, no bit (see peekSliding).
    local heard = est - unheard
    if heard + hits <= limit + TOLERANCE then
      return 0, remaining, reset, 1
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
    local cur = st.c + math.ceil((st.u or 0) - TOLERANCE)
    if cur + hits <= limit then
      return 1, limit - cur - hits, reset, 0
    end
    if st.c + hits <= limit then
      return 0, math.max(limit - cur, 0), reset, 1 -- denied on the guess alone
    end
    return 0, math.max(limit - cur, 0), reset, math.max(endRel, 1)
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
      local t = nowStr()
      for j = 1, n do vals[j] = t end
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

-- remoteTotal returns the remote running total field f of hash k, 0 if none.
local function remoteTotal(k, f)
  return tonumber(redis.call('HGET', k, f) or '0') or 0
end

-- view is the state the peek of a replicated item sees: own plus remote.
-- it.rk is the KEYS index of its remote hash for window idx (0: none).
local function view(it, st)
  if it.rk == 0 then return st end
  local rc, rp = 0, 0
  if st.s == it.idx then
    rc = remoteTotal(KEYS[it.rk], it.field)
    rp = remoteTotal(KEYS[it.rk + 1], it.field)
  elseif st.s == it.idx + 1 then
    rp = remoteTotal(KEYS[it.rk], it.field)
  end
  local p = st.p + rp
  if it.shrunk and p > it.limit then p = it.limit end -- see limit.Item.Shrunk
  return { s = st.s, c = st.c + rc, p = p, u = it.u }
end

-- decide runs one call: its items are items[1..n], its mode is mode. It
-- writes 4 integers per item to res[o + 1 .. o + 4n].
local function decide(mode, items, n, res, o)
  states = {}
  for i = 1, n do
    local it = items[i]
    local st = load(it)
    advance(it, st)
    local j = o + 4 * (i - 1)
    res[j + 1], res[j + 2], res[j + 3], res[j + 4] = peek(it, view(it, st))
  end
  if mode == 'p' then return end

  if mode == 'c' then
    for i = 1, n do
      if items[i].cd then add(items[i], states[items[i].key]) end
    end -- the caller keeps the answers of its peek
  else
    local ok = true -- limit.Admit
    for i = 1, n do
      if res[o + 4 * i - 3] == 0 and not items[i].shadow then ok = false end
    end
    for i = 1, n do
      if res[o + 4 * i - 3] == 1 and ok then
        add(items[i], states[items[i].key])
      elseif items[i].cd then
        add(items[i], states[items[i].key]) -- Envoy's way: denied hits count too
        if res[o + 4 * i - 3] == 0 then res[o + 4 * i - 2] = 0 end -- and leave no room
      elseif res[o + 4 * i - 3] == 1 then
        res[o + 4 * i - 2] = res[o + 4 * i - 2] + hits -- nothing was spent, so the room is what it was
      end
    end
  end

  for i = 1, n do
    local it = items[i]
    local st = states[it.key]
    if st.dirty then
      st.dirty = false -- written once, however many items share the key
      local px = math.max(ceil(idle(it, st) / 1000000), 1) + GRACE_MS
      redis.call('SET', it.key, encode(it, st), 'PX', px)
    end
  end
end

-- FIELDS maps a remote total's byte to its hash field.
local FIELDS = { [string.byte('g')] = '~g', [string.byte('r')] = '~r' }

-- res holds every call's answers; o is how many it holds. p is the position
-- in blob of the next call, k the KEYS index of its first key.
local sunpack, blob = struct.unpack, ARGV[1]
local res, o, p, k, nblob = {}, 0, 1, 1, #blob
while p <= nblob do
  local mode, n
  mode, hits, nowHi, nowLo, n, p = sunpack('<c1i8i8i8i4', blob, p)
  nowS = nil
  -- The call's layout is read before it runs, so that a failing call
  -- still leaves p and k at the next one.
  local items, rkeys, nr = {}, k + n, 0 -- rkeys: the KEYS index of its first remote key
  for i = 1, n do
    local alg, shadow, lim, w
    alg, shadow, lim, w, p = sunpack('<BBi8i8', blob, p)
    local it = { key = KEYS[k + i - 1], alg = alg, limit = lim, w = w, shadow = shadow % 2 == 1, cd = shadow >= 2, rk = 0 }
    if alg <= 1 then
      local r, f, shrunk
      it.idx, it.off, r, f, it.u, shrunk, p = sunpack('<i8i8i4BdB', blob, p)
      it.shrunk = shrunk == 1
      if r > 0 then
        it.rk, it.field = rkeys + r - 1, FIELDS[f]
        nr = nr + 2
      end
    elseif alg <= 3 then
      it.cap, p = sunpack('<i8', blob, p)
    end
    items[i] = it
  end
  k = k + n + nr
  local done, err = pcall(decide, mode, items, n, res, o)
  if done then
    o = o + 4 * n
  else
    for j = o + 1, o + 4 * n do res[j] = nil end
    if type(err) == 'table' then err = err.err end
    o = o + 1
    res[o] = { err = tostring(err) }
  end
end
return res
