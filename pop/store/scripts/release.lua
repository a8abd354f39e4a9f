-- release.lua: free a lease's slot in every set of KEYS
-- (store.Redis.ReleaseAt), a transcription of store.Leases.ReleaseAt.
-- ARGV[1] now (µs), ARGV[2] the lease id.
-- Returns 1 (released) when a set held it live, 2 (expired) when sets held
-- it only past its expiry, 0 (unknown) when none held it.
local now = tonumber(ARGV[1])
local id = ARGV[2]
local state = 0
for i = 1, #KEYS do
  local s = redis.call('ZSCORE', KEYS[i], id)
  if s then
    redis.call('ZREM', KEYS[i], id)
    if tonumber(s) > now then
      state = 1
    elseif state == 0 then
      state = 2
    end
  end
end
return state
