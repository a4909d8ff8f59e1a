-- Weighted read over the task streams: fill a read of N tasks from the lanes in the shares the
-- caller computed (its smooth weighted round robin), bands strictly in order within a lane,
-- and give what an empty lane leaves unused to the others in weight proportion. One round
-- trip, and never more entries than asked: nothing is delivered that the worker cannot start.
-- KEYS       the task streams, lane by lane, each lane's bands in priority order (a worker of a
--            named spider reads two task sets: within a band, the default set's stream, then
--            its spider's; "bands" below are these streams of a lane, in that order)
-- ARGV[1]    consumer group
-- ARGV[2]    this consumer
-- ARGV[3]    streams per lane (so #KEYS / ARGV[3] lanes)
-- ARGV[4..]  the lanes' weights, then the lanes' shares of this read (same lane order)
-- Returns    {entries, last}: entries in XREADGROUP's reply shape,
--            {{stream, {{id, {field, value, ...}}, ...}}, ...}; when there are none, last holds
--            each stream's last entry id ("0-0" when empty), in KEYS order, so that the caller
--            can wait for a new entry (XREAD BLOCK from those ids) without taking it: the next
--            read then takes the highest band of what came, not the first stream written.
local group, consumer = ARGV[1], ARGV[2]
local nb = tonumber(ARGV[3])
local nl = #KEYS / nb
local weight, band, out = {}, {}, {}
local left = 0

-- Read up to n from lane l, its bands in order; a band that gives less than asked is empty.
local function take(l, n)
  local got = 0
  while got < n and band[l] <= nb do
    local key = KEYS[(l - 1) * nb + band[l]]
    local want = n - got
    local r = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', want,
      'STREAMS', key, '>')
    local entries = (r and r[1] and r[1][2]) or {}
    if #entries > 0 then
      table.insert(out, {key, entries})
      got = got + #entries
    end
    if #entries < want then band[l] = band[l] + 1 end
  end
  return got
end

for l = 1, nl do
  weight[l] = tonumber(ARGV[3 + l])
  band[l] = 1
  local share = tonumber(ARGV[3 + nl + l])
  if share > 0 then left = left + share - take(l, share) end
end

-- Unused share goes to the lanes not yet found empty, by weight (realtime first on ties;
-- lanes of weight 0 only when every lane left has weight 0). Each round either fills every
-- share or finds at least one more lane empty, so this ends.
while left > 0 do
  local open, total = {}, 0
  for l = 1, nl do
    if band[l] <= nb then table.insert(open, l); total = total + weight[l] end
  end
  if #open == 0 then break end
  -- Weight 0 counts as 1 when only weight-0 lanes are left.
  local takers = {}
  for _, l in ipairs(open) do
    if total == 0 or weight[l] > 0 then table.insert(takers, l) end
  end
  local shares, given = {}, 0
  for _, l in ipairs(takers) do
    local w, sum = weight[l], total
    if total == 0 then w, sum = 1, #takers end
    shares[l] = math.floor(left * w / sum)
    given = given + shares[l]
  end
  local i = 1
  while given < left do
    shares[takers[i]] = shares[takers[i]] + 1
    given = given + 1
    i = i % #takers + 1
  end
  local short = 0
  for _, l in ipairs(takers) do
    if shares[l] > 0 then short = short + shares[l] - take(l, shares[l]) end
  end
  left = short
end
local last = {}
if #out == 0 then
  for i, key in ipairs(KEYS) do
    local r = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
    last[i] = (r[1] and r[1][1]) or '0-0'
  end
end
return {out, last}
