-- Take over every task pending on workers known to be dead (their liveness lapsed in the
-- live-worker registry), whatever its idle time, from the task streams of one shard in order
-- (realtime lane first). Each claim counts a delivery, as XAUTOCLAIM does, and the reply gives
-- the count, so the caller's delivery limit and dead letters apply unchanged. Atomic per
-- shard: workers racing for the same dead worker's tasks get disjoint entries. A dead worker
-- left holding nothing in a stream leaves its group there (it held nothing: nothing is lost).
-- KEYS       the task streams of one shard
-- ARGV[1]    consumer group
-- ARGV[2]    this consumer
-- ARGV[3]    maximum number of entries, over all streams and dead workers
-- ARGV[4..]  the dead workers' consumer names
-- Returns {{{stream index, id, {field, value, ...}, deliveries}, ...}, {dead workers that still
-- hold entries here}}. A pending entry whose message was deleted is skipped (Redis 7 drops it
-- from the pending list on XCLAIM; this project never deletes a pending entry).
local left = tonumber(ARGV[3])
local out, holding = {}, {}
for c = 4, #ARGV do
  local name = ARGV[c]
  local held = name == ARGV[2]  -- (never its own: a live worker's tasks are its business)
  for k = 1, #KEYS do
    if held then break end  -- (what is left here waits for the next call)
    if left > 0 then
      local rows = redis.call('XPENDING', KEYS[k], ARGV[1], '-', '+', left, name)
      if #rows > 0 then
        local counts, cmd = {}, {'XCLAIM', KEYS[k], ARGV[1], ARGV[2], 0}
        for _, row in ipairs(rows) do
          counts[row[1]] = row[4]
          cmd[#cmd + 1] = row[1]
        end
        for _, e in ipairs(redis.call(unpack(cmd))) do
          if e and e[2] then
            table.insert(out, {k, e[1], e[2], counts[e[1]] + 1})
            left = left - 1
          end
        end
      end
    end
    if #redis.call('XPENDING', KEYS[k], ARGV[1], '-', '+', 1, name) > 0 then
      held = true
    end
  end
  if held then
    holding[#holding + 1] = name
  else  -- (nothing pending on it here: deleting it loses nothing)
    for k = 1, #KEYS do redis.call('XGROUP', 'DELCONSUMER', KEYS[k], ARGV[1], name) end
  end
end
return {out, holding}
