-- Remove a seed from the registry: its hash, both indexes, its schedule and its yield count.
-- KEYS[1]  the seed's hash    KEYS[2]  index    KEYS[3]  by-site index    KEYS[4]  due set
-- KEYS[5]  worker yield counts
-- ARGV[1]  seed_id
-- Returns 1 when the seed existed, 0 otherwise.
local id = ARGV[1]
local site = redis.call('HGET', KEYS[1], 'site')
redis.call('ZREM', KEYS[2], id)
redis.call('ZREM', KEYS[4], id)
redis.call('HDEL', KEYS[5], id)
if not site then
  return 0
end
redis.call('ZREM', KEYS[3], site .. '\t' .. id)
redis.call('DEL', KEYS[1])
return 1
