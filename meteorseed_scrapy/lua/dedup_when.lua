-- dedup_when.lua: whether a site has seen one fingerprint within its re-crawl window, and
-- when it becomes eligible again (read only; queue/inspect/task_state.py, `meteorseed task`).
-- KEYS[1]  the site's dedup root <ns>:seen:{site}
-- ARGV[1]  now, epoch seconds ('' = the server's TIME)
-- ARGV[2]  the fingerprint, 16 raw bytes (queue/enqueue/dedup.py)
-- Returns  {now} when it is not seen, else {now, window, seen_from, eligible_at}: window in
--          seconds (0 = never re-crawled: eligible_at is 0, seen_from 0), seen_from the start of
--          the time slot its entry was recorded in (the record keeps the slot, not the second),
--          eligible_at when the entry leaves its window (a seed may enqueue it again from then).

--#include dedup_lib

local now = dd_now(ARGV[1])
local root, fp = KEYS[1], ARGV[2]
if #fp ~= 16 or redis.call('TYPE', root)['ok'] ~= 'hash' then return {now} end
-- (the stored window, read without dd_window: this script never writes)
local w = tonumber(redis.call('HGET', root, 'w') or '0') or 0
local e = string.sub(fp, 1, 6)  -- the entry: the fingerprint's first 6 bytes (dedup_lib.lua)
for _, st in ipairs(dd_generations(root, w, now)) do
  local slot = st.n > 0 and tonumber(redis.call('HGET', dd_bucket(st, e), e))
  if slot then
    if w == 0 then return {now, 0, 0, 0} end
    -- As dedup_lib's liveness test: rounded up, never released before the window has passed.
    local eligible = st.g * w + (slot + 1) * st.unit + w
    if now < eligible then return {now, w, st.g * w + slot * st.unit, eligible} end
  end
end
return {now}
