-- dedup_when.lua: whether a site has seen one fingerprint within its re-crawl window, and
-- when it becomes eligible again (read only; queue/task_state.py, `meteorseed task`).
-- KEYS[1]  the site's dedup root <ns>:seen:{site}
-- ARGV[1]  now, epoch seconds ('' = the server's TIME)
-- ARGV[2]  the fingerprint, 16 raw bytes (queue/dedup.py)
-- Returns  {now} when it is not seen, else {now, window, seen_from, eligible_at}: window in
--          seconds (0 = never re-crawled: eligible_at is 0, seen_from 0), seen_from the start of
--          the time slot its entry was recorded in (the record keeps the slot, not the second),
--          eligible_at when dd_exact_live stops holding (a seed may enqueue it again from then).

--#include dedup_lib

local now = dd_now(ARGV[1])
local root, fp = KEYS[1], ARGV[2]
if #fp ~= 16 or redis.call('TYPE', root)['ok'] ~= 'hash' then return {now} end
-- (the stored window, read without dd_window: this script never writes)
local w = tonumber(redis.call('HGET', root, 'w') or '0') or 0
for _, st in ipairs(dd_generations(root, w, now)) do
  if st.n > 0 and dd_exact_live(st, fp, now) then
    if w == 0 then return {now, 0, 0, 0} end
    local unit = math.ceil(w / DD_SLOTS)
    local slot = tonumber(redis.call('HGET', dd_bucket(st, fp), string.sub(fp, 1, 6))) or 0
    return {now, w, st.g * w + slot * unit, st.g * w + (slot + 1) * unit + w}
  end
end
return {now}
