-- Make Redis stock = MySQL stock - units of reservations MySQL has not resolved, atomically
-- against the journal as it is now (entries added since the caller's read count as unresolved).
-- KEYS[1] stock   KEYS[2] journal   KEYS[3] quota
-- ARGV[1] MySQL stock in the caller's snapshot   ARGV[2] '1' write, '0' dry run
-- ARGV[3..] pairs: request id, outcome ('applied' or 'rejected') resolved in that snapshot
-- Returns {stock_before or '', stock_after, in_flight_count, in_flight_units, resolved_dropped}.
local resolved = {}
for i = 3, #ARGV, 2 do resolved[ARGV[i]] = ARGV[i + 1] end
local write = ARGV[2] == '1'

local before = redis.call('GET', KEYS[1]) or ''
local entries = redis.call('HGETALL', KEYS[2])
local in_flight, units, dropped = 0, 0, 0
for i = 1, #entries, 2 do
  local request_id = entries[i]
  local user, quantity = string.match(entries[i + 1], '^(.*)|(%d+)|[^|]*|%d+|%d$')
  quantity = tonumber(quantity)
  local outcome = resolved[request_id]
  if outcome then
    dropped = dropped + 1
    if write then
      redis.call('HDEL', KEYS[2], request_id)
      -- MySQL rejected it: the buyer holds nothing, so the per-user quota goes back.
      if outcome == 'rejected' and redis.call('HINCRBY', KEYS[3], user, -quantity) <= 0 then
        redis.call('HDEL', KEYS[3], user)
      end
    end
  else
    in_flight = in_flight + 1
    units = units + quantity
  end
end

-- More units in flight than MySQL holds: some will be rejected by the consumer; sell nothing more.
local after = math.max(tonumber(ARGV[1]) - units, 0)
if write then redis.call('SET', KEYS[1], after) end
return {before, after, in_flight, units, dropped}
