-- Give a reservation back after its publish failed. Idempotent.
-- KEYS[1] stock   KEYS[2] journal   KEYS[3] quota   KEYS[4] replay record
-- ARGV[1] request id   ARGV[2] restock channel   ARGV[3] product id: announced there when the
-- stock went up, so every API process drops its sold-out flag for the product
-- Returns 'released'; 'claimed' when a consumer already holds the message (the order went
-- through after all: nothing is given back); 'absent' when there is nothing to release.
local entry = redis.call('HGET', KEYS[2], ARGV[1])
if not entry then return 'absent' end
local user, quantity, claimed = string.match(entry, '^(.*)|(%d+)|[^|]*|%d+|(%d)$')
if claimed == '1' then return 'claimed' end
quantity = tonumber(quantity)
-- A missing stock key stays missing (never a write of a made-up value); realignment reloads it.
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('INCRBY', KEYS[1], quantity)
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end
if redis.call('HINCRBY', KEYS[3], user, -quantity) <= 0 then redis.call('HDEL', KEYS[3], user) end
redis.call('HDEL', KEYS[2], ARGV[1])
-- Tombstone, kept for the record's ttl: a late copy of the message is dropped by the consumer.
redis.call('HSET', KEYS[4], 'state', 'released')
return 'released'
