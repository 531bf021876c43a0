-- Give back the reservation one HTTP attempt made (its reserve reply was lost, or its publish
-- failed). Idempotent. Only a reservation made by that very attempt and still 'pending' is given
-- back: never one that is 'queued', never another attempt's (a retry or a concurrent first
-- attempt with the same idempotency key).
-- KEYS[1] stock   KEYS[2] journal   KEYS[3] quota   KEYS[4] replay record   KEYS[5] journal units
-- ARGV[1] request id   ARGV[2] restock channel   ARGV[3] product id: announced there when the
-- stock went up, so every API process drops its sold-out flag for the product
-- ARGV[4] attempt token   ARGV[5] replay record ttl (seconds)
-- Returns 'released'; 'claimed' when the attempt's order goes through after all (a consumer holds
-- its message, realignment found its order row or re-published it): nothing is given back;
-- 'absent' when this attempt holds nothing (already released, or its reserve never took
-- effect: then the attempt is marked abandoned, so its reserve, if still on the wire, writes nothing).
local record = redis.call('HMGET', KEYS[4], 'state', 'attempt')
if record[2] ~= ARGV[4] then
  -- Not this attempt's reservation (none yet, or another attempt's): leave it alone, and refuse
  -- this attempt's reserve should it arrive later. Kept at least as long as a replay record.
  redis.call('HSET', KEYS[4], 'abandoned:' .. ARGV[4], '1')
  if redis.call('TTL', KEYS[4]) < tonumber(ARGV[5]) then redis.call('EXPIRE', KEYS[4], tonumber(ARGV[5])) end
  return 'absent'
end
if record[1] == 'released' then return 'absent' end
-- 'queued': realignment re-published it; the order goes through.
if record[1] ~= 'pending' then return 'claimed' end
local entry = redis.call('HGET', KEYS[2], ARGV[1])
-- Pending but gone from the journal: realignment found its order row.
if not entry then return 'claimed' end
-- user|quantity|order_no|reserved_at_ms|unit_price|claimed, or (written before the unit price
-- was recorded) user|quantity|order_no|reserved_at_ms|claimed.
local user, quantity, claimed = string.match(entry, '^(.*)|(%d+)|[^|]*|%d+|%d+|(%d)$')
if not user then user, quantity, claimed = string.match(entry, '^(.*)|(%d+)|[^|]*|%d+|(%d)$') end
if claimed == '1' then return 'claimed' end
quantity = tonumber(quantity)
-- A missing stock key stays missing (never a write of a made-up value); realignment reloads it.
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('INCRBY', KEYS[1], quantity)
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end
if redis.call('HINCRBY', KEYS[3], user, -quantity) <= 0 then redis.call('HDEL', KEYS[3], user) end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('DECRBY', KEYS[5], quantity)
-- Tombstone, kept for the record's ttl: a late copy of the message is dropped by the consumer.
redis.call('HSET', KEYS[4], 'state', 'released')
return 'released'
