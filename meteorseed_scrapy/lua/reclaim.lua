-- Take over tasks of dead workers (idle longer than the claim time) with XAUTOCLAIM and report
-- how often each was delivered, so the caller can dead-letter tasks over the delivery limit.
-- KEYS[1]  the task stream
-- ARGV[1]  consumer group
-- ARGV[2]  this consumer
-- ARGV[3]  minimum idle time in milliseconds
-- ARGV[4]  start id of the scan ('0-0' to begin)
-- ARGV[5]  maximum number of entries
-- Returns {next start id, {{id, {field, value, ...}, deliveries}, ...}}.
-- Redis 6.2 returns a nil entry for a pending message that was deleted; this project never
-- deletes a pending entry, so such entries are skipped.
local r = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], 'COUNT', ARGV[5])
local out = {}
for _, e in ipairs(r[2]) do
  if e and e[2] then
    local p = redis.call('XPENDING', KEYS[1], ARGV[1], e[1], e[1], 1)
    local deliveries = 1
    if p[1] then deliveries = p[1][4] end
    table.insert(out, {e[1], e[2], deliveries})
  end
end
return {r[1], out}
