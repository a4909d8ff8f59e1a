-- A crawl's progress: per-seed and per-site counters, kept by the scripts that enqueue and
-- settle tasks (enqueue, ack, dead, defer, promote), so counting costs no round trip of its
-- own. See queue/fleet/crawl_progress.py (the reader) and queue/keys.py (the keys).
--
-- '<prefix>:crawl:<seed_id>'    hash  enqueued, done, dead, cancelled, delayed (now), outstanding
--                                     (enqueued - done - dead - cancelled), items, anomalies, bytes,
--                                     started_at, finished_at, run, last_<name> (the last
--                                     run's final counters), expanding (present while the
--                                     expansion engine has more of its URLs to enqueue: a
--                                     seed is not finished then)
-- '<prefix>:crawlsite:<site_id>' hash the same totals per site (no finished state)
--
-- <prefix> is the shard's (derived from the task stream or delayed set's name, as counts_lib
-- does): its keys are in the stream's Cluster slot. A seed or site id that is not an id (empty,
-- longer than 200, holding whitespace or control characters, not a string) is counted under
-- the empty id ('<prefix>:crawl:'): never an error, which would stall the acks.
-- Calls gather counts in tables (pg_add) and write them once per seed and site (pg_flush).

local pg_seeds, pg_sites, pg_holds = {}, {}, {}

local function pg_id(id)
  if type(id) ~= 'string' or #id == 0 or #id > 200 or string.find(id, '[%s%c]') then
    return ''
  end
  return id
end

-- A count given as text: decimal digits (at most 15), else 0.
local function pg_count(text)
  if type(text) ~= 'string' or #text > 15 or not string.match(text, '^%d+$') then
    return 0
  end
  return tonumber(text)
end

local function pg_prefix_of_stream(stream)
  local prefix = string.match(stream, '^(.+):tasks$')
    or string.match(stream, '^(.+):tasks:%a+:%a+$')
  if prefix then
    prefix = string.match(prefix, '^(.+):spider:[^:]+$') or prefix
  end
  return prefix
end

local function pg_prefix_of_delayed(delayed)
  local prefix = string.match(delayed, '^(.+):delayed$')
  if prefix then
    prefix = string.match(prefix, '^(.+):spider:[^:]+$') or prefix
  end
  return prefix
end

local function pg_bump(tables, prefix, id, field, n)
  local key = prefix .. id
  local t = tables[key]
  if not t then
    t = {id = id}
    tables[key] = t
  end
  t[field] = (t[field] or 0) + n
end

-- Count n of 'field' for a task of seed and site (prefix: the shard's; nil = not counted).
local function pg_add(prefix, seed, site, field, n)
  if not prefix or n == 0 then return end
  pg_bump(pg_seeds, prefix .. ':crawl:', pg_id(seed), field, n)
  pg_bump(pg_sites, prefix .. ':crawlsite:', pg_id(site), field, n)
end

-- The expansion engine holds a seed (held: more of its URLs to come after this call) or lets it
-- go (false: its last); a seed held is not finished (pg_finish).
local function pg_hold(prefix, id, held)
  id = pg_id(id)
  if not prefix or id == '' then return end
  pg_bump(pg_seeds, prefix .. ':crawl:', id, 'enqueued', 0)
  pg_holds[prefix .. ':crawl:' .. id] = held
end

local function pg_counters(key)
  local flat = redis.call('HGETALL', key)
  local out = {}
  for i = 1, #flat, 2 do
    local name = flat[i]
    if string.sub(name, 1, 5) ~= 'last_' then
      out[name] = tonumber(flat[i + 1]) or flat[i + 1]
    end
  end
  return out
end

-- What a new run keeps of the last one, each in a field 'last_<name>' (small fields keep the
-- hash a compact listpack, where one JSON value of them would not).
local PG_KEPT = {'enqueued', 'done', 'dead', 'cancelled', 'items', 'anomalies', 'bytes', 'started_at',
                 'finished_at'}

local function pg_event(events, fields)
  if events and events ~= '' then
    redis.pcall('XADD', events, 'MAXLEN', '~', 10000, '*', unpack(fields))
  end
end

-- A seed's first enqueue (or its first after it finished: a new run, the last run's final
-- counters kept as 'last_<name>'): 'started_at' set, a 'started' event.
local function pg_start(key, id, events, now)
  if redis.call('HEXISTS', key, 'finished_at') == 1 then
    local last = pg_counters(key)
    redis.call('DEL', key)
    local kept = {}
    for _, name in ipairs(PG_KEPT) do
      if last[name] ~= nil then
        kept[#kept + 1] = 'last_' .. name
        kept[#kept + 1] = last[name]
      end
    end
    redis.call('HSET', key, 'run', (tonumber(last.run) or 1) + 1, unpack(kept))
  end
  if redis.call('HSETNX', key, 'started_at', now) == 1 and id ~= '' then
    pg_event(events, {'event', 'started', 'seed', id, 'at', now})
  end
end

-- Finish the seed of 'key' when nothing of it is left and no expansion holds it: 'finished_at',
-- the expiry, the 'finished' event. Only where 'events' is given (one Redis, untagged).
local function pg_finish(key, id, events, now, retention)
  if not (events and events ~= '') or redis.call('HEXISTS', key, 'expanding') == 1
      or redis.call('HEXISTS', key, 'finished_at') == 1 then
    return  -- (finished already: a late settle of this run tells it once, not again)
  end
  redis.pcall('HSET', key, 'finished_at', now)
  if retention > 0 then redis.pcall('EXPIRE', key, retention) end
  pg_event(events, {'event', 'finished', 'seed', id, 'at', now,
                    'counters', cjson.encode(pg_counters(key))})
end

-- Write the gathered counts. enqueueing: start seeds (pg_start). events: the stream of crawl
-- events ('' or nil: none, on a sharded layout, where one shard reaching zero says nothing of
-- the others: the caller judges, from the seeds returned). A seed whose outstanding tasks reach
-- zero after a settle is finished: 'finished_at', an expiry of 'retention' seconds, a
-- 'finished' event. Returns the ids of the seeds whose outstanding count reached zero here.
local function pg_flush(events, now, retention, enqueueing)
  local zeroed = {}
  local holds = pg_holds
  for key, t in pairs(pg_seeds) do
    local id = t.id
    t.id = nil
    if enqueueing then pcall(pg_start, key, id, events, now) end
    local left = nil
    for field, n in pairs(t) do
      -- pcall: a key of another type never fails the script after its XACKs and XADDs.
      local v = redis.pcall('HINCRBY', key, field, n)
      if field == 'outstanding' and type(v) == 'number' then left = v end
    end
    local hold = holds[key]
    if hold == true then
      redis.pcall('HSET', key, 'expanding', 1)
    elseif hold == false and id ~= '' and redis.pcall('HDEL', key, 'expanding') == 1 then
      -- The expansion's end (after this call's tasks are counted): when everything it
      -- enqueued settled already, the seed is done.
      left = tonumber(redis.pcall('HGET', key, 'outstanding')) or 0
      if left <= 0 then
        zeroed[#zeroed + 1] = id
        pg_finish(key, id, events, now, retention)
      end
    elseif left ~= nil and left <= 0 and not enqueueing and id ~= '' then
      zeroed[#zeroed + 1] = id
      pg_finish(key, id, events, now, retention)
    end
  end
  for key, t in pairs(pg_sites) do
    t.id = nil
    for field, n in pairs(t) do
      redis.pcall('HINCRBY', key, field, n)
    end
  end
  pg_seeds, pg_sites, pg_holds = {}, {}, {}
  return zeroed
end
