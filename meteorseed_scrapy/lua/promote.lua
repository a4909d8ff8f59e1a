-- Move due tasks from the delayed set back into the task stream, atomically (any worker may run
-- this; each task is moved exactly once).
-- KEYS[1]  the delayed set
-- KEYS[2]  the task stream
-- ARGV[1]  maximum number to move
-- ARGV[2]  message format version
-- Returns {moved, ms until the next one is due (-1: none left)}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, message in ipairs(due) do
  redis.call('XADD', KEYS[2], '*', 'v', ARGV[2], 't', message)
  redis.call('ZREM', KEYS[1], message)
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local wait = -1
if nxt[2] then
  wait = math.max(0, tonumber(nxt[2]) - now)
end
return {#due, wait}
