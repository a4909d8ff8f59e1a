-- Take up to N dispatch permits for one site, fleet-wide: a token from the site's bucket (rate
-- and burst, refilled by Redis TIME, never worker clocks) plus a concurrency lease each, unless
-- the site is paused. Tokens are charged here, right before dispatch, not when a task is read.
-- KEYS[1]  the site's token bucket (hash: tokens, ts)
-- KEYS[2]  the site's pause marker (string with a PX expiry)
-- KEYS[3]  the site's concurrency leases (zset: lease id -> expiry, ms)
-- KEYS[4]  the site's tightening factor after a 429/403 (string with an expiry; absent = 1)
-- KEYS[5]  the site's circuit breaker (hash: state open|ramp, step; absent = closed)
-- KEYS[6]  the site's probe lock (string with a PX expiry)
-- ARGV[1]  rate, tokens per second
-- ARGV[2]  burst
-- ARGV[3]  concurrency cap
-- ARGV[4]  lease time to live, ms (renewed while the request is in flight)
-- ARGV[5]  permits wanted
-- ARGV[6]  lease id prefix (unique per call)
-- KEYS[7]  the site's adaptive state (hash, lua/adaptive.lua: delay ms)
-- KEYS[8]  the site's robots.txt caps (hash: host -> least ms between two requests)
-- ARGV[7]  probe interval, ms (an open breaker lets one probe through per interval, fleet-wide)
-- ARGV[8]  1: the site's rate follows its adaptive delay (absent: ARGV[9]), its concurrency
--          and burst at most ARGV[10] and ARGV[11]; 0: not adaptive
-- ARGV[9]  adaptive start delay, ms
-- ARGV[10] adaptive concurrency
-- ARGV[11] adaptive burst
-- ARGV[12] 1: robots.txt Crawl-delay / Request-rate cap the rate (burst 1), and until a worker
--          has read the site's robots.txt (KEYS[8] absent) one request at a time goes; 0: ignored
-- KEYS[9]  the site's operator hold (string; present = held: nothing granted, asked again in
--          an hour or when resumed, the reply {0, ARGV[13], 'held'}; politeness/control.py)
-- KEYS[10] the site's operator override (hash: rate, concurrency; they replace ARGV[1] and
--          ARGV[3], the burst then at most the rate)
-- ARGV[13] ms a held site's caller waits before asking again (its tasks are parked meanwhile)
-- The configured rate and concurrency stay ceilings; a 429's tightening and the breaker's ramp
-- scale what is left.
-- Returns {granted, wait_ms, lease_id...}: wait_ms says when asking again makes sense.
-- A lease id is '<prefix>@<Redis time of the grant, ms>:<n>', a probe's '<prefix>@<ms>:probe':
-- a 429 to the request it carried strikes only when granted after the site's last pause began.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if KEYS[9] and redis.call('EXISTS', KEYS[9]) == 1 then
  return {0, tonumber(ARGV[13]), 'held'}
end
local paused = redis.call('PTTL', KEYS[2])
if paused > 0 then
  return {0, paused}
end
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cap = tonumber(ARGV[3])
if KEYS[10] then
  local override = redis.call('HMGET', KEYS[10], 'rate', 'concurrency')
  local r, c = tonumber(override[1]), tonumber(override[2])
  if r and r == r and r > 0 then
    rate = r
    burst = math.max(1, math.min(burst, math.floor(r)))
  end
  if c and c == c and c >= 1 then
    cap = math.floor(c)
  end
end
if ARGV[8] == '1' then
  local delay = tonumber(redis.call('HGET', KEYS[7], 'delay') or ARGV[9])
  if delay == nil or delay ~= delay then
    delay = tonumber(ARGV[9])  -- damaged: as if new
  end
  if delay > 0 then
    rate = math.min(rate, 1000 / delay)
  end
  cap = math.min(cap, tonumber(ARGV[10]))
  burst = math.min(burst, tonumber(ARGV[11]))
end
if ARGV[12] == '1' then
  local most = 0
  local hosts = redis.call('HVALS', KEYS[8])
  if #hosts == 0 then
    cap, burst = 1, 1  -- robots.txt not read yet: its Crawl-delay may forbid a burst
  end
  for _, v in ipairs(hosts) do
    local ms = tonumber(v)
    if ms and ms == ms and ms > most and ms < 1e12 then
      most = ms
    end
  end
  if most > 0 then
    rate = math.min(rate, 1000 / most)
    burst = 1  -- a Crawl-delay is the time between two requests: none go together
  end
end
local factor = tonumber(redis.call('GET', KEYS[4]) or '1')
rate = rate * factor
local breaker = redis.call('HMGET', KEYS[5], 'state', 'step')
if breaker[1] == 'open' then
  local probe = ARGV[6] .. '@' .. now .. ':probe'
  if redis.call('SET', KEYS[6], probe, 'NX', 'PX', ARGV[7]) then
    redis.call('ZADD', KEYS[3], now + tonumber(ARGV[4]), probe)
    return {1, 0, probe}
  end
  return {0, math.max(1, redis.call('PTTL', KEYS[6]))}
elseif breaker[1] == 'ramp' then
  local steps = {0.01, 0.05, 0.25, 0.5}
  rate = rate * (steps[tonumber(breaker[2])] or 1)
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local free = cap - redis.call('ZCARD', KEYS[3])
if free <= 0 then
  return {0, 50}
end
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1])
local ts = tonumber(b[2])
if tokens == nil or ts == nil then
  tokens = burst
  ts = now
end
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate / 1000)
local n = math.min(tonumber(ARGV[5]), free, math.floor(tokens))
local ttl = math.ceil(burst / rate * 1000) + 60000
if n <= 0 then
  redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', now)
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {0, math.max(1, math.ceil((1 - tokens) * 1000 / rate))}
end
tokens = tokens - n
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', now)
redis.call('PEXPIRE', KEYS[1], ttl)
local out = {n, 0}
local expiry = now + tonumber(ARGV[4])
for i = 1, n do
  local id = ARGV[6] .. '@' .. now .. ':' .. i
  redis.call('ZADD', KEYS[3], expiry, id)
  out[#out + 1] = id
end
redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[4]) + 60000)
return out
