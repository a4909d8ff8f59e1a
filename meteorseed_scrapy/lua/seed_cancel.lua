-- Settle tasks of a cancelled seed as 'cancelled' (progress_lib.lua: the seed's and site's
-- 'cancelled' counter; its outstanding count down), each at most once, whoever gets to it:
--   'pending' given entries still pending on a consumer, acked and deleted (a worker that
--             read one);
--   'scan'    a cancel's page of a task stream: at most ARGV[9] entries no consumer has read
--             yet (after the group's last-delivered id) and after the cursor ARGV[8] are
--             looked at, the seed's deleted (meteorseed seeds cancel);
--   'dscan'   a cancel's page of a delayed set: one ZSCAN (COUNT ARGV[9]) from cursor ARGV[8],
--             the seed's members removed (counted out of 'delayed' too).
-- The scans find the seed's tasks without decoding the others: a message is decoded (cjson)
-- only when it holds one of the seed's JSON encodings (ARGV[10..]) as a JSON string. A page's
-- cost is bounded by its size: a cancel never blocks Redis long, whatever the streams hold.
-- KEYS[1]   the task stream, or the delayed set ('dscan')
-- ARGV[1]   'pending', 'scan' or 'dscan'
-- ARGV[2]   consumer group
-- ARGV[3]   the consumer ('pending'; else ignored)
-- ARGV[4]   the crawl events stream ('' = none: a sharded layout, the caller judges the end)
-- ARGV[5]   now, epoch seconds (text)
-- ARGV[6]   seconds a finished seed's counters are kept (0 = for ever)
-- ARGV[7..] 'pending': per task, 3 values: message id, seed_id, site_id;
--           'scan', 'dscan': ARGV[7] the seed_id, ARGV[8] the cursor ('' or '0': the start),
--           ARGV[9] the page size, ARGV[10..] the seed_id as JSON strings (e.g. '"s1"')
-- Returns {settled, seeds}: how many were settled here, and the seeds whose outstanding count
-- reached zero here; the scans add the next cursor ('' = done) and the task JSON of each
-- entry they settled (for the task history).

--#include progress_lib

local mode, group = ARGV[1], ARGV[2]
local prefix
if mode == 'dscan' then
  prefix = pg_prefix_of_delayed(KEYS[1])
else
  prefix = pg_prefix_of_stream(KEYS[1])
end

-- An id as two numbers (ms, seq); '0-0' for anything else.
local function parts(id)
  local ms, seq = string.match(id or '', '^(%d+)-(%d+)$')
  return tonumber(ms or 0), tonumber(seq or 0)
end

local last_ms, last_seq, last_id = 0, 0, '0-0'
if mode == 'scan' then
  local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', KEYS[1])
  if ok then
    for _, g in ipairs(groups) do
      local fields = {}
      for i = 1, #g, 2 do fields[g[i]] = g[i + 1] end
      if fields['name'] == group then
        last_ms, last_seq = parts(fields['last-delivered-id'])
        last_id = fields['last-delivered-id']
      end
    end
  end
end

-- The seed's task in a message (the seed's site and the JSON), or nil: a plain search for the
-- seed's JSON string first, the decoding only when it is there.
local function seed_task(text, seed)
  if type(text) ~= 'string' then return nil end
  local found = false
  for i = 10, #ARGV do
    if string.find(text, ARGV[i], 1, true) then found = true break end
  end
  if not found then return nil end
  local ok, task = pcall(cjson.decode, text)
  if not ok or type(task) ~= 'table' or task.seed_id ~= seed or type(task.site_id) ~= 'string'
      or type(task.task_id) ~= 'string' then
    return nil
  end
  return task.site_id
end

local settled, texts = 0, {}
local function settle(seed, site, text)
  settled = settled + 1
  pg_add(prefix, seed, site, 'cancelled', 1)
  pg_add(prefix, seed, site, 'outstanding', -1)
  texts[#texts + 1] = text
end

if mode == 'scan' then
  local seed, cursor, count = ARGV[7], ARGV[8], tonumber(ARGV[9])
  if cursor == '' then cursor = '0-0' end
  local c_ms, c_seq = parts(cursor)
  if c_ms < last_ms or (c_ms == last_ms and c_seq < last_seq) then cursor = last_id end
  local entries = redis.call('XRANGE', KEYS[1], '(' .. cursor, '+', 'COUNT', count)
  for _, entry in ipairs(entries) do
    local fields = entry[2]
    local text = fields[4]  -- ('v', version, 't', task: as every writer adds them)
    if fields[3] ~= 't' then
      text = nil
      for f = 1, #fields, 2 do
        if fields[f] == 't' then text = fields[f + 1] end
      end
    end
    local site = seed_task(text, seed)
    if site and redis.call('XDEL', KEYS[1], entry[1]) == 1 then settle(seed, site, text) end
  end
  local zeroed = pg_flush(ARGV[4], ARGV[5], tonumber(ARGV[6]) or 0, false)
  local next_cursor = ''
  if #entries == count then next_cursor = entries[#entries][1] end
  return {settled, zeroed, next_cursor, texts}
end

if mode == 'dscan' then
  local seed, cursor = ARGV[7], ARGV[8]
  if cursor == '' then cursor = '0' end
  local page = redis.call('ZSCAN', KEYS[1], cursor, 'COUNT', tonumber(ARGV[9]))
  local members = page[2]
  for m = 1, #members, 2 do
    local member = members[m]
    local text = member
    if string.sub(member, 1, 1) ~= '{' then
      local bar = string.find(member, '|', 1, true)
      text = bar and string.sub(member, bar + 1) or ''
    end
    local site = seed_task(text, seed)
    if site and redis.call('ZREM', KEYS[1], member) == 1 then
      pg_add(prefix, seed, site, 'delayed', -1)
      settle(seed, site, text)
    end
  end
  local zeroed = pg_flush(ARGV[4], ARGV[5], tonumber(ARGV[6]) or 0, false)
  local next_cursor = page[1]
  if next_cursor == '0' then next_cursor = '' end
  return {settled, zeroed, next_cursor, texts}
end

if mode ~= 'pending' then
  return redis.error_reply('seed_cancel: unknown mode ' .. tostring(mode))
end
for i = 7, #ARGV - 2, 3 do
  local id, seed, site = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if redis.call('XPENDING', KEYS[1], group, id, id, 1, ARGV[3])[1] then
    redis.call('XACK', KEYS[1], group, id)
    redis.call('XDEL', KEYS[1], id)
    settle(seed, site, nil)
  end
end
local zeroed = pg_flush(ARGV[4], ARGV[5], tonumber(ARGV[6]) or 0, false)
return {settled, zeroed}
