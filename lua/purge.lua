-- Forget a reservation whose order message was purged from the dead-letter queue, so that the
-- realignment pass that follows gives its units and quota back (stock = MySQL stock - units of
-- the journal entries still there). Only for an order MySQL has no row of (the caller checks).
-- KEYS[1] journal   KEYS[2] replay record
-- ARGV[1] request id   ARGV[2] replay record ttl (seconds)
-- The replay record becomes a 'released' tombstone, as after release.lua: a late copy of the
-- message is dropped by the consumer's claim, and a retry with the same key buys anew.
-- Returns 1 when a journal entry was removed, 0 when there was none.
local removed = redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], 'state', 'released')
if redis.call('TTL', KEYS[2]) < tonumber(ARGV[2]) then redis.call('EXPIRE', KEYS[2], tonumber(ARGV[2])) end
return removed
