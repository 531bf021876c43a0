-- Fill one drained stock bucket with its share of a rebalancing pass (service/domain/stock/realign.py):
-- the pass drained every bucket of the product (realign.lua with a pass number), summed the units
-- in flight, and hands each bucket its share of MySQL stock - those units.
-- KEYS[1] stock   KEYS[2] versions
-- ARGV[1] pass number   ARGV[2] units (the bucket's share, >= 0)
-- ARGV[3] restock channel   ARGV[4] product id: announced when units were added
-- Returns 1 when the share was added; 0 when a newer pass drained the bucket since, or the
-- bucket's stock is gone (Redis lost data): nothing written, the caller runs a new pass.
local versions = redis.call('HMGET', KEYS[2], 'pass')
if tonumber(versions[1] or '0') ~= tonumber(ARGV[1]) or redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
-- INCRBY, not SET: units a release or a restock gave back since the drain are the bucket's too.
local units = tonumber(ARGV[2])
if units > 0 then
  redis.call('INCRBY', KEYS[1], units)
  redis.call('PUBLISH', ARGV[3], ARGV[4])
end
redis.call('HDEL', KEYS[2], 'filling')
return 1
