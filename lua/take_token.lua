-- Consume an order token for a purchase in stock mode 'database' (the
-- anti-duplicate token, taken atomically on submit), just before the MySQL
-- transaction. The token is marked used (value 'used:<user>', its expiry kept) rather than
-- deleted, so that a concurrent second submission is told the first is in progress instead of
-- being refused; give_token puts it back if the transaction does not take the order.
-- KEYS[1] the token   ARGV[1] user id
-- Returns the token's remaining ms (>= 1) when it was the user's and is now used, -2 when this
-- user already used it, -1 otherwise (unknown, expired or another user's; nothing written).
local value = redis.call('GET', KEYS[1])
if value == 'used:' .. ARGV[1] then return -2 end
if value ~= ARGV[1] then return -1 end
local left = redis.call('PTTL', KEYS[1])
redis.call('SET', KEYS[1], 'used:' .. ARGV[1], 'KEEPTTL')
if left < 1 then return 1 end
return left
