-- Record one worker's recent outcomes for a site into the fleet's sliding window, judge the
-- window, and move the site's circuit breaker: closed -> open -> (probe) -> ramp -> closed.
-- The breaker opens only when this worker's own window AND the fleet's are abnormal, so one
-- worker's bad network cannot trip a healthy site.
-- KEYS[1]  the site's health window (hash: '<second>:n' / ':e' / ':l' -> counts, latency ms)
-- KEYS[2]  the site's breaker (hash: state open|ramp, step, since (ms))
-- KEYS[3]  the site's probe lock (string with a PX expiry; held by the half-open probe)
-- KEYS[4]  the site's trouble start (string: Redis time in ms its continuous trouble began, with
--          a PX expiry renewed while the trouble lasts): the fleet's clock for giving up
-- ARGV[1]  requests finished since the last call
-- ARGV[2]  of which errors (5xx, timeouts, connection errors)
-- ARGV[3]  sum of their latencies, ms
-- ARGV[4]  window, s
-- ARGV[5]  minimum requests in the window before judging
-- ARGV[6]  error ratio that is abnormal
-- ARGV[7]  mean latency that is abnormal, ms
-- ARGV[8]  '1' when this worker's own window is abnormal
-- ARGV[9]  probe result: '' (none), 'ok' or 'fail'
-- ARGV[10] length of one ramp step, ms
-- ARGV[11] good answers since the last call (the site answered normally: its trouble is over)
-- ARGV[12] '1' when this worker saw the site throttle (a 429/403) since the last call
-- ARGV[13] trouble memory, ms: trouble not seen again within it is forgotten
-- Returns {state ('closed'|'open'|'ramp'), rate factor, fleet requests, fleet errors,
--          fleet mean latency ms, ms of continuous trouble so far (-1: none)}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local sec = math.floor(now / 1000)
local window = tonumber(ARGV[4])
if tonumber(ARGV[1]) > 0 then
  redis.call('HINCRBY', KEYS[1], sec .. ':n', ARGV[1])
  redis.call('HINCRBY', KEYS[1], sec .. ':e', ARGV[2])
  redis.call('HINCRBY', KEYS[1], sec .. ':l', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], (window + 5) * 1000)
end
local n, e, l = 0, 0, 0
local flat = redis.call('HGETALL', KEYS[1])
for i = 1, #flat, 2 do
  local s, kind = string.match(flat[i], '^(%d+):(%a)$')
  if s and tonumber(s) > sec - window then
    local v = tonumber(flat[i + 1])
    if kind == 'n' then n = n + v elseif kind == 'e' then e = e + v else l = l + v end
  elseif s then
    redis.call('HDEL', KEYS[1], flat[i])
  end
end
local mean = 0
if n > 0 then mean = l / n end
local abnormal = n >= tonumber(ARGV[5]) and
  (e / n > tonumber(ARGV[6]) or mean > tonumber(ARGV[7]))
local state = redis.call('HGET', KEYS[2], 'state') or 'closed'
local steps = {0.01, 0.05, 0.25, 0.5}
if ARGV[9] == 'ok' and state == 'open' then
  redis.call('HSET', KEYS[2], 'state', 'ramp', 'step', 1, 'since', now)
  redis.call('DEL', KEYS[3], KEYS[1])  -- judge the ramp on fresh numbers only
  state = 'ramp'
elseif state ~= 'open' and ((abnormal and ARGV[8] == '1') or (state == 'ramp' and abnormal)) then
  redis.call('HSET', KEYS[2], 'state', 'open', 'step', 0, 'since', now)
  state = 'open'
elseif state == 'ramp' then
  local since = tonumber(redis.call('HGET', KEYS[2], 'since'))
  if now - since >= tonumber(ARGV[10]) then
    local step = tonumber(redis.call('HGET', KEYS[2], 'step')) + 1
    if step > #steps then
      redis.call('DEL', KEYS[2])
      state = 'closed'
    else
      redis.call('HSET', KEYS[2], 'step', step, 'since', now)
    end
  end
end
local factor = 1
if state == 'ramp' then
  factor = steps[tonumber(redis.call('HGET', KEYS[2], 'step'))] or 1
elseif state == 'open' then
  factor = 0
end
-- Trouble: the breaker open, this worker's window abnormal, or the site throttling. It lasts
-- until the site answers normally again while its breaker is not open.
local raw = redis.call('GET', KEYS[4])
if raw and not tonumber(raw) then redis.call('DEL', KEYS[4]) end  -- corrupt: start afresh
if tonumber(ARGV[11]) > 0 and state ~= 'open' then
  redis.call('DEL', KEYS[4])
elseif state == 'open' or ARGV[8] == '1' or ARGV[12] == '1' then
  redis.call('SET', KEYS[4], now, 'NX')
  redis.call('PEXPIRE', KEYS[4], ARGV[13])
end
local began = tonumber(redis.call('GET', KEYS[4]) or '')  -- anything else reads as no trouble
local trouble = -1
if began then trouble = math.max(0, now - began) end
return {state, tostring(factor), n, e, math.floor(mean), trouble}
