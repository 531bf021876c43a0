-- Consume an order token for a purchase in stock mode 'database' (seed "order system database
-- design": the anti-duplicate token, deleted atomically on submit), just before the MySQL
-- transaction; give_token puts it back if that transaction does not take the order.
-- KEYS[1] the token   ARGV[1] user id
-- Returns the token's remaining ms (> 0) when it was the user's and is now deleted, else -1
-- (unknown, expired or another user's; nothing written).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local left = redis.call('PTTL', KEYS[1])
redis.call('DEL', KEYS[1])
if left < 1 then return 1 end
return left
