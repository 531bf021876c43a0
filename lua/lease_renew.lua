-- Renew a shard lease held by this process.
-- KEYS[1] lease key   ARGV[1] holder token   ARGV[2] lease length (milliseconds)
-- Returns 1 when renewed, 0 when the lease belongs to someone else or expired.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
