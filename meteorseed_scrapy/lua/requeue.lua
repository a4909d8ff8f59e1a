-- Put dead-lettered tasks back on their task streams, bypassing dedup, and remove their dead
-- letters, all in one atomic step: a task is never both requeued and still dead, nor lost.
-- The task's completion record and failure note are deleted so that a worker fetches it
-- again instead of acking it as already done; its URL is recorded in the site's dedup layer
-- again, since it is queued again (as enqueue.lua would leave it).
-- A dead letter that is gone already (requeued or purged by someone else) is skipped.
-- KEYS[1]   the dead-letter stream
-- KEYS[2..] four keys per task, in order: its task stream (its lane and band),
--           <ns>:done:<task_id>, <ns>:failed:<task_id>, the site's dedup root <ns>:seen:{site}
-- KEYS[last] (optional, after the tasks' keys) the crawl events stream: a seed run again by
--           its requeue is told 'started' (progress_lib.lua; one Redis only: the caller passes
--           none on a sharded layout and tells it itself)
-- ARGV[1]   message version (the stream field "v")
-- ARGV[2..] three values per task, in order: dead-letter id, task JSON, dedup fingerprint
--           (32 hex digits; '' = leave dedup alone)
-- Returns   {dead-letter id, new task-stream id} per task requeued (skipped ones left out).

--#include dedup_lib
--#include counts_lib
--#include progress_lib

local out = {}
local n = (#ARGV - 1) / 3
-- Before any write: Redis 6.2 allows writes after TIME only in effects replication mode.
local now = dd_now('')
for i = 0, n - 1 do
  local dead_id = ARGV[2 + i * 3]
  if #redis.call('XRANGE', KEYS[1], dead_id, dead_id) > 0 then
    local new_id = redis.call('XADD', KEYS[2 + i * 4], '*', 'v', ARGV[1], 't', ARGV[3 + i * 3])
    count_added(KEYS[2 + i * 4], 1)
    -- Enqueued again for its seed (progress_lib.lua; a finished seed starts a new run).
    local ok, task = pcall(cjson.decode, ARGV[3 + i * 3])
    if not ok or type(task) ~= 'table' then task = {} end
    pg_add(pg_prefix_of_stream(KEYS[2 + i * 4]), task.seed_id, task.site_id, 'enqueued', 1)
    pg_add(pg_prefix_of_stream(KEYS[2 + i * 4]), task.seed_id, task.site_id, 'outstanding', 1)
    redis.call('DEL', KEYS[3 + i * 4], KEYS[4 + i * 4])
    local root, fp = KEYS[5 + i * 4], ARGV[4 + i * 3]
    if fp ~= '' then
      local kind = redis.call('TYPE', root)['ok']
      if kind == 'set' then
        redis.call('SADD', root, fp)  -- a dedup set written before the two-layer dedup
      elseif kind == 'hash' or kind == 'none' then
        dd_add(root, dd_window(root, ''), dd_from_hex(fp), now)
      end
    end
    redis.call('XDEL', KEYS[1], dead_id)
    table.insert(out, {dead_id, new_id})
  end
end
dd_flush()
local events = nil
if #KEYS == 4 * n + 2 then events = KEYS[#KEYS] end
pg_flush(events, string.format('%.3f', now), 0, true)
return out
