-- Take a block of order-number sequence numbers, only while the shard's epoch is the one the
-- minter holds and was installed on this very Redis server (run id): after FLUSHALL the epoch is
-- gone, after a restart or failover (counters may have rolled back) its run id is another one.
-- KEYS[1] the shard's epoch hash (generation, run_id)   KEYS[2] the shard's counter for one second
-- ARGV[1] generation the minter holds   ARGV[2] block size   ARGV[3] counter ttl (seconds)
-- Returns {'ok', last sequence of the block} or {'reset'}: establish the epoch again.
local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
local epoch = redis.call('HMGET', KEYS[1], 'generation', 'run_id')
if epoch[1] ~= ARGV[1] or epoch[2] ~= run_id then return {'reset'} end
local last = redis.call('INCRBY', KEYS[2], tonumber(ARGV[2]))
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3]))
return {'ok', last}
