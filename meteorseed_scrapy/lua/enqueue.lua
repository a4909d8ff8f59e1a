-- enqueue.lua: fleet-wide URL dedup and enqueue of exec tasks, in one atomic step.
--
-- Because the dedup check, its record and the XADD run inside one script, two seed-expand
-- processes (or a seeder and a worker yielding child requests) can never both see a URL as
-- new: exactly one enqueues it. The dedup layer itself is dedup_lib.lua.
--
-- KEYS[1]      the task stream (<ns>:tasks or another lane's stream)
-- KEYS[2..n]   the distinct per-site dedup roots (<ns>:seen:{site}) that this batch uses
-- ARGV[1]      now, epoch seconds ('' = the server's TIME; tests pass a fixed clock)
-- ARGV[2]      the task JSONs (the stream field "t"; the field "v" is the message version, 1),
--              each followed by a newline: JSON text never holds a raw newline, so the batch
--              needs no length prefixes (one C-level join on the client, one find per task here)
-- ARGV[3]      per task, in order, 8 bytes: its root index (2 bytes, big-endian: the 1-based
--              position of the task's dedup root among KEYS[2..n]; 0 = no dedup, always
--              enqueue), then its dedup entry (the fingerprint's first 6 bytes, see
--              dedup_lib.lua; ignored without dedup)
-- ARGV[4]      the crawl events stream ('' = none): a seed's first task enqueued adds a
--              'started' event (progress_lib.lua)
-- ARGV[5]      per task, in order, 'seed_id<TAB>site_id' and a newline; or one such line for
--              every task of the call: whom each enqueued task counts for (progress_lib.lua)
-- ARGV[6]      the seeds the expansion engine holds or lets go with this call: lines
--              'seed_id<TAB>1' (more of its URLs come after this call: not finished before)
--              or 'seed_id<TAB>0' (its last call), each with a newline; '' = none (children,
--              other writers). A call may hold no task at all (a seed's end alone)
-- ARGV[7]      seconds a seed finished by this call (its expansion's end) keeps its counters
-- ARGV[8..]    pairs (task number, window): a task's re-crawl window in seconds, decimal
--              ('0' = never re-crawl), which becomes its site's window; a task without one
--              uses the site's stored window (or the one an earlier task of this call set).
-- Returns      {enqueued, duplicates, flags}: flags has one character per task, in order,
--              '1' = enqueued, '0' = a duplicate
--
-- The stream is never trimmed here: an entry leaves the stream only after it was acked.
-- All keys must live on one node (one Redis, not a Cluster spanning several slots); the
-- generation keys of a root are derived from it here, so they are not in KEYS.
-- Key types and arguments are checked before any write, so a bad call fails as a whole.

--#include dedup_lib
--#include counts_lib
--#include progress_lib

local stream = KEYS[1]

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
local jsons, meta = ARGV[2] or '', ARGV[3] or ''
local texts = {}
local byte, sub, find = string.byte, string.sub, string.find
local pos, n, size = 1, 0, #jsons
while pos <= size do
  local stop = find(jsons, '\n', pos, true)
  if not stop then
    return redis.error_reply('ERR enqueue.lua: task ' .. (n + 1) .. ' has no newline')
  end
  n = n + 1
  texts[n] = sub(jsons, pos, stop - 1)
  pos = stop + 1
end
if #meta ~= 8 * n then
  return redis.error_reply('ERR enqueue.lua: ' .. #meta .. ' bytes of roots and entries for '
    .. n .. ' tasks')
end
local nkeys = #KEYS
for at = 1, 8 * n, 8 do  -- (the roots and entries are read again where they are used)
  local r1, r2 = byte(meta, at, at + 1)
  if r1 * 256 + r2 + 1 > nkeys then
    return redis.error_reply('ERR enqueue.lua: bad root index ' .. (r1 * 256 + r2))
  end
end
local owners = {}  -- per task, {seed, site} (one entry: every task's)
do
  local text, at = ARGV[5] or '', 1
  while at <= #text do
    local stop = find(text, '\n', at, true) or (#text + 1)
    local line = sub(text, at, stop - 1)
    local tab = find(line, '\t', 1, true)
    if tab then
      owners[#owners + 1] = {sub(line, 1, tab - 1), sub(line, tab + 1)}
    else
      owners[#owners + 1] = {line, ''}
    end
    at = stop + 1
  end
  if #owners > 1 and #owners ~= n then
    return redis.error_reply('ERR enqueue.lua: ' .. #owners .. ' seed lines for ' .. n
      .. ' tasks')
  end
end
local windows_in = {}
for k = 8, #ARGV, 2 do
  local i, w = tonumber(ARGV[k]), ARGV[k + 1]
  if not i or i < 1 or i > n or i % 1 ~= 0 or not w or not string.match(w, '^%d+$') then
    return redis.error_reply('ERR enqueue.lua: bad window ' .. tostring(ARGV[k]) .. ' '
      .. tostring(w))
  end
  windows_in[i] = w
end

local now = dd_now(ARGV[1])
local progress = pg_prefix_of_stream(stream)
local adders = {}  -- root index -> dd_adder for this call's window (read once per root)
local enqueued, duplicates = 0, 0
local flags = {}
local call, keys = redis.call, KEYS
for i = 1, n do
  local at = 8 * i - 7
  local r1, r2, b1, b2, b3 = byte(meta, at, at + 4)  -- the root, the entry's bucket bytes
  local r = r1 * 256 + r2
  local is_new = true
  if r > 0 then
    local add = adders[r]
    local given = windows_in[i]
    if add == nil or given then
      local root = keys[r + 1]
      add = dd_adder(root, dd_window(root, given), now)
      adders[r] = add
    end
    is_new = add(sub(meta, at + 2, at + 7), b1 * 65536 + b2 * 256 + b3)
  end
  if is_new then
    call('XADD', stream, '*', 'v', '1', 't', texts[i])
    enqueued = enqueued + 1
    local owner = owners[i] or owners[1]
    if owner then
      pg_add(progress, owner[1], owner[2], 'enqueued', 1)
      pg_add(progress, owner[1], owner[2], 'outstanding', 1)
    end
    flags[i] = '1'
  else
    duplicates = duplicates + 1
    flags[i] = '0'
  end
end
dd_flush()
count_added(stream, enqueued)
for line in string.gmatch(ARGV[6] or '', '([^\n]+)') do
  local tab = find(line, '\t', 1, true)
  if tab then pg_hold(progress, sub(line, 1, tab - 1), sub(line, tab + 1) == '1') end
end
pg_flush(ARGV[4], string.format('%.3f', now), tonumber(ARGV[7]) or 0, true)
return {enqueued, duplicates, table.concat(flags)}
