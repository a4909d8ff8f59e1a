-- Hand unstarted tasks back on a graceful stop: mark them idle for long enough that any other
-- worker's next XAUTOCLAIM takes them at once, and put their delivery count back where it was
-- so that a hand-back does not use up a delivery.
-- KEYS[1]  the task stream
-- ARGV[1]  consumer group
-- ARGV[2]  this consumer
-- ARGV[3]  idle time to set, in milliseconds
-- ARGV[4..] pairs: message id, delivery count to restore
-- Returns the number of entries handed back.
local n = 0
for i = 4, #ARGV, 2 do
  local id = ARGV[i]
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1, ARGV[2])
  if p[1] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id, 'IDLE', ARGV[3],
      'RETRYCOUNT', ARGV[i + 1], 'JUSTID')
    n = n + 1
  end
end
return n
