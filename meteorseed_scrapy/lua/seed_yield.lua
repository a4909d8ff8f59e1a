-- Add new child URLs counted by workers to the yield of registered seeds only: children of a
-- seed that was never registered (a one-shot seed-expand) or was deleted leave no trace.
-- KEYS[1]  the registry's index (zset of seed_ids)    KEYS[2]  worker yield counts (hash)
-- ARGV     seed_id, count pairs
-- Returns  how many of the seeds were registered (and counted)
local counted = 0
for i = 1, #ARGV, 2 do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('HINCRBY', KEYS[2], ARGV[i], ARGV[i + 1])
    counted = counted + 1
  end
end
return counted
