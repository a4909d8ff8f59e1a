-- A 429/403 from a site. A new strike pauses it on every worker for
-- min(cap, max(retry_after, base * 2^(strikes-1))) * (1 + jitter) and tightens its rate for a
-- while. Only a request granted its permit after the site's last pause began can strike: the
-- answers to requests already in flight then (a burst of 429s) confirm that pause, so a burst
-- is one strike, not one per request; they may lengthen it to their own Retry-After, no more.
-- A pause only ever grows: a later, shorter one does not cut an earlier one short.
-- KEYS[1]  the site's pause marker (string with a PX expiry)
-- KEYS[2]  the site's strikes (string '<strikes>:<ms the last strike paused the site>'; a bare
--          integer from older versions reads as strikes with no start; forgotten after a quiet
--          period)
-- KEYS[3]  the site's tightening factor (string with a PX expiry)
-- ARGV[1]  Retry-After, ms (0 = none)
-- ARGV[2]  backoff base, ms
-- ARGV[3]  backoff cap, ms
-- ARGV[4]  jitter factor drawn by the caller (e.g. 0.0 to 0.1)
-- ARGV[5]  strike memory, ms
-- ARGV[6]  tightening factor (0 < f <= 1)
-- ARGV[7]  tightening duration, ms
-- ARGV[8]  Redis time (ms) the request's permit was granted (0 = unknown: it strikes)
-- Returns {strikes, pause_ms in force, 1 if this was a new strike else 0}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local strikes, since = 0, -1
local record = redis.call('GET', KEYS[2])
if record then
  local n, s = string.match(record, '^(%d+):(%d+)$')
  n = n or string.match(record, '^(%d+)$')  -- anything else (corrupt) reads as no strikes
  strikes, since = math.min(tonumber(n or 0), 1000000), tonumber(s or -1)
end
local retry_after = tonumber(ARGV[1])
local granted = tonumber(ARGV[8]) or 0
local current = redis.call('PTTL', KEYS[1])
if granted > 0 and granted <= since then
  -- In flight when the last pause began: it confirms that pause.
  if retry_after > 0 and retry_after > current then
    redis.call('SET', KEYS[1], '1', 'PX', retry_after)
    current = retry_after
  end
  return {strikes, math.max(current, 0), 0}
end
strikes = strikes + 1
local exp = math.min(strikes - 1, 30)
local pause = math.max(retry_after, tonumber(ARGV[2]) * (2 ^ exp))
pause = math.max(1, math.floor(math.min(tonumber(ARGV[3]), pause) * (1 + tonumber(ARGV[4]))))
if current < pause then
  redis.call('SET', KEYS[1], '1', 'PX', pause)
  current = pause
end
redis.call('SET', KEYS[2], strikes .. ':' .. now, 'PX', ARGV[5])
redis.call('SET', KEYS[3], ARGV[6], 'PX', ARGV[7])
return {strikes, current, 1}
