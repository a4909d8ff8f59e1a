-- Upsert a seed's definition in the registry, keeping its run state. A new or changed seed is
-- due at once (Redis TIME), so an edit (a keyword added or removed) takes effect now, not at
-- the next scheduled run; an unchanged one keeps its schedule.
-- KEYS[1]  the seed's hash            KEYS[2]  index of every seed (zset)
-- KEYS[3]  by-site index (zset)       KEYS[4]  due set (zset)
-- ARGV[1]  seed_id    ARGV[2]  definition JSON (canonical)    ARGV[3]  site_id
-- ARGV[4]  schedule JSON ("" = none)
-- ARGV[5]  lease, seconds ("" = none): the caller runs the seed itself, so instead of "due now"
--          it is leased to the caller (due at now + lease) in this same step, when it is new,
--          changed or due; a seed leased by someone else (due in the future) is left alone.
-- ARGV[6]  digest of the definition: a one-shot seed whose URL list was let go after its run
--          (seed_compact.lua) is unchanged when the digest it kept matches
-- Returns {status, now, leased}: status 0 unchanged, 1 added, 2 changed; now as a decimal
-- string; leased 1 when the lease was taken.
local t = redis.call('TIME')
local now = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000)
local old = redis.call('HMGET', KEYS[1], 'def', 'site', 'sched', 'full')
local id = ARGV[1]
local due_at = now
if ARGV[5] ~= '' then
  due_at = string.format('%.6f', tonumber(now) + tonumber(ARGV[5]))
end
if old[1] == ARGV[2] or (old[4] and old[4] == ARGV[6]) then
  if ARGV[5] ~= '' then
    local score = redis.call('ZSCORE', KEYS[4], id)
    if not score or tonumber(score) <= tonumber(now) then
      redis.call('ZADD', KEYS[4], due_at, id)
      return {0, now, 1}
    end
  end
  return {0, now, 0}
end
local status = 1
if old[1] then
  status = 2
  if old[2] and old[2] ~= ARGV[3] then
    redis.call('ZREM', KEYS[3], old[2] .. '\t' .. id)
  end
  if old[3] ~= ARGV[4] then
    -- A new schedule starts afresh: what was learnt under the old one does not apply.
    redis.call('HDEL', KEYS[1], 'interval_s', 'rate', 'failures')
  end
  redis.call('HINCRBY', KEYS[1], 'rev', 1)
else
  redis.call('HSET', KEYS[1], 'added_at', now, 'rev', 1, 'runs', 0, 'failures', 0)
end
redis.call('HSET', KEYS[1], 'def', ARGV[2], 'site', ARGV[3], 'sched', ARGV[4], 'updated_at', now)
if old[4] then redis.call('HDEL', KEYS[1], 'full') end
redis.call('ZADD', KEYS[2], 0, id)
redis.call('ZADD', KEYS[3], 0, ARGV[3] .. '\t' .. id)
redis.call('ZADD', KEYS[4], due_at, id)
return {status, now, ARGV[5] ~= '' and 1 or 0}
