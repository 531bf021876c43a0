-- Release a shard lease if this process still holds it.
-- KEYS[1] lease key   ARGV[1] holder token
-- Returns 1 when released, 0 otherwise.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
