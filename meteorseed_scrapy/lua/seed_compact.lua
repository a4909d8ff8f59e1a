-- Let a one-shot seed's URL list go once its run is recorded: the definition keeps a count and
-- a digest of the list instead (seeding/registry.py, compact_definition), so the registry holds
-- a few hundred bytes per seed, not its whole payload. Only when the seed is still at the
-- revision that ran and is not scheduled again (a seed changed or rescheduled meanwhile keeps
-- its definition).
-- KEYS[1]  the seed's hash    KEYS[2]  due set
-- ARGV[1]  seed_id   ARGV[2]  the revision that ran   ARGV[3]  compact definition JSON
-- ARGV[4]  digest of the full definition (seed_put.lua compares a new put with it)
-- Returns 1 when compacted, 0 otherwise.
if redis.call('HGET', KEYS[1], 'rev') ~= ARGV[2] then return 0 end
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'def', ARGV[3], 'full', ARGV[4])
return 1
