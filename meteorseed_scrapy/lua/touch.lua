-- Keep this worker's own pending tasks fresh (idle time back to 0) so that a live worker's
-- slow task is not reclaimed as if its worker had died. Entries another consumer has taken
-- over, or that were acknowledged meanwhile, are left alone and reported.
-- KEYS       the task streams
-- ARGV[1]    consumer group
-- ARGV[2]    this consumer
-- ARGV[3..]  pairs: stream index (into KEYS), message id
-- Returns the {stream index, id} pairs that are no longer pending on this consumer.
local lost, ours = {}, {}
for i = 3, #ARGV, 2 do
  local k, id = tonumber(ARGV[i]), ARGV[i + 1]
  local p = redis.call('XPENDING', KEYS[k], ARGV[1], id, id, 1, ARGV[2])
  if p[1] then
    ours[k] = ours[k] or {}
    table.insert(ours[k], id)
  else
    table.insert(lost, {k, id})
  end
end
-- One XCLAIM per stream (in slices: unpack has a limit) for the ids checked above, all ours:
-- JUSTID resets the idle time without counting a delivery.
for k, ids in pairs(ours) do
  for s = 1, #ids, 500 do
    local cmd = {'XCLAIM', KEYS[k], ARGV[1], ARGV[2], 0}
    for j = s, math.min(s + 499, #ids) do cmd[#cmd + 1] = ids[j] end
    cmd[#cmd + 1] = 'JUSTID'
    redis.call(unpack(cmd))
  end
end
return lost
