-- Take over tasks of dead workers (idle longer than the claim time) with XAUTOCLAIM, from every
-- task stream in order (realtime lane first), and report how often each was delivered, so the
-- caller can dead-letter tasks over the delivery limit.
-- KEYS       the task streams
-- ARGV[1]    consumer group
-- ARGV[2]    this consumer
-- ARGV[3]    minimum idle time in milliseconds
-- ARGV[4]    maximum number of entries, over all streams
-- ARGV[5..]  per stream, the start id of its scan ('0-0' to begin)
-- Returns {{next start id per stream}, {{stream index, id, {field, value, ...}, deliveries}, ...}}.
-- Redis 6.2 returns a nil entry for a pending message that was deleted; this project never
-- deletes a pending entry, so such entries are skipped.
local left = tonumber(ARGV[4])
local cursors, out = {}, {}
for k = 1, #KEYS do
  cursors[k] = ARGV[4 + k]
  if left > 0 then
    local r = redis.call('XAUTOCLAIM', KEYS[k], ARGV[1], ARGV[2], ARGV[3], cursors[k],
      'COUNT', left)
    cursors[k] = r[1]
    for _, e in ipairs(r[2]) do
      if e and e[2] then
        local p = redis.call('XPENDING', KEYS[k], ARGV[1], e[1], e[1], 1)
        local deliveries = 1
        if p[1] then deliveries = p[1][4] end
        table.insert(out, {k, e[1], e[2], deliveries})
        left = left - 1
      end
    end
  end
end
return {cursors, out}
