-- dedup_release.lua: forget URLs in a site's dedup layer, so a later seed may enqueue them.
-- KEYS[1]  the site's dedup root <ns>:seen:{site}
-- ARGV[1]  now, epoch seconds ('' = the server's TIME)
-- ARGV[2..] fingerprints, 16 raw bytes each
-- Returns  the number of entries removed

--#include dedup_lib

local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'hash' then return 0 end  -- no root: nothing recorded (or not ours)
local now = dd_now(ARGV[1])
local removed = 0
for i = 2, #ARGV do removed = removed + dd_release(KEYS[1], ARGV[i], now) end
dd_flush()
return removed
