-- Forget a reservation whose order message was purged from the dead-letter queue: its units
-- leave the journal's units counter and the buyer's quota, and the realignment pass that follows
-- gives its stock back (stock = MySQL stock - units of the journal entries still there). Only for
-- an order MySQL has no row of (the caller checks).
-- KEYS[1] journal   KEYS[2] replay record   KEYS[3] journal units   KEYS[4] re-publish times
-- KEYS[5] quota
-- ARGV[1] request id   ARGV[2] replay record ttl (seconds)
-- The replay record becomes a 'released' tombstone, as after release.lua: a late copy of the
-- message is dropped by the consumer's claim, and a retry with the same key buys anew.
-- Returns 1 when a journal entry was removed, 0 when there was none.
local entry = redis.call('HGET', KEYS[1], ARGV[1])
if entry then
  -- user|quantity|order_no|reserved_at_ms|unit_price|claimed, or the older
  -- user|quantity|order_no|reserved_at_ms|claimed.
  local user, quantity = string.match(entry, '^(.*)|(%d+)|[^|]*|%d+|%d+|%d$')
  if not user then user, quantity = string.match(entry, '^(.*)|(%d+)|[^|]*|%d+|%d$') end
  quantity = tonumber(quantity)
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('DECRBY', KEYS[3], quantity)
  redis.call('HDEL', KEYS[4], ARGV[1])
  if redis.call('HINCRBY', KEYS[5], user, -quantity) <= 0 then redis.call('HDEL', KEYS[5], user) end
end
redis.call('HSET', KEYS[2], 'state', 'released')
if redis.call('TTL', KEYS[2]) < tonumber(ARGV[2]) then redis.call('EXPIRE', KEYS[2], tonumber(ARGV[2])) end
return entry and 1 or 0
