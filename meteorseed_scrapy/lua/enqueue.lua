-- enqueue.lua: fleet-wide URL dedup and enqueue of exec tasks, in one atomic step.
--
-- Because SADD and XADD run inside one script, two seed-expand processes (or a seeder and a
-- worker yielding child requests) can never both see a URL as new: exactly one enqueues it.
--
-- KEYS[1]      the task stream (<ns>:tasks)
-- KEYS[2..n]   the distinct per-site dedup sets (<ns>:seen:{site}) that this batch uses
-- ARGV         one triple per task, in order:
--                seen index  1-based position of the task's dedup set among KEYS[2..n]
--                            (1 means KEYS[2]); 0 = no dedup, always enqueue
--                fingerprint member added to that dedup set
--                task JSON   the stream field "t"; the field "v" is the message version, 1
-- Returns      {enqueued, duplicates}
--
-- The stream is never trimmed here: an entry leaves the stream only after it was acked.
-- All keys must live on one node (one Redis, not a Cluster spanning several slots).
-- Key types and seen indexes are checked before any write, so a bad call fails as a whole
-- instead of leaving a fingerprint in a dedup set for a task that was never added.

local stream = KEYS[1]
if #ARGV % 3 ~= 0 then
  return redis.error_reply('ERR enqueue.lua: ARGV must hold (seen index, fingerprint, task) triples')
end

local function check_type(key, expected)
  local found = redis.call('TYPE', key)['ok']
  if found ~= 'none' and found ~= expected then
    return redis.error_reply('WRONGTYPE enqueue.lua: ' .. key .. ' is a ' .. found
      .. ', expected a ' .. expected)
  end
  return nil
end

local err = check_type(stream, 'stream')
if err then return err end
for k = 2, #KEYS do
  err = check_type(KEYS[k], 'set')
  if err then return err end
end

for i = 1, #ARGV, 3 do
  local seen = tonumber(ARGV[i])
  if seen == nil or seen < 0 or seen + 1 > #KEYS then
    return redis.error_reply('ERR enqueue.lua: bad seen index ' .. tostring(ARGV[i]))
  end
end

local enqueued, duplicates = 0, 0
for i = 1, #ARGV, 3 do
  local seen = tonumber(ARGV[i])
  local is_new = true
  if seen > 0 then
    is_new = redis.call('SADD', KEYS[seen + 1], ARGV[i + 1]) == 1
  end
  if is_new then
    redis.call('XADD', stream, '*', 'v', '1', 't', ARGV[i + 2])
    enqueued = enqueued + 1
  else
    duplicates = duplicates + 1
  end
end
return {enqueued, duplicates}
