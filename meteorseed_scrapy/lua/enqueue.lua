-- enqueue.lua: fleet-wide URL dedup and enqueue of exec tasks, in one atomic step.
--
-- Because the dedup check, its record and the XADD run inside one script, two seed-expand
-- processes (or a seeder and a worker yielding child requests) can never both see a URL as
-- new: exactly one enqueues it. The dedup layer itself is dedup_lib.lua (Bloom + exact).
--
-- KEYS[1]      the task stream (<ns>:tasks)
-- KEYS[2..n]   the distinct per-site dedup roots (<ns>:seen:{site}) that this batch uses
-- ARGV[1]      now, epoch seconds ('' = the server's TIME; tests pass a fixed clock)
-- ARGV[2..]    one quadruple per task, in order:
--                root index  1-based position of the task's dedup root among KEYS[2..n]
--                            (1 means KEYS[2]); 0 = no dedup, always enqueue
--                fingerprint 16 raw bytes (see dedup_lib.lua)
--                window      re-crawl window in seconds for the site ('' = the site's stored
--                            window; '0' = never re-crawl)
--                task JSON   the stream field "t"; the field "v" is the message version, 1
-- Returns      {enqueued, duplicates}
--
-- The stream is never trimmed here: an entry leaves the stream only after it was acked.
-- All keys must live on one node (one Redis, not a Cluster spanning several slots); the
-- generation keys of a root are derived from it here, so they are not in KEYS.
-- Key types and arguments are checked before any write, so a bad call fails as a whole.

--#include dedup_lib

local stream = KEYS[1]
if (#ARGV - 1) % 4 ~= 0 then
  return redis.error_reply('ERR enqueue.lua: ARGV must hold now, then (root index, '
    .. 'fingerprint, window, task) quadruples')
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
  err = check_type(KEYS[k], 'hash')
  if err then return err end
end

for i = 2, #ARGV, 4 do
  local root = tonumber(ARGV[i])
  if root == nil or root < 0 or root + 1 > #KEYS then
    return redis.error_reply('ERR enqueue.lua: bad root index ' .. tostring(ARGV[i]))
  end
  if root > 0 and #ARGV[i + 1] ~= 16 then
    return redis.error_reply('ERR enqueue.lua: a fingerprint must be 16 bytes')
  end
  local w = ARGV[i + 2]
  if w ~= '' and (tonumber(w) == nil or tonumber(w) < 0 or tonumber(w) % 1 ~= 0) then
    return redis.error_reply('ERR enqueue.lua: bad window ' .. w)
  end
end

local now = dd_now(ARGV[1])
local windows = {}  -- root index -> window for this call (read once per root)
local enqueued, duplicates = 0, 0
for i = 2, #ARGV, 4 do
  local r = tonumber(ARGV[i])
  local is_new = true
  if r > 0 then
    local root = KEYS[r + 1]
    local w = windows[r]
    if w == nil or ARGV[i + 2] ~= '' then
      w = dd_window(root, ARGV[i + 2])
      windows[r] = w
    end
    is_new = dd_add(root, w, ARGV[i + 1], now)
  end
  if is_new then
    redis.call('XADD', stream, '*', 'v', '1', 't', ARGV[i + 3])
    enqueued = enqueued + 1
  else
    duplicates = duplicates + 1
  end
end
dd_flush()
return {enqueued, duplicates}
