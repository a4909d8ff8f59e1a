-- One window of a scrapy-redis key for the migration, each member larger than the limit
-- replaced by its length: an oversized entry is refused without ever being sent over.
-- KEYS[1]    the scrapy-redis key
-- ARGV[1]    'list' (LRANGE), 'zset' (ZRANGE), 'zrev' (ZREVRANGE) or 'set' (SSCAN)
-- ARGV[2]    start index, or the SSCAN cursor
-- ARGV[3]    stop index, or the SSCAN COUNT
-- ARGV[4]    largest member returned, in bytes
-- Returns list: {member...}; zset/zrev: {member, score, ...}; set: {cursor, {member...}};
-- an oversized member comes back as {its length in bytes}.
local mode, limit = ARGV[1], tonumber(ARGV[4])
local function shrink(items, step)
  for i = 1, #items, step do
    if #items[i] > limit then
      items[i] = {#items[i]}
    end
  end
  return items
end
if mode == 'list' then
  return shrink(redis.call('LRANGE', KEYS[1], ARGV[2], ARGV[3]), 1)
elseif mode == 'zset' then
  return shrink(redis.call('ZRANGE', KEYS[1], ARGV[2], ARGV[3], 'WITHSCORES'), 2)
elseif mode == 'zrev' then
  return shrink(redis.call('ZREVRANGE', KEYS[1], ARGV[2], ARGV[3], 'WITHSCORES'), 2)
end
local reply = redis.call('SSCAN', KEYS[1], ARGV[2], 'COUNT', ARGV[3])
shrink(reply[2], 1)
return reply
