-- Keep this worker's own pending tasks fresh (idle time back to 0) so that a live worker's
-- slow task is not reclaimed as if its worker had died. Entries another consumer has taken
-- over, or that were acknowledged meanwhile, are left alone and reported.
-- KEYS[1]  the task stream
-- ARGV[1]  consumer group
-- ARGV[2]  this consumer
-- ARGV[3..] message ids
-- Returns the ids that are no longer pending on this consumer.
local lost = {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2])
  if p[1] then
    -- JUSTID: resets the idle time without counting a delivery.
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
  else
    table.insert(lost, ARGV[i])
  end
end
return lost
