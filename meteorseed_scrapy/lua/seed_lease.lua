-- Move a claimed seed's due time to now + ARGV[2] seconds (Redis TIME): renews the lease of a
-- long run, or (0) hands the seed back to be run at once. Never schedules a seed that is not
-- in the due set (deleted, or unscheduled meanwhile).
-- KEYS[1]  due set    ARGV[1]  seed_id    ARGV[2]  seconds from now
-- Returns 1 when moved, 0 when the seed is not in the due set.
local t = redis.call('TIME')
local at = tonumber(t[1]) + tonumber(t[2]) / 1000000 + tonumber(ARGV[2])
return redis.call('ZADD', KEYS[1], 'XX', 'CH', string.format('%.6f', at), ARGV[1])
