-- Hand unstarted tasks back on a graceful stop: mark them idle for long enough that any other
-- worker's next XAUTOCLAIM takes them at once, and put their delivery count back where it was
-- so that a hand-back does not use up a delivery.
-- KEYS       the task streams
-- ARGV[1]    consumer group
-- ARGV[2]    this consumer
-- ARGV[3]    idle time to set, in milliseconds
-- ARGV[4..]  triples: stream index (into KEYS), message id, delivery count to restore
-- Returns the number of entries handed back.
local n = 0
for i = 4, #ARGV, 3 do
  local key, id = KEYS[tonumber(ARGV[i])], ARGV[i + 1]
  local p = redis.call('XPENDING', key, ARGV[1], id, id, 1, ARGV[2])
  if p[1] then
    redis.call('XCLAIM', key, ARGV[1], ARGV[2], 0, id, 'IDLE', ARGV[3],
      'RETRYCOUNT', ARGV[i + 2], 'JUSTID')
    n = n + 1
  end
end
return n
