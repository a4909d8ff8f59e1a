-- Counts tasks added to a shard's task streams in '<prefix>:counts' (hash), so that status can
-- tell throughput on Redis 6.2 too (XINFO STREAM's entries-added is 7.0+): field 'added' counts
-- every entry added, 'readded' those of them that came back from a delayed set (promote.lua:
-- a quota re-park, a durable retry), so that new tasks are 'added' - 'readded' and tasks
-- settled for good (acked, dead-lettered) are new tasks minus those in the streams and the
-- delayed sets. The key is derived from the stream's name ('<prefix>:tasks' or
-- '<prefix>:tasks:<lane>:<band>', queue/keys.py), so it is in the stream's Cluster slot and no
-- caller passes it; a stream named otherwise is not counted. A spider's task set
-- ('<prefix>:spider:<name>:tasks...') counts in its shard's '<prefix>:counts'.
local function count_field(stream, field, n)
  local prefix = string.match(stream, '^(.+):tasks$')
    or string.match(stream, '^(.+):tasks:%a+:%a+$')
  if prefix then
    prefix = string.match(prefix, '^(.+):spider:[^:]+$') or prefix
  end
  if prefix and n > 0 then
    -- pcall: a counter that cannot be written (a key of another type) never fails the
    -- script after its XADDs.
    redis.pcall('HINCRBY', prefix .. ':counts', field, n)
  end
end

local function count_added(stream, n)
  count_field(stream, 'added', n)
end
