-- Workers listed in the live-worker registry whose liveness has lapsed: dead.
-- KEYS[1]  the live-worker registry (zset: consumer -> liveness deadline, ms)
-- ARGV[1]  the consumer asking (never reported)
-- ARGV[2]  at most this many names
-- Returns the names; nil when the registry key holds another type. Nothing when the asker's
-- own liveness has lapsed too: its heartbeat is late (or Redis's clock jumped), so its view
-- of the others cannot be trusted.
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then return {} end
if kind ~= 'zset' then return false end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local own = redis.call('ZSCORE', KEYS[1], ARGV[1])
if own and tonumber(own) < now then return {} end
local n = tonumber(ARGV[2])
local out = {}
-- (one more than asked for, in case the asker is among them)
for _, name in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. now, 'LIMIT', 0, n + 1)) do
  if name ~= ARGV[1] and #out < n then out[#out + 1] = name end
end
return out
