-- Acknowledge and delete this worker's finished entries of one task stream, but only those
-- still pending on this consumer: an entry another worker reclaimed meanwhile (this one was cut
-- off from Redis for longer than CLAIM_IDLE) is that worker's to ack, defer or dead-letter;
-- acking it here would pull it from under its owner. Each entry acked here counts as done for
-- its seed and site (progress_lib.lua), with the items, anomalies and bytes its task left.
-- KEYS[1]    the task stream
-- ARGV[1]    consumer group
-- ARGV[2]    this consumer
-- ARGV[3]    the crawl events stream ('' = none: a sharded layout, the caller judges the end)
-- ARGV[4]    now, epoch seconds (text, as events carry it)
-- ARGV[5]    seconds a finished seed's counters are kept (0 = for ever)
-- ARGV[6..]  per entry, 6 values: message id, seed_id, site_id, items, anomalies, bytes
--            (numbers as decimal text; anything else counts as 0)
-- Returns {acked, seeds}: how many entries were acked (pending on this consumer), and the
-- seeds whose outstanding count reached zero here.

--#include progress_lib

local prefix = pg_prefix_of_stream(KEYS[1])
local acked = 0
for i = 6, #ARGV - 5, 6 do
  local id = ARGV[i]
  if redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1, ARGV[2])[1] then
    redis.call('XACK', KEYS[1], ARGV[1], id)
    redis.call('XDEL', KEYS[1], id)
    acked = acked + 1
    local seed, site = ARGV[i + 1], ARGV[i + 2]
    pg_add(prefix, seed, site, 'done', 1)
    pg_add(prefix, seed, site, 'outstanding', -1)
    pg_add(prefix, seed, site, 'items', pg_count(ARGV[i + 3]))
    pg_add(prefix, seed, site, 'anomalies', pg_count(ARGV[i + 4]))
    pg_add(prefix, seed, site, 'bytes', pg_count(ARGV[i + 5]))
  end
end
local zeroed = pg_flush(ARGV[3], ARGV[4], tonumber(ARGV[5]) or 0, false)
return {acked, zeroed}
