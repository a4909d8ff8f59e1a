-- dedup_seen.lua: which fingerprints a site has seen within its re-crawl window (read only).
-- KEYS[1]  the site's dedup root <ns>:seen:{site}
-- ARGV[1]  now, epoch seconds ('' = the server's TIME)
-- ARGV[2..] fingerprints, 16 raw bytes each
-- Returns  one 0/1 per fingerprint

--#include dedup_lib

local out = {}
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then  -- no root: nothing recorded
  for i = 2, #ARGV do out[#out + 1] = 0 end
  return out
end
local now = dd_now(ARGV[1])
for i = 2, #ARGV do out[#out + 1] = dd_seen(KEYS[1], ARGV[i], now) and 1 or 0 end
return out
