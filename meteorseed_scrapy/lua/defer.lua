-- Defer a task durably: put its (possibly updated) message in the delayed set, due at a given
-- time, then ack and delete the stream entry, atomically. A worker crash never loses it, and a
-- waiting retry holds no download slot and no memory in any worker.
-- KEYS[1]  the task stream the entry was delivered from
-- KEYS[2]  the delayed set (zset: message JSON -> due time, ms)
-- ARGV[1]  consumer group
-- ARGV[2]  message id
-- ARGV[3]  due time, ms since the epoch (Redis TIME is added when ARGV[5] is '1')
-- ARGV[4]  the delayed-set member: '<lane>:<band>|<task message JSON>', where it goes when
--          due (promote.lua)
-- ARGV[5]  '1' if ARGV[3] is a delay relative to Redis TIME
-- ARGV[6]  why it waits: a code 1..15 (queue/fleet/delayed.py), recorded as the score's fraction:
--          due - 1 + code / 16, which promote.lua (comparing with whole ms) moves at the same
--          ms as the whole due time; absent or 0 = none (a whole score)
-- ARGV[7]  the consumer deferring it: the entry must still be pending on it ('' = not checked).
--          A worker cut off from Redis for longer than CLAIM_IDLE may defer late a task another
--          worker reclaimed meanwhile: that task is its new owner's, never pulled from under it.
-- ARGV[8]  the task's seed_id, ARGV[9] its site_id: counted as delayed (progress_lib.lua)
-- Returns 1 if the entry was still pending here (0: acked or reclaimed by another worker;
-- nothing deferred).
--#include progress_lib

local due = math.floor(tonumber(ARGV[3]))
if ARGV[5] == '1' then
  local t = redis.call('TIME')
  due = due + tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local code = 0
if ARGV[6] and ARGV[6] ~= '' then
  code = tonumber(ARGV[6])
end
if code == nil or code < 0 or code > 15 or code ~= math.floor(code) then
  return redis.error_reply('ERR defer.lua: reason code must be an integer from 0 to 15, got '
    .. tostring(ARGV[6]))
end
if ARGV[7] and ARGV[7] ~= ''
    and #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1, ARGV[7]) == 0 then
  return 0
end
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return 0
end
redis.call('XDEL', KEYS[1], ARGV[2])
local score = due
if code > 0 then
  score = due - 1 + code / 16  -- (a Lua number reaches Redis as %.17g: kept exactly)
end
redis.call('ZADD', KEYS[2], score, ARGV[4])
pg_add(pg_prefix_of_delayed(KEYS[2]), ARGV[8], ARGV[9], 'delayed', 1)
pg_flush(nil, '', 0, false)
return 1
