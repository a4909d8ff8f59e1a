-- Write the outcome of a seed's run and reschedule it, unless the seed was deleted meanwhile
-- (never resurrect it) or changed meanwhile (its put made it due at once: keep that).
-- KEYS[1]  the seed's hash    KEYS[2]  due set    KEYS[3]  worker yield counts (hash)
-- ARGV[1]  seed_id
-- ARGV[2]  the rev the run expanded ("" = do not check)
-- ARGV[3]  child URLs taken from the yield counts (subtracted: counts added since stay)
-- ARGV[4]  next due time, epoch seconds ("" = not scheduled any more)
-- ARGV[5]  "1" when the run failed (failures + 1), "0" when it succeeded (failures = 0)
-- ARGV[6..] field, value pairs to set on the seed's hash ("" value = delete the field)
-- Returns 1 when written, 0 when the seed is gone.
local id = ARGV[1]
local rev = redis.call('HGET', KEYS[1], 'rev')
if not rev then
  return 0
end
local taken = tonumber(ARGV[3])
if taken > 0 then
  if redis.call('HINCRBY', KEYS[3], id, -taken) <= 0 then
    redis.call('HDEL', KEYS[3], id)
  end
end
for i = 6, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[1], ARGV[i])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
redis.call('HINCRBY', KEYS[1], 'runs', 1)
if ARGV[5] == '1' then
  redis.call('HINCRBY', KEYS[1], 'failures', 1)
else
  redis.call('HSET', KEYS[1], 'failures', 0)
end
if ARGV[2] == '' or ARGV[2] == rev then
  if ARGV[4] == '' then
    redis.call('ZREM', KEYS[2], id)
  else
    redis.call('ZADD', KEYS[2], ARGV[4], id)
  end
end
return 1
