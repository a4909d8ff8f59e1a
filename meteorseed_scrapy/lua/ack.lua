-- Acknowledge and delete this worker's finished entries of one task stream, but only those
-- still pending on this consumer: an entry another worker reclaimed meanwhile (this one was cut
-- off from Redis for longer than CLAIM_IDLE) is that worker's to ack, defer or dead-letter;
-- acking it here would pull it from under its owner. Each entry acked here counts as done for
-- its seed and site (progress_lib.lua), with the items, anomalies and bytes its task left.
--
-- The items feed's entries of these tasks are appended first, then their completion records
-- written, then the entries acked: one script, so a task is never acked (nor its record written,
-- which would let a redelivery ack it without a refetch) unless its feed entries are in. The
-- XADDs are the script's first writes: a refused one (OOM under maxmemory noeviction, the feed
-- key not a stream) aborts the script before it acks anything; the caller sends it all again.
-- KEYS[1]    the task stream
-- KEYS[2]    the items feed (absent when no feed entries come with this call)
-- ARGV[1]    consumer group
-- ARGV[2]    this consumer
-- ARGV[3]    the crawl events stream ('' = none: a sharded layout, the caller judges the end)
-- ARGV[4]    now, epoch seconds (text, as events carry it)
-- ARGV[5]    seconds a finished seed's counters are kept (0 = for ever)
-- ARGV[6]    seconds a completion record is kept
-- ARGV[7]    the feed's MAXLEN (approximate)
-- ARGV[8]    the feed's max age, ms: older entries are trimmed (MINID ~, by Redis's clock, which
--            made the entry ids; 0 = by length only)
-- ARGV[9]    R, then R pairs: completion record key, record (keys in KEYS[1]'s slot)
-- then       F, then F feed entries, each: n, then n field/value pairs
-- then       per entry to ack, 6 values: message id, seed_id, site_id, items, anomalies, bytes
--            (numbers as decimal text; anything else counts as 0)
-- Returns {acked, seeds}: how many entries were acked (pending on this consumer), and the
-- seeds whose outstanding count reached zero here.

--#include progress_lib

local i = 9
local records = tonumber(ARGV[i])
local first_record = i + 1
i = i + 1 + 2 * records
local feed = tonumber(ARGV[i])
i = i + 1
for _ = 1, feed do
  local n = tonumber(ARGV[i])
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[7], '*', unpack(ARGV, i + 1, i + 2 * n))
  i = i + 1 + 2 * n
end
local max_age = tonumber(ARGV[8]) or 0
if feed > 0 and max_age > 0 then
  local now = redis.call('TIME')
  local oldest = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - max_age
  redis.call('XTRIM', KEYS[2], 'MINID', '~', string.format('%d-0', math.max(0, oldest)))
end

local prefix = pg_prefix_of_stream(KEYS[1])
local acked = 0
for j = i, #ARGV - 5, 6 do
  local id = ARGV[j]
  if redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1, ARGV[2])[1] then
    redis.call('XACK', KEYS[1], ARGV[1], id)
    redis.call('XDEL', KEYS[1], id)
    acked = acked + 1
    local seed, site = ARGV[j + 1], ARGV[j + 2]
    pg_add(prefix, seed, site, 'done', 1)
    pg_add(prefix, seed, site, 'outstanding', -1)
    pg_add(prefix, seed, site, 'items', pg_count(ARGV[j + 3]))
    pg_add(prefix, seed, site, 'anomalies', pg_count(ARGV[j + 4]))
    pg_add(prefix, seed, site, 'bytes', pg_count(ARGV[j + 5]))
  end
end
-- After the acks: under maxmemory a SET as the script's first write is refused, and with no
-- feed entries the acks (which free memory) must not wait for memory.
for r = first_record, first_record + 2 * records - 1, 2 do
  redis.call('SET', ARGV[r], ARGV[r + 1], 'EX', ARGV[6])
end
local zeroed = pg_flush(ARGV[3], ARGV[4], tonumber(ARGV[5]) or 0, false)
return {acked, zeroed}
