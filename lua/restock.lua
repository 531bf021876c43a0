-- Give a cancelled (or restocked refunded) order's units back to Redis, exactly once.
-- KEYS[1] stock   KEYS[2] quota   KEYS[3] versions   KEYS[4] returned marker of the order
-- ARGV[1] user id   ARGV[2] quantity   ARGV[3] inventory version of the MySQL commit that
-- returned the units   ARGV[4] marker ttl (seconds)   ARGV[5] '1' the buyer's quota goes back too
-- (a cancel), '0' it stays held (a refund: the buyer did buy)
-- ARGV[6] restock channel   ARGV[7] product id: announced there when the stock went up, so every
-- API process drops its sold-out flag for the product
-- Returns 'returned'; 'done' when this order's units were already given back; 'realigned'
-- when a realignment whose MySQL snapshot already held the return has run (it counted them).
if redis.call('SET', KEYS[4], ARGV[3], 'NX', 'EX', tonumber(ARGV[4])) == false then return 'done' end
local version = tonumber(ARGV[3])
local synced = tonumber(redis.call('HGET', KEYS[3], 'synced') or '0')
if synced >= version then return 'realigned' end
local quantity = tonumber(ARGV[2])
-- A missing stock key stays missing; realignment reloads it from MySQL.
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('INCRBY', KEYS[1], quantity)
  redis.call('PUBLISH', ARGV[6], ARGV[7])
end
if ARGV[5] == '1' and redis.call('HINCRBY', KEYS[2], ARGV[1], -quantity) <= 0 then
  redis.call('HDEL', KEYS[2], ARGV[1])
end
local restocked = tonumber(redis.call('HGET', KEYS[3], 'restocked') or '0')
if version > restocked then redis.call('HSET', KEYS[3], 'restocked', version) end
return 'returned'
