-- A 429/403 from a site: pause it on every worker for
-- min(cap, max(retry_after, base * 2^(strikes-1))) * (1 + jitter), and tighten its rate for a
-- while. A pause only ever grows: a later, shorter one does not cut an earlier one short.
-- KEYS[1]  the site's pause marker (string with a PX expiry)
-- KEYS[2]  the site's strike counter (consecutive 429/403s, forgotten after a quiet period)
-- KEYS[3]  the site's tightening factor (string with a PX expiry)
-- ARGV[1]  Retry-After, ms (0 = none)
-- ARGV[2]  backoff base, ms
-- ARGV[3]  backoff cap, ms
-- ARGV[4]  jitter factor drawn by the caller (e.g. 0.0 to 0.1)
-- ARGV[5]  strike memory, ms
-- ARGV[6]  tightening factor (0 < f <= 1)
-- ARGV[7]  tightening duration, ms
-- Returns {strikes, pause_ms in force}.
local strikes = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
local exp = math.min(strikes - 1, 30)
local pause = math.max(tonumber(ARGV[1]), tonumber(ARGV[2]) * (2 ^ exp))
pause = math.floor(math.min(tonumber(ARGV[3]), pause) * (1 + tonumber(ARGV[4])))
local current = redis.call('PTTL', KEYS[1])
if current < pause then
  redis.call('SET', KEYS[1], '1', 'PX', pause)
  current = pause
end
redis.call('SET', KEYS[3], ARGV[6], 'PX', ARGV[7])
return {strikes, current}
