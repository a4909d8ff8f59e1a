-- A worker's heartbeat: list it in the live-worker registry, alive until now + TTL (Redis
-- time, so workers' clocks never matter). Sent by its keep-alive thread, which runs whatever
-- the reactor does, and stops when the reactor is stuck for good.
-- KEYS[1]  the live-worker registry (zset: consumer -> liveness deadline, ms)
-- ARGV[1]  this consumer
-- ARGV[2]  time to live, ms
-- Returns the deadline set; 0 when the registry key holds another type (left alone: this
-- worker is then not listed, and its tasks wait for CLAIM_IDLE as before).
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'zset' and kind ~= 'none' then return 0 end
local t = redis.call('TIME')
local deadline = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], deadline, ARGV[1])
return deadline
