-- Realignment, incremental part: drop journal entries whose order has a row in the caller's
-- MySQL snapshot, a bounded batch per call (the caller sends at most a few hundred).
-- KEYS[1] journal   KEYS[2] journal units   KEYS[3] quota   KEYS[4] versions   KEYS[5] re-publish times
-- ARGV[1] inventory version of the snapshot; then triples: request id, order number, '1' when
-- the order was rejected (its units go back to the buyer's quota) else '0'.
-- An entry is dropped only while it still names that order number. versions.dropped keeps the
-- newest snapshot that dropped entries: a pass with an older snapshot (which may not count those
-- orders in its MySQL stock) then writes nothing (realign.lua, stale).
-- Returns {entries dropped, units dropped}.
local dropped, units = 0, 0
for i = 2, #ARGV, 3 do
  local entry = redis.call('HGET', KEYS[1], ARGV[i])
  if entry then
    -- user|quantity|order_no|reserved_at_ms|unit_price|claimed, or the older
    -- user|quantity|order_no|reserved_at_ms|claimed.
    local user, quantity, order_no = string.match(entry, '^(.*)|(%d+)|([^|]*)|%d+|%d+|%d$')
    if not user then user, quantity, order_no = string.match(entry, '^(.*)|(%d+)|([^|]*)|%d+|%d$') end
    if order_no == ARGV[i + 1] then
      quantity = tonumber(quantity)
      redis.call('HDEL', KEYS[1], ARGV[i])
      redis.call('HDEL', KEYS[5], ARGV[i])
      redis.call('DECRBY', KEYS[2], quantity)
      if ARGV[i + 2] == '1' and redis.call('HINCRBY', KEYS[3], user, -quantity) <= 0 then
        redis.call('HDEL', KEYS[3], user)
      end
      dropped = dropped + 1
      units = units + quantity
    end
  end
end
if dropped > 0 and tonumber(redis.call('HGET', KEYS[4], 'dropped') or '0') < tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[4], 'dropped', ARGV[1])
end
return {dropped, units}
