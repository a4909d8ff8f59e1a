-- Acknowledge and delete this worker's finished entries of one task stream, but only those
-- still pending on this consumer: an entry another worker reclaimed meanwhile (this one was cut
-- off from Redis for longer than CLAIM_IDLE) is that worker's to ack, defer or dead-letter;
-- acking it here would pull it from under its owner.
-- KEYS[1]    the task stream
-- ARGV[1]    consumer group
-- ARGV[2]    this consumer
-- ARGV[3..]  message ids
-- Returns how many entries were acked (pending on this consumer).
local acked = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  if redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1, ARGV[2])[1] then
    redis.call('XACK', KEYS[1], ARGV[1], id)
    redis.call('XDEL', KEYS[1], id)
    acked = acked + 1
  end
end
return acked
