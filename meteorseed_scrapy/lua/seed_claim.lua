-- Claim due seeds: each one's due score becomes its lease expiry, in the same step, so two
-- seeders never run one seed at once (a dead seeder's seeds come back when its lease ends).
-- KEYS[1]  due set (zset seed_id -> epoch seconds)
-- ARGV[1]  now, epoch seconds ("" = Redis TIME, what every seeder agrees on)
-- ARGV[2]  most seeds to claim    ARGV[3]  lease, seconds
-- Returns {now, seed_id...} (now as a decimal string).
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
else
  now = tonumber(ARGV[1])
end
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%.6f', now),
                       'LIMIT', 0, tonumber(ARGV[2]))
local expiry = string.format('%.6f', now + tonumber(ARGV[3]))
for _, id in ipairs(ids) do
  redis.call('ZADD', KEYS[1], 'XX', expiry, id)
end
local out = {string.format('%.6f', now)}
for _, id in ipairs(ids) do
  out[#out + 1] = id
end
return out
