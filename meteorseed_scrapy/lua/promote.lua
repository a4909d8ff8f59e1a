-- Move due tasks from the delayed set into their task streams, atomically (any worker may run
-- this; each task is moved exactly once). A member is '<lane>:<band>|<message JSON>' (defer.lua);
-- a bare JSON member (written before lanes) or an unknown route goes to the default stream.
-- KEYS[1]    the delayed set
-- KEYS[2..]  the task streams
-- ARGV[1]    maximum number to move
-- ARGV[2]    message format version
-- ARGV[3]    position (1-based, among KEYS[2..]) of the default stream <ns>:tasks
-- ARGV[4..]  the route '<lane>:<band>' of each of KEYS[2..], in the same order
-- Returns {moved, ms until the next one is due (-1: none left)}.

--#include counts_lib
--#include progress_lib

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local progress = pg_prefix_of_delayed(KEYS[1])
local routes = {}
for k = 4, #ARGV do routes[ARGV[k]] = KEYS[k - 2] end
local default = KEYS[1 + tonumber(ARGV[3])]
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, member in ipairs(due) do
  local stream, message = default, member
  local bar = string.find(member, '|', 1, true)
  if string.sub(member, 1, 1) ~= '{' and bar then
    stream = routes[string.sub(member, 1, bar - 1)] or default
    message = string.sub(member, bar + 1)
  end
  redis.call('XADD', stream, '*', 'v', ARGV[2], 't', message)
  count_added(stream, 1)
  count_field(stream, 'readded', 1)
  redis.call('ZREM', KEYS[1], member)
  -- No longer delayed (progress_lib.lua): its seed and site read from the message itself.
  local ok, task = pcall(cjson.decode, message)
  if ok and type(task) == 'table' then
    pg_add(progress, task.seed_id, task.site_id, 'delayed', -1)
  else
    pg_add(progress, '', '', 'delayed', -1)
  end
end
pg_flush(nil, '', 0, false)
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local wait = -1
if nxt[2] then
  wait = math.max(0, tonumber(nxt[2]) - now)
end
return {#due, wait}
