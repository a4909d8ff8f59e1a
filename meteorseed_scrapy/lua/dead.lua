-- Move one task to the dead-letter stream, acknowledge it, and release its URL from dedup
-- so that a later seed or a requeue can try it again (never "blocked forever").
-- Only while the entry is still pending for this consumer: one that another worker reclaimed
-- meanwhile is that worker's to complete or dead-letter, never both.
-- KEYS[1]  the task stream the entry was delivered from
-- KEYS[2]  the dead-letter stream
-- KEYS[3]  the site's dedup root <ns>:seen:{site} (absent when the message could not be
--          decoded); its generations are derived from it (dedup_lib.lua)
-- ARGV[1]  consumer group
-- ARGV[2]  message id
-- ARGV[3]  payload: the original task JSON, or the raw message fields as JSON
-- ARGV[4]  reason
-- ARGV[5]  consumer that gave up on it (the caller: the entry must be pending on it)
-- ARGV[6]  deliveries so far
-- ARGV[7]  time (epoch seconds, informational)
-- ARGV[8]  dedup fingerprint to release, 32 hex digits ('' = none)
-- ARGV[9]  the task's seed_id, ARGV[10] its site_id ('' = not known: counted under no seed);
--          counted as dead (progress_lib.lua)
-- ARGV[11] the crawl events stream ('' = none), ARGV[12] seconds a finished seed's counters
--          are kept (see ack.lua)
-- Returns the id of the new dead-letter entry, or false (nothing written) when the entry is not
-- pending on ARGV[5] (acked, or reclaimed by another consumer).

--#include dedup_lib
--#include progress_lib

if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1, ARGV[5]) == 0 then
  return false
end
local dead_id = redis.call('XADD', KEYS[2], '*', 't', ARGV[3], 'reason', ARGV[4],
  'source_id', ARGV[2], 'consumer', ARGV[5], 'deliveries', ARGV[6], 'at', ARGV[7])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
if KEYS[3] and #ARGV[8] == 32 and redis.call('TYPE', KEYS[3])['ok'] == 'hash' then
  -- The exact layer is authoritative: removing the entry there is the whole release.
  dd_release(KEYS[3], dd_from_hex(ARGV[8]), dd_now(''))
  dd_flush()
end
local prefix = pg_prefix_of_stream(KEYS[1])
pg_add(prefix, ARGV[9], ARGV[10], 'dead', 1)
pg_add(prefix, ARGV[9], ARGV[10], 'outstanding', -1)
pg_flush(ARGV[11], ARGV[7], tonumber(ARGV[12]) or 0, false)
return dead_id
