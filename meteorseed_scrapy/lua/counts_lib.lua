-- Counts tasks added to a shard's task streams in '<prefix>:counts' (hash, field 'added'), so
-- that status can tell throughput on Redis 6.2 too (XINFO STREAM's entries-added is 7.0+):
-- tasks that left the streams are 'added' minus their length. The key is derived from the
-- stream's name ('<prefix>:tasks' or '<prefix>:tasks:<lane>:<band>', queue/keys.py), so it is
-- in the stream's Cluster slot and no caller passes it; a stream named otherwise is not counted.
-- A spider's task set ('<prefix>:spider:<name>:tasks...') counts in its shard's '<prefix>:counts'.
local function count_added(stream, n)
  local prefix = string.match(stream, '^(.+):tasks$')
    or string.match(stream, '^(.+):tasks:%a+:%a+$')
  if prefix then
    prefix = string.match(prefix, '^(.+):spider:[^:]+$') or prefix
  end
  if prefix and n > 0 then
    -- pcall: a counter that cannot be written (a key of another type) never fails the
    -- script after its XADDs.
    redis.pcall('HINCRBY', prefix .. ':counts', 'added', n)
  end
end
