-- Settle tasks of a cancelled seed as 'cancelled' (progress_lib.lua: the seed's and site's
-- 'cancelled' counter; its outstanding count down), each at most once, whoever gets to it:
--   'unread'  entries of a task stream no consumer has read yet (after the group's
--             last-delivered id), deleted (a cancel: meteorseed seeds cancel);
--   'pending' entries still pending on a consumer, acked and deleted (a worker that read one);
--   'delayed' members of a delayed set, removed (counted out of 'delayed' too).
-- KEYS[1]   the task stream, or the delayed set ('delayed')
-- ARGV[1]   'unread', 'pending' or 'delayed'
-- ARGV[2]   consumer group
-- ARGV[3]   the consumer ('pending'; else ignored)
-- ARGV[4]   the crawl events stream ('' = none: a sharded layout, the caller judges the end)
-- ARGV[5]   now, epoch seconds (text)
-- ARGV[6]   seconds a finished seed's counters are kept (0 = for ever)
-- ARGV[7..] per task, 3 values: message id (or delayed-set member), seed_id, site_id
-- Returns {settled, seeds}: how many were settled here, and the seeds whose outstanding count
-- reached zero here.

--#include progress_lib

local mode, group = ARGV[1], ARGV[2]
local prefix
if mode == 'delayed' then
  prefix = pg_prefix_of_delayed(KEYS[1])
else
  prefix = pg_prefix_of_stream(KEYS[1])
end

-- An id as two numbers (ms, seq); '0-0' for anything else.
local function parts(id)
  local ms, seq = string.match(id or '', '^(%d+)-(%d+)$')
  return tonumber(ms or 0), tonumber(seq or 0)
end

local last_ms, last_seq = -1, -1
if mode == 'unread' then
  last_ms, last_seq = 0, 0
  local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', KEYS[1])
  if ok then
    for _, g in ipairs(groups) do
      local fields = {}
      for i = 1, #g, 2 do fields[g[i]] = g[i + 1] end
      if fields['name'] == group then
        last_ms, last_seq = parts(fields['last-delivered-id'])
      end
    end
  end
end

local settled = 0
for i = 7, #ARGV - 2, 3 do
  local id, seed, site = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local gone = 0
  if mode == 'delayed' then
    gone = redis.call('ZREM', KEYS[1], id)
    if gone == 1 then pg_add(prefix, seed, site, 'delayed', -1) end
  elseif mode == 'pending' then
    if redis.call('XPENDING', KEYS[1], group, id, id, 1, ARGV[3])[1] then
      redis.call('XACK', KEYS[1], group, id)
      redis.call('XDEL', KEYS[1], id)
      gone = 1
    end
  else
    local ms, seq = parts(id)
    if ms > last_ms or (ms == last_ms and seq > last_seq) then
      gone = redis.call('XDEL', KEYS[1], id)
    end
  end
  if gone == 1 then
    settled = settled + 1
    pg_add(prefix, seed, site, 'cancelled', 1)
    pg_add(prefix, seed, site, 'outstanding', -1)
  end
end
local zeroed = pg_flush(ARGV[4], ARGV[5], tonumber(ARGV[6]) or 0, false)
return {settled, zeroed}
