-- The fields of entries just delivered to this consumer by a blocking XREADGROUP, exactly as
-- stored: redis-py parses that command's reply into one dict per entry, which keeps one value of
-- a field name given twice, so the consumer reads them again here, as a flat list.
-- KEYS       the task streams of the reply
-- ARGV       per entry: its stream's index in KEYS, its id
-- Returns    {{stream index, id, {field, value, ...}}, ...}; an entry deleted meanwhile is left
--            out (it has nothing left to deliver).
local out = {}
for i = 1, #ARGV, 2 do
  local k = tonumber(ARGV[i])
  local r = redis.call('XRANGE', KEYS[k], ARGV[i + 1], ARGV[i + 1])
  if r[1] then table.insert(out, {k, r[1][1], r[1][2]}) end
end
return out
