-- The newest history record of one URL of a site (history_lib.lua).
-- KEYS[1]  the site's history root    ARGV[1]  the URL's fingerprint (6+ raw bytes)
-- Returns {} when none, else {record, start of its generation (epoch s), consumer}.
--#include history_lib
local root = KEYS[1]
local g, _, w = hs_root(root)
if not g then return {} end
local e = string.sub(ARGV[1], 1, 6)
for k = g, math.max(1, g - HS_GENS), -1 do
  local st = hs_gen(root, w, k, nil)
  if st.n > 0 then
    local value = redis.call('HGET', dd_bucket(st, e), e)
    if value then
      local who = string.match(value, '^%a%d+,%d+,%d+,(%d+)') or ''
      local info = redis.call('HMGET', st.key, 't', 'i:' .. who)
      return {value, info[1] or '0', info[2] or ''}
    end
  end
end
return {}
