-- Keep this worker's own pending tasks fresh (idle time back to 0) so that a live worker's
-- slow task is not reclaimed as if its worker had died. Entries another consumer has taken
-- over, or that were acknowledged meanwhile, are left alone and reported.
-- KEYS       the task streams
-- ARGV[1]    consumer group
-- ARGV[2]    this consumer
-- ARGV[3..]  pairs: stream index (into KEYS), message id
-- Returns the {stream index, id} pairs that are no longer pending on this consumer.
local lost = {}
for i = 3, #ARGV, 2 do
  local key, id = KEYS[tonumber(ARGV[i])], ARGV[i + 1]
  local p = redis.call('XPENDING', key, ARGV[1], id, id, 1, ARGV[2])
  if p[1] then
    -- JUSTID: resets the idle time without counting a delivery.
    redis.call('XCLAIM', key, ARGV[1], ARGV[2], 0, id, 'JUSTID')
  else
    table.insert(lost, {tonumber(ARGV[i]), id})
  end
end
return lost
