-- Record completions and acknowledge tasks, atomically, in one round trip.
-- An entry is deleted right after its XACK (never before), so XLEN(stream) = waiting + pending.
-- KEYS[1]        the task stream
-- KEYS[2..n+1]   per acked entry: its completion-record key (<ns>:done:<task_id>)
-- ARGV[1]        consumer group
-- ARGV[2]        completion-record TTL in seconds
-- ARGV[3..]      per acked entry, in KEYS order: message id, completion record JSON
--                ('' = no record to write, e.g. a task that was already complete)
-- Returns the number of entries that were still pending and are now acknowledged.
local acked = 0
for i = 2, #KEYS do
  local id = ARGV[(i - 2) * 2 + 3]
  local record = ARGV[(i - 2) * 2 + 4]
  if record ~= '' then
    redis.call('SET', KEYS[i], record, 'EX', ARGV[2])
  end
  acked = acked + redis.call('XACK', KEYS[1], ARGV[1], id)
  redis.call('XDEL', KEYS[1], id)
end
return acked
