-- Acknowledge finished tasks and delete their entries, in one round trip.
-- An entry is deleted right after its XACK (never before), so XLEN(stream) = waiting + pending,
-- and only acknowledged history is ever removed.
-- KEYS[1]   the task stream
-- ARGV[1]   consumer group
-- ARGV[2..] message ids
-- Returns the number of entries that were still pending and are now acknowledged.
local acked = 0
for i = 2, #ARGV do
  acked = acked + redis.call('XACK', KEYS[1], ARGV[1], ARGV[i])
  redis.call('XDEL', KEYS[1], ARGV[i])
end
return acked
