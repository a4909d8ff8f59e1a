-- Tell a seed's 'started' or 'finished' on a layout whose shard scripts cannot (a tagged one:
-- a script touches one slot, and one shard's end is not the seed's): once per run each. A
-- marker per seed, in the events stream's slot, says what was told last: 'started' (no
-- expiry while the seed runs) or 'finished' (expires with the counters).
-- KEYS[1]      the crawl events stream
-- KEYS[2..n]   each seed's marker ('{<events>}:told:<seed_id>', string)
-- ARGV[1]      'started' or 'finished'
-- ARGV[2]      now, epoch seconds (text)
-- ARGV[3]      seconds a finished seed's marker is kept
-- ARGV[4..]    per marker, in order: the seed id, then (finished only) its counters (JSON)
-- 'started' is told unless the marker says started; 'finished' only when it says started (a
-- seed's end seen before its start was told is told by the teller of the start, which looks
-- again: crawl_progress.tell_started). Returns the ids of the seeds told.
local event, now, keep = ARGV[1], ARGV[2], tonumber(ARGV[3]) or 0
local told = {}
local step = (event == 'finished') and 2 or 1
for i = 2, #KEYS do
  local at = 4 + (i - 2) * step
  local seed = ARGV[at]
  local was = redis.call('GET', KEYS[i])
  if event == 'started' and was ~= 'started' then
    redis.call('SET', KEYS[i], 'started')
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', 10000, '*', 'event', 'started', 'seed', seed,
               'at', now)
    told[#told + 1] = seed
  elseif event == 'finished' and was == 'started' then
    if keep > 0 then
      redis.call('SET', KEYS[i], 'finished', 'EX', keep)
    else
      redis.call('SET', KEYS[i], 'finished')
    end
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', 10000, '*', 'event', 'finished', 'seed', seed,
               'at', now, 'counters', ARGV[at + 1])
    told[#told + 1] = seed
  end
end
return told
