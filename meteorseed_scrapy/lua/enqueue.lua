-- enqueue.lua: fleet-wide URL dedup and enqueue of exec tasks, in one atomic step.
--
-- Because the dedup check, its record and the XADD run inside one script, two seed-expand
-- processes (or a seeder and a worker yielding child requests) can never both see a URL as
-- new: exactly one enqueues it. The dedup layer itself is dedup_lib.lua (Bloom + exact).
--
-- KEYS[1]      the task stream (<ns>:tasks or another lane's stream)
-- KEYS[2..n]   the distinct per-site dedup roots (<ns>:seen:{site}) that this batch uses
-- ARGV[1]      now, epoch seconds ('' = the server's TIME; tests pass a fixed clock)
-- ARGV[2]      the batch, packed into one string (one argument instead of four per task:
--              the client's command encoding was the larger cost of a big seed file). Per
--              task, in order:
--                2 bytes  root index, big-endian: 1-based position of the task's dedup root
--                         among KEYS[2..n]; 0 = no dedup, always enqueue
--                1 byte   length of the window
--                4 bytes  length of the task JSON, big-endian
--                16 bytes fingerprint (see dedup_lib.lua), only when the root index > 0
--                the window: re-crawl window in seconds for the site, decimal ('' = the
--                         site's stored window; '0' = never re-crawl)
--                the task JSON: the stream field "t"; the field "v" is the message version, 1
-- Returns      {enqueued, duplicates, flags}: flags has one character per task, in order,
--              '1' = enqueued, '0' = a duplicate
--
-- The stream is never trimmed here: an entry leaves the stream only after it was acked.
-- All keys must live on one node (one Redis, not a Cluster spanning several slots); the
-- generation keys of a root are derived from it here, so they are not in KEYS.
-- Key types and arguments are checked before any write, so a bad call fails as a whole.

--#include dedup_lib
--#include counts_lib

local stream = KEYS[1]
local blob = ARGV[2] or ''

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

-- Unpack and check everything before the first write, so a bad call fails as a whole.
local roots, fps, windows_in, jsons = {}, {}, {}, {}
local pos, size, n = 1, #blob, 0
local byte, sub = string.byte, string.sub
while pos <= size do
  if pos + 6 > size then
    return redis.error_reply('ERR enqueue.lua: truncated batch at byte ' .. pos)
  end
  local r1, r2, wl, j1, j2, j3, j4 = byte(blob, pos, pos + 6)
  local r = r1 * 256 + r2
  local jl = ((j1 * 256 + j2) * 256 + j3) * 256 + j4
  if r + 1 > #KEYS then
    return redis.error_reply('ERR enqueue.lua: bad root index ' .. r)
  end
  pos = pos + 7
  local fp = ''
  if r > 0 then
    fp = sub(blob, pos, pos + 15)
    pos = pos + 16
  end
  local w = sub(blob, pos, pos + wl - 1)
  pos = pos + wl
  if pos + jl - 1 > size or #fp ~= (r > 0 and 16 or 0) then
    return redis.error_reply('ERR enqueue.lua: truncated batch at byte ' .. pos)
  end
  if w ~= '' and not string.match(w, '^%d+$') then
    return redis.error_reply('ERR enqueue.lua: bad window ' .. w)
  end
  n = n + 1
  roots[n], fps[n], windows_in[n], jsons[n] = r, fp, w, sub(blob, pos, pos + jl - 1)
  pos = pos + jl
end

local now = dd_now(ARGV[1])
local windows = {}  -- root index -> window for this call (read once per root)
local enqueued, duplicates = 0, 0
local flags = {}
for i = 1, n do
  local r = roots[i]
  local is_new = true
  if r > 0 then
    local root = KEYS[r + 1]
    local w = windows[r]
    if w == nil or windows_in[i] ~= '' then
      w = dd_window(root, windows_in[i])
      windows[r] = w
    end
    is_new = dd_add(root, w, fps[i], now)
  end
  if is_new then
    redis.call('XADD', stream, '*', 'v', '1', 't', jsons[i])
    enqueued = enqueued + 1
    flags[i] = '1'
  else
    duplicates = duplicates + 1
    flags[i] = '0'
  end
end
dd_flush()
count_added(stream, enqueued)
return {enqueued, duplicates, table.concat(flags)}
