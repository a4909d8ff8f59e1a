-- Record what became of tasks of one site in its history (history_lib.lua).
-- KEYS[1]  the site's history root
-- ARGV[1]  retention, s     ARGV[2]  most records kept for the site
-- ARGV[3..] six per task: fingerprint (6+ raw bytes), code (history_lib.lua), items, HTTP
--          status (0: none), consumer, reason ("" none; at most 40 bytes are kept)
-- Returns the number of records written.
--#include history_lib
local root = KEYS[1]
local retention, bound = tonumber(ARGV[1]), tonumber(ARGV[2])
local w = math.max(1, math.ceil(retention / HS_GENS))
local share = math.max(1, math.ceil(bound / HS_GENS))
local now = dd_now('')
local g, t, width = hs_root(root)
local fresh = (not g) or width ~= w
if fresh then g = (g or 0) + 1; t = now end
local st = hs_gen(root, w, g, t)
local written = 0
local names = {}
for i = 3, #ARGV, 6 do
  if not fresh and (now - t >= w or st.n >= share) then
    g = g + 1; t = now; fresh = true
    hs_drop(root, w, g - HS_GENS - 1)
    st = hs_gen(root, w, g, t)
  end
  if fresh then
    -- A new generation starts with one bucket (a dedup generation with 16): most sites
    -- keep few records, and a bucket key costs more than a few dozen records.
    st.b, st.m, st.p, st.dirty = 0, 1, 0, true
    redis.call('HSET', st.key, 't', t)
    fresh = false
  end
  local e = string.sub(ARGV[i], 1, 6)
  local who = ARGV[i + 4]
  local number = names[st.key .. who]
  if not number then
    number = redis.call('HGET', st.key, 'c:' .. who)
    if not number then
      number = tostring(redis.call('HINCRBY', st.key, 'ci', 1))
      redis.call('HSET', st.key, 'c:' .. who, number, 'i:' .. number, who)
    end
    names[st.key .. who] = number
  end
  local value = ARGV[i + 1] .. (now - t) .. ',' .. ARGV[i + 2] .. ',' .. ARGV[i + 3] .. ','
    .. number
  if ARGV[i + 5] ~= '' then value = value .. ',' .. string.sub(ARGV[i + 5], 1, 40) end
  local bucket = dd_bucket(st, e)
  if redis.call('HSET', bucket, e, value) == 1 then
    local n = st.n
    if n < DD_ARM_ALL then dd_touched[bucket] = st.expire end
    st.n = n + 1
    if st.n > DD_LOAD * (st.m + st.p) and st.b < DD_MAX_LEVEL then dd_split(st) end
  end
  st.dirty = true
  written = written + 1
end
redis.call('HSET', root, 'g', g, 't', t, 'w', w)
redis.call('EXPIREAT', root, t + (HS_GENS + 1) * w)
redis.call('EXPIREAT', st.key, st.expire)
dd_flush()
return written
