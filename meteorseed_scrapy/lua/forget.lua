-- Drop dead workers from the live-worker registry once nothing is pending on them any more;
-- one that came back meanwhile (its liveness renewed) stays.
-- KEYS[1]  the live-worker registry (zset: consumer -> liveness deadline, ms)
-- ARGV     consumer names
-- Returns how many were dropped.
if redis.call('TYPE', KEYS[1])['ok'] ~= 'zset' then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = 0
for i = 1, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) < now then
    n = n + redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return n
