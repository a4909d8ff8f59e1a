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
-- Returns 1 if the entry was still pending here (0: another worker acked it; nothing deferred).
local due = tonumber(ARGV[3])
if ARGV[5] == '1' then
  local t = redis.call('TIME')
  due = due + tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return 0
end
redis.call('XDEL', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], due, ARGV[4])
return 1
