-- dedup_lib.lua: the two-layer URL dedup of one site, shared by enqueue.lua, dead.lua,
-- dedup_release.lua and dedup_seen.lua (scripts.py pastes it where a script says
-- "--#include dedup_lib"). It defines functions only; it reads no KEYS or ARGV itself.
--
-- Layout (documented in keys.py): the site root <ns>:seen:{site} is a hash holding 'w', the
-- site's re-crawl window in seconds (0 or absent = never re-crawl). A generation lives under
-- <root>:<w>:<g>, g = floor(now / w) (always 0 when w = 0):
--   <root>:<w>:<g>        hash    n (entries), b/p (linear-hashing level and split pointer),
--                                 q (time slots per window; absent: 8000, written before q)
--   <root>:<w>:<g>:<j>    hash    bucket j: 6-byte fingerprint prefix -> insertion time slot;
--                                 small enough to stay listpack/ziplist-encoded
-- A generation's keys expire at (g + 2) * w (+ slack): by then every entry is out of its
-- window, so old URLs age out with their keys instead of growing forever.
-- (Generations written before 2026-12 also have 's'/'f' fields and ':f<i>' Bloom slices:
-- nothing reads them any more, and they expire with their generation.)
--
-- A fingerprint is 16 raw bytes (SHA-256 prefix of the canonical request); its first 6 bytes
-- are the entry e that these functions take (e's bytes 1-3 also pick its bucket).
--
-- No Bloom filter: a lookup is one HGET (previous generation) or HSETNX (current one) per URL,
-- whatever the size, where a scalable Bloom costs one GETRANGE per slice plus two commands to
-- record each URL, and 1.3-5 bytes per URL (docs/dedup.md).

local DD_LOAD = 48          -- mean entries per bucket before a split: a bucket peaks at ~2x
                            -- the mean just before its split, 96, under the 128-entry listpack
                            -- limit (3.3 sigma; docs/dedup.md: one that passes costs memory only)
local DD_BASE_LEVEL = 4     -- a generation starts with 2^4 buckets
local DD_MAX_LEVEL = 23     -- bucket index bits come from 24 fingerprint bits
local DD_SLOTS = 4096       -- time resolution of an entry: its window / 4096. A listpack keeps
                            -- 0..4095 in 2 bytes and 4096..8191 in 3: at 8000 half the entries
                            -- took a byte more (16.37 -> 15.21 B/URL at 10 M, Redis 7.0)
local DD_SLOTS_V1 = 8000    -- what generations written before it used (they carry no 'q')
local DD_SLACK = 60         -- seconds kept past a generation's last useful moment
local DD_ARM_ALL = 4096     -- entries of a generation whose bucket expiry is set at every insert
local DD_KEEP = ''          -- field that keeps an emptied bucket (and so its expiry) alive

-- (locals: a global lookup per URL is measurable at a million URLs)
local dd_byte, dd_format, dd_call = string.byte, string.format, redis.call

local dd_gens = {}          -- generation states read during this call, by key
local dd_touched = {}       -- bucket key -> expire-at, for keys written during this call
local dd_pairs = {}         -- root -> {w, g, generations} last used (one lookup per URL)

local function dd_now(arg)
  if arg ~= nil and arg ~= '' then return tonumber(arg) end
  -- Redis 6.2 allows writes after TIME only with effects replication (its default; 7.0 always).
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  return tonumber(t[1])
end

local function dd_window(root, given)
  -- The window passed with a task (a seed's recrawl_after) becomes the site's window;
  -- without one (child requests), the site's stored window applies.
  if given ~= nil and given ~= '' then
    local w = tonumber(given)
    if redis.call('HGET', root, 'w') ~= given then redis.call('HSET', root, 'w', given) end
    return w
  end
  local stored = redis.call('HGET', root, 'w')
  if not stored then
    -- The root always exists once something was recorded: release and lookups start there.
    redis.call('HSET', root, 'w', '0')
    return 0
  end
  return tonumber(stored) or 0
end

local function dd_gen(root, w, g)
  local key = root .. ':' .. w .. ':' .. g
  local st = dd_gens[key]
  if st then return st end
  local v = redis.call('HMGET', key, 'n', 'b', 'p', 'q')
  -- q: the generation's time slots, kept with it so that a change of DD_SLOTS never reads an
  -- existing entry's slot in the wrong unit (a generation without one predates the field).
  local q = tonumber(v[4]) or (v[1] and DD_SLOTS_V1 or DD_SLOTS)
  st = {key = key, w = w, g = g, n = tonumber(v[1]) or 0, b = tonumber(v[2]) or DD_BASE_LEVEL,
        p = tonumber(v[3]) or 0, q = q, dirty = false,
        expire = (w > 0) and ((g + 2) * w + DD_SLACK) or nil}
  st.m = 2 ^ st.b  -- buckets before the split pointer: 2^b (cached; changes on a split)
  st.key_ = key .. ':'
  -- A bucket's name is string.format(st.name, index): a third of the time of key_ .. index
  -- (Lua formats a number with "%.14g"; the same digits for these integers, below 2^24).
  st.name = string.gsub(st.key_, '%%', '%%%%') .. '%d'
  st.unit = (w > 0) and math.ceil(w / q) or 1  -- seconds per time slot
  dd_gens[key] = st
  return st
end

local function dd_bucket(st, e)
  local b1, b2, b3 = dd_byte(e, 1, 3)
  local h = b1 * 65536 + b2 * 256 + b3
  local m = st.m
  local idx = h % m
  if idx < st.p then idx = h % (m + m) end
  return dd_format(st.name, idx)
end

-- Is entry e in generation st and still inside its window at time now?
local function dd_live(st, e, now)
  local slot = redis.call('HGET', dd_bucket(st, e), e)
  if not slot then return false end
  if st.w == 0 then return true end
  -- Rounded up: an entry is never released before its window has fully passed.
  return now < st.g * st.w + (tonumber(slot) + 1) * st.unit + st.w
end

local function dd_split(st)
  local m = st.m
  local src = dd_format(st.name, st.p)
  local dst = dd_format(st.name, st.p + m)
  local flat = dd_call('HGETALL', src)
  local moved, fields, k = {}, {}, 0
  local byte, m2 = dd_byte, m + m
  for i = 1, #flat, 2 do
    local f = flat[i]
    if #f == 6 then  -- (not DD_KEEP)
      local b1, b2, b3 = byte(f, 1, 3)
      if (b1 * 65536 + b2 * 256 + b3) % m2 >= m then  -- (the bit of 2^b: the new bucket's)
        k = k + 1
        fields[k] = f
        moved[k + k - 1] = f; moved[k + k] = flat[i + 1]
      end
    end
  end
  if k > 0 then
    dd_call('HSET', dst, unpack(moved))
    dd_call('HDEL', src, unpack(fields))
  elseif st.expire then
    -- Nothing moved (rare): create the new bucket now, so it has its expiry from the start.
    redis.call('HSET', dst, DD_KEEP, '')
  end
  if st.expire then dd_touched[dst] = st.expire; dd_touched[src] = st.expire end
  st.p = st.p + 1
  if st.p >= st.m then
    st.b = st.b + 1
    st.m = 2 ^ st.b
    st.p = 0
  end
end

-- The generations to consult at time now: the current one and (with a window) the previous.
-- The same list is returned while root, window and generation stay the same (every URL of a
-- batch, usually): callers must not modify it.
local function dd_generations(root, w, now)
  local g = (w == 0) and 0 or math.floor(now / w)
  local last = dd_pairs[root]
  if last and last[1] == w and last[2] == g then return last[3] end
  local gens
  if w == 0 then gens = {dd_gen(root, 0, 0)} else
    gens = {dd_gen(root, w, g), dd_gen(root, w, g - 1)}
  end
  dd_pairs[root] = {w, g, gens}
  return gens
end

-- Entry e (6 bytes) for one root and window at time now: a function(e) that is true when e
-- was new (and is now recorded), false when the site has seen it in its window. What is the
-- same for every URL of a call (the generations, the time slot) is worked out once, here.
-- In the current generation, HSETNX is the lookup and the insert in one command.
--
-- Bucket expiry without an EXPIREAT per URL: a bucket key is created without one only by
-- the HSETNX of its first entry. That is a generation's first buckets (armed at every insert
-- of its first DD_ARM_ALL entries, by which time every first bucket has entries), a split's
-- new bucket (armed by the split, which creates it) and a bucket emptied by a release (which
-- keeps it alive with DD_KEEP instead). So no bucket ever lacks its expiry.
local function dd_adder(root, w, now)
  local gens = dd_generations(root, w, now)
  local st, prev = gens[1], gens[2]
  if prev and prev.n == 0 then prev = nil end
  -- (a string: Redis would format a Lua number for every HSETNX)
  local slot = (st.w > 0) and tostring(math.floor((now - st.g * st.w) / st.unit)) or '0'
  local name, expire = st.name, st.expire
  local byte, format, call = dd_byte, dd_format, dd_call
  -- h: e's bytes 1-3 as a number, when the caller has read them (enqueue.lua: with the root)
  return function(e, h)
    if prev and dd_live(prev, e, now) then return false end
    if not h then  -- (dd_bucket, inlined: a call less per URL)
      local b1, b2, b3 = byte(e, 1, 3)
      h = b1 * 65536 + b2 * 256 + b3
    end
    local m = st.m
    local idx = h % m
    if idx < st.p then idx = h % (m + m) end
    local bucket = format(name, idx)
    if call('HSETNX', bucket, e, slot) == 0 then return false end
    local n = st.n
    if n < DD_ARM_ALL and expire then dd_touched[bucket] = expire end
    n = n + 1
    st.n = n
    st.dirty = true
    if n > DD_LOAD * (m + st.p) and st.b < DD_MAX_LEVEL then dd_split(st) end
    return true
  end
end

-- dd_adder's test for one entry. (A whole 16-byte fingerprint is taken too: requeue.lua
-- passes one.)
local function dd_add(root, w, e, now)
  if #e > 6 then e = string.sub(e, 1, 6) end
  return dd_adder(root, w, now)(e)
end

-- (dd_seen and dd_release take the whole 16-byte fingerprint)
local function dd_seen(root, fp, now)
  local e = string.sub(fp, 1, 6)
  for _, st in ipairs(dd_generations(root, dd_window(root, nil), now)) do
    if st.n > 0 and dd_live(st, e, now) then return true end
  end
  return false
end

-- Forget fp (a dead-lettered URL).
local function dd_release(root, fp, now)
  local e = string.sub(fp, 1, 6)
  local removed = 0
  for _, st in ipairs(dd_generations(root, dd_window(root, nil), now)) do
    if st.n > 0 then
      local bucket = dd_bucket(st, e)
      if redis.call('HDEL', bucket, e) == 1 then
        st.n = st.n - 1
        st.dirty = true
        removed = removed + 1
        if st.expire and redis.call('EXISTS', bucket) == 0 then
          -- That emptied the bucket: keep it (see dd_adder), or its next first entry would
          -- create it without an expiry.
          redis.call('HSET', bucket, DD_KEEP, '')
          dd_touched[bucket] = st.expire
        end
      end
    end
  end
  return removed
end

local function dd_from_hex(hex)
  return (string.gsub(hex, '%x%x', function(c) return string.char(tonumber(c, 16)) end))
end

-- Write back the generation states and expiry times changed during this call.
local function dd_flush()
  for _, st in pairs(dd_gens) do
    if st.dirty then
      redis.call('HSET', st.key, 'n', st.n, 'b', st.b, 'p', st.p, 'q', st.q)
      if st.expire then redis.call('EXPIREAT', st.key, st.expire) end
    end
  end
  for key, at in pairs(dd_touched) do redis.call('EXPIREAT', key, at) end
end
