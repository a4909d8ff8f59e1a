-- history_lib.lua: what became of a site's URLs (done, 404, robots, blacklist, dead,
-- cancelled), kept for the retention (METEORSEED_TASK_HISTORY_RETENTION) and bounded per site
-- (METEORSEED_TASK_HISTORY_PER_SITE). Shared by history_add.lua and history_get.lua; it
-- defines functions only. Buckets, linear hashing and expiry arming are the dedup layer's
-- (dedup_lib.lua, included here): a record is a listpack hash field like a dedup entry.
--
-- Layout (documented in keys.py): the site's history root <ns>:hist:{site} is a hash holding
-- 'g' (the current generation), 't' (when it started, epoch s) and 'w' (its width, s: the
-- retention / HS_GENS). Generation g lives under <root>:<w>:<g> (hash: n, b, p, q as a dedup
-- generation, 't' its start, 'c:<consumer>' -> number and 'i:<number>' -> consumer) and its
-- buckets <root>:<w>:<g>:<j> (6-byte fingerprint prefix -> record). A record is
-- "<code><s since t>,<items>,<status>,<consumer number>[,<reason>]", code one of
-- d (done), g (gone: 404/410), r (robots.txt), b (blacklist), i (other ignored), x (dead),
-- c (cancelled): under 64 bytes, so buckets stay listpack-encoded.
--
-- A new generation starts when the current one is w old or holds its share of the per-site
-- bound (bound / HS_GENS); the one HS_GENS + 1 back is then deleted. A generation's keys
-- expire at t + (HS_GENS + 1) * w: a record is kept for the retention at least (less only
-- when the site writes more than the bound within it), and at most a generation longer.
--#include dedup_lib

local HS_GENS = 4

-- The state of root's history: current generation number, its start, width (nil: none).
local function hs_root(root)
  local v = redis.call('HMGET', root, 'g', 't', 'w')
  return tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
end

-- dd_gen's state of generation g, with the history's expiry and start time.
local function hs_gen(root, w, g, t)
  local st = dd_gen(root, w, g)
  if t then st.expire = t + (HS_GENS + 1) * w end
  return st
end

local function hs_drop(root, w, g)
  local key = root .. ':' .. w .. ':' .. g
  local b, p
  local st = dd_gens[key]
  if st then  -- (written during this call: its state is not in Redis yet)
    b, p = st.b, st.p
    st.dirty = false
  else
    local v = redis.call('HMGET', key, 'b', 'p')
    if not v[1] then return end
    b, p = tonumber(v[1]), tonumber(v[2]) or 0
  end
  local batch = {}
  for j = 0, 2 ^ b + p - 1 do
    batch[#batch + 1] = key .. ':' .. j
    if #batch == 1000 then redis.call('UNLINK', unpack(batch)); batch = {} end
  end
  batch[#batch + 1] = key
  redis.call('UNLINK', unpack(batch))
end
