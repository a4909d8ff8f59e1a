-- Renew this worker's concurrency leases for requests still in flight (a dead worker's leases
-- simply expire, so its share of the site's concurrency comes back by itself).
-- KEYS[1]  the site's concurrency leases (zset)
-- ARGV[1]  lease time to live, ms
-- ARGV[2..] lease ids
-- Returns the number of leases renewed.
local t = redis.call('TIME')
local expiry = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
local n = 0
for i = 2, #ARGV do
  n = n + redis.call('ZADD', KEYS[1], 'XX', 'CH', expiry, ARGV[i])
end
return n
