-- dedup_lib.lua: the two-layer URL dedup of one site, shared by enqueue.lua, dead.lua,
-- dedup_release.lua and dedup_seen.lua (scripts.py pastes it where a script says
-- "--#include dedup_lib"). It defines functions only; it reads no KEYS or ARGV itself.
--
-- Layout (documented in keys.py): the site root <ns>:seen:{site} is a hash holding 'w', the
-- site's re-crawl window in seconds (0 or absent = never re-crawl). A generation lives under
-- <root>:<w>:<g>, g = floor(now / w) (always 0 when w = 0):
--   <root>:<w>:<g>        hash    n (entries), b/p (linear-hashing level and split pointer),
--                                 s (Bloom slices), f (entries in the newest slice)
--   <root>:<w>:<g>:f<i>   string  Bloom slice i: blocked Bloom, 64-bit blocks, 5 bits/URL
--   <root>:<w>:<g>:<j>    hash    exact bucket j: 6-byte fingerprint prefix -> insertion time
--                                 slot; small enough to stay listpack/ziplist-encoded
-- A generation's keys expire at (g + 2) * w (+ slack): by then every entry is out of its
-- window, so old URLs age out with their keys instead of growing forever.
--
-- A fingerprint is 16 raw bytes (SHA-256 prefix of the canonical request): bytes 1-6 are the
-- exact-layer entry (bytes 1-3 also pick its bucket), bytes 7-10 the Bloom block, bytes 11-15
-- the bit positions inside the block.

local DD_LOAD = 40          -- mean entries per bucket before a split: even unsplit buckets
                            -- (twice the mean) stay far below the 128-entry listpack limit
local DD_BASE_LEVEL = 4     -- a generation starts with 2^4 buckets
local DD_MAX_LEVEL = 23     -- bucket index bits come from 24 fingerprint bits
local DD_SLICE0 = 65536     -- URLs in the first Bloom slice
local DD_GROWTH = 4         -- each next slice holds 4x more: few slices to probe
local DD_BITS = 10          -- Bloom bits per URL (blocked Bloom: ~1-2 % false positives)
local DD_SLOTS = 8000       -- time resolution of an entry: its window / 8000
local DD_SLACK = 60         -- seconds kept past a generation's last useful moment

local dd_gens = {}          -- generation states read during this call, by key
local dd_touched = {}       -- bucket key -> expire-at, for keys written during this call
local dd_pairs = {}         -- root -> {w, g, generations} last used (one lookup per URL)
local DD_P2 = {[0] = 1, 2, 4, 8, 16, 32, 64, 128}  -- bit values (2 ^ x is slow in Lua 5.1)

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
  local v = redis.call('HMGET', key, 'n', 'b', 'p', 's', 'f')
  st = {key = key, w = w, g = g, n = tonumber(v[1]) or 0, b = tonumber(v[2]) or DD_BASE_LEVEL,
        p = tonumber(v[3]) or 0, s = tonumber(v[4]) or 0, f = tonumber(v[5]) or 0,
        dirty = false, expire = (w > 0) and ((g + 2) * w + DD_SLACK) or nil}
  st.m = 2 ^ st.b  -- buckets before the split pointer: 2^b (cached; changes on a split)
  st.key_ = key .. ':'
  dd_gens[key] = st
  return st
end

local function dd_bucket_index(st, fp)
  local b1, b2, b3 = string.byte(fp, 1, 3)
  local h = b1 * 65536 + b2 * 256 + b3
  local idx = h % st.m
  if idx < st.p then idx = h % (st.m * 2) end
  return idx
end

local function dd_bucket(st, fp)
  return st.key_ .. dd_bucket_index(st, fp)
end

-- The Bloom block of fp in a slice of `capacity` URLs: its first byte offset, and the five
-- bits (1-based byte index within the 8-byte block, bit value) fp sets there. One block per
-- URL means one GETRANGE per probe instead of five GETBITs.
local function dd_bloom_block(fp, capacity)
  local blocks = capacity * DD_BITS / 64
  local c7, c8, c9, c10 = string.byte(fp, 7, 10)
  local x = ((c7 * 256 + c8) * 256 + c9) * 256 + c10
  return (x % blocks) * 8
end

local function dd_block_has(block, fp)
  for i = 11, 15 do
    local q = string.byte(fp, i) % 64
    local r = q % 8
    local byte = string.byte(block, (q - r) / 8 + 1) or 0
    if bit.band(byte, DD_P2[r]) == 0 then return false end
  end
  return true
end

-- False = certainly not in this generation; true = maybe (the exact layer decides).
local function dd_bloom_maybe(st, fp)
  for i = 0, st.s - 1 do
    local at = dd_bloom_block(fp, DD_SLICE0 * DD_GROWTH ^ i)
    if dd_block_has(redis.call('GETRANGE', st.key .. ':f' .. i, at, at + 7), fp) then
      return true
    end
  end
  return false
end

local function dd_bloom_add(st, fp)
  if st.s == 0 or st.f >= DD_SLICE0 * DD_GROWTH ^ (st.s - 1) then
    local slice = st.key .. ':f' .. st.s
    -- Allocate the whole slice now (zeros): later writes never resize it.
    redis.call('SETRANGE', slice, DD_SLICE0 * DD_GROWTH ^ st.s * DD_BITS / 8 - 1, '\0')
    if st.expire then redis.call('EXPIREAT', slice, st.expire) end
    st.s = st.s + 1
    st.f = 0
  end
  local slice = st.key .. ':f' .. (st.s - 1)
  local at = dd_bloom_block(fp, DD_SLICE0 * DD_GROWTH ^ (st.s - 1))
  local b1, b2, b3, b4, b5, b6, b7, b8 = string.byte(redis.call('GETRANGE', slice, at, at + 7),
                                                    1, 8)
  -- (or 0: a slice that expired under a skewed clock reads short)
  local block = {b1 or 0, b2 or 0, b3 or 0, b4 or 0, b5 or 0, b6 or 0, b7 or 0, b8 or 0}
  local bor = bit.bor
  for i = 11, 15 do
    local q = string.byte(fp, i) % 64
    local r = q % 8
    local j = (q - r) / 8 + 1
    block[j] = bor(block[j], DD_P2[r])
  end
  redis.call('SETRANGE', slice, at, string.char(block[1], block[2], block[3], block[4],
                                                block[5], block[6], block[7], block[8]))
  st.f = st.f + 1
end

-- Is the entry for fp in generation st still inside its window at time now?
local function dd_exact_live(st, fp, now)
  local slot = redis.call('HGET', dd_bucket(st, fp), string.sub(fp, 1, 6))
  if not slot then return false end
  if st.w == 0 then return true end
  local unit = math.ceil(st.w / DD_SLOTS)
  -- Rounded up: an entry is never released before its window has fully passed.
  return now < st.g * st.w + (tonumber(slot) + 1) * unit + st.w
end

local function dd_split(st)
  local src_idx = st.p
  local dst_idx = st.p + 2 ^ st.b
  local src = st.key .. ':' .. src_idx
  local flat = redis.call('HGETALL', src)
  local moved, fields = {}, {}
  for i = 1, #flat, 2 do
    local f = flat[i]
    local h = string.byte(f, 1) * 65536 + string.byte(f, 2) * 256 + string.byte(f, 3)
    if math.floor(h / 2 ^ st.b) % 2 == 1 then
      moved[#moved + 1] = f; moved[#moved + 1] = flat[i + 1]
      fields[#fields + 1] = f
    end
  end
  if #fields > 0 then
    local dst = st.key .. ':' .. dst_idx
    redis.call('HSET', dst, unpack(moved))
    redis.call('HDEL', src, unpack(fields))
    if st.expire then dd_touched[dst] = st.expire; dd_touched[src] = st.expire end
  end
  st.p = st.p + 1
  if st.p >= st.m then
    st.b = st.b + 1
    st.m = 2 ^ st.b
    st.p = 0
  end
end

-- Record fp in the current generation st unless it is already there; true when it was new.
-- HSETNX is the exact lookup and the insert in one command, so the current generation needs
-- no Bloom probe: the Bloom is written here and read when this generation is the previous one.
local function dd_insert(st, fp, now)
  local slot = 0
  if st.w > 0 then slot = math.floor((now - st.g * st.w) / math.ceil(st.w / DD_SLOTS)) end
  local bucket = dd_bucket(st, fp)
  if redis.call('HSETNX', bucket, string.sub(fp, 1, 6), slot) == 0 then return false end
  if st.w > 0 then
    dd_bloom_add(st, fp)
    -- Expiry of buckets: every new generation's first entries, then ~1 insert in 4 (by a
    -- fingerprint byte) re-arms it, instead of one EXPIREAT per URL; split targets always.
    if st.n < 4096 or string.byte(fp, 16) % 4 == 0 then dd_touched[bucket] = st.expire end
  end
  st.n = st.n + 1
  st.dirty = true
  if st.b < DD_MAX_LEVEL and st.n > DD_LOAD * (st.m + st.p) then dd_split(st) end
  return true
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

-- True when fp was new (and is now recorded), false when the site has seen it in its window.
-- The previous generation is probed through its Bloom filter first: for a new URL (the
-- common case) its "definitely not" saves the exact lookup; a Bloom hit is only ever a
-- "maybe" that the exact layer confirms, so a Bloom false positive never drops a URL.
local function dd_add(root, w, fp, now)
  local gens = dd_generations(root, w, now)
  local prev = gens[2]
  if prev and prev.n > 0 and dd_bloom_maybe(prev, fp) and dd_exact_live(prev, fp, now) then
    return false
  end
  return dd_insert(gens[1], fp, now)
end

local function dd_seen(root, fp, now)
  for _, st in ipairs(dd_generations(root, dd_window(root, nil), now)) do
    if st.n > 0 and dd_exact_live(st, fp, now) then return true end
  end
  return false
end

-- Forget fp (a dead-lettered URL). The Bloom bits stay: a Bloom hit is only ever a "maybe".
local function dd_release(root, fp, now)
  local removed = 0
  for _, st in ipairs(dd_generations(root, dd_window(root, nil), now)) do
    if st.n > 0 and redis.call('HDEL', dd_bucket(st, fp), string.sub(fp, 1, 6)) == 1 then
      st.n = st.n - 1
      st.dirty = true
      removed = removed + 1
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
      redis.call('HSET', st.key, 'n', st.n, 'b', st.b, 'p', st.p, 's', st.s, 'f', st.f)
      if st.expire then redis.call('EXPIREAT', st.key, st.expire) end
    end
  end
  for key, at in pairs(dd_touched) do redis.call('EXPIREAT', key, at) end
end
