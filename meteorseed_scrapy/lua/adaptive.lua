-- One worker's latency samples of one site (summed since its last flush) join the fleet's, and
-- at most once per interval (Redis TIME) the site's delay is recomputed from every worker's
-- samples of that window, with Scrapy's AutoThrottle rule made fleet-wide:
--   want = mean latency / target concurrency (seconds between two requests of the fleet)
--   want > delay: delay = want (at once); else halfway: max(want, (delay + want) / 2),
--   from the 200 answers only (errors and 5xx never lower the delay); then within [min, max].
-- lua/gate.lua grants the site's permits at 1 / delay.
-- KEYS[1]  the site's adaptive state (hash: delay, latency (ms, of the last window), at (ms
--          the window began), n, sum, good, good_sum (the window's samples so far), updates)
-- ARGV[1]  responses in the samples
-- ARGV[2]  their latency, summed, ms
-- ARGV[3]  of them 200s
-- ARGV[4]  their latency, summed, ms
-- ARGV[5]  target concurrency (> 0)
-- ARGV[6]  start delay, ms
-- ARGV[7]  least delay, ms
-- ARGV[8]  greatest delay, ms
-- ARGV[9]  update interval, ms
-- ARGV[10] time to live of the state, ms (an idle site starts again at the start delay)
-- Returns {delay ms, latency ms of the last window ('' when none yet)} as strings.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local s = redis.call('HMGET', KEYS[1], 'delay', 'at', 'n', 'sum', 'good', 'good_sum', 'latency')
local low, high = tonumber(ARGV[7]), tonumber(ARGV[8])
local function finite(x)
  return x ~= nil and x == x and x ~= math.huge and x ~= -math.huge and x >= 0
end
local function read(x, default)
  local v = tonumber(x)
  if finite(v) then return v end
  return default  -- absent or damaged: as if new
end
local delay = read(s[1], tonumber(ARGV[6]))
local at = read(s[2], now)
local n = read(s[3], 0) + tonumber(ARGV[1])
local sum = read(s[4], 0) + tonumber(ARGV[2])
local good = read(s[5], 0) + tonumber(ARGV[3])
local good_sum = read(s[6], 0) + tonumber(ARGV[4])
local latency = s[7] or ''
if now - at >= tonumber(ARGV[9]) and n > 0 then
  local target = tonumber(ARGV[5])
  local mean = sum / n
  local want = mean / target
  local new = delay
  if want > delay then
    new = want
  elseif good > 0 then
    local want_good = good_sum / good / target
    new = math.max(want_good, (delay + want_good) / 2)
  end
  new = math.min(math.max(low, new), high)
  delay = new
  latency = tostring(mean)
  redis.call('HSET', KEYS[1], 'delay', tostring(delay), 'latency', latency, 'at', now,
             'n', 0, 'sum', 0, 'good', 0, 'good_sum', 0)
  redis.call('HINCRBY', KEYS[1], 'updates', 1)
else
  delay = math.min(math.max(low, delay), high)
  redis.call('HSET', KEYS[1], 'delay', tostring(delay), 'at', at, 'n', n, 'sum', tostring(sum),
             'good', good, 'good_sum', tostring(good_sum))
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[10]))
return {tostring(delay), latency}
