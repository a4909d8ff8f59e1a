-- Put dead-lettered tasks back on the task stream, bypassing dedup, and remove their dead
-- letters, all in one atomic step: a task is never both requeued and still dead, nor lost.
-- The task's completion record and failure note are deleted so that a worker fetches it
-- again instead of acking it as already done; its fingerprint is put back in the site's
-- dedup set, since the URL is queued again (as enqueue.lua would leave it).
-- A dead letter that is gone already (requeued or purged by someone else) is skipped.
-- KEYS[1]   the task stream
-- KEYS[2]   the dead-letter stream
-- KEYS[3..] three keys per task, in order: <ns>:done:<task_id>, <ns>:failed:<task_id>,
--           the site's dedup set <ns>:seen:{site}
-- ARGV[1]   message version (the stream field "v")
-- ARGV[2..] three values per task, in order: dead-letter id, task JSON, dedup fingerprint
--           ('' = leave the dedup set alone)
-- Returns   {dead-letter id, new task-stream id} per task requeued (skipped ones left out).
local out = {}
local n = (#ARGV - 1) / 3
for i = 0, n - 1 do
  local dead_id = ARGV[2 + i * 3]
  if #redis.call('XRANGE', KEYS[2], dead_id, dead_id) > 0 then
    local new_id = redis.call('XADD', KEYS[1], '*', 'v', ARGV[1], 't', ARGV[3 + i * 3])
    redis.call('DEL', KEYS[3 + i * 3], KEYS[4 + i * 3])
    if ARGV[4 + i * 3] ~= '' then
      redis.call('SADD', KEYS[5 + i * 3], ARGV[4 + i * 3])
    end
    redis.call('XDEL', KEYS[2], dead_id)
    table.insert(out, {dead_id, new_id})
  end
end
return out
