-- Read, or install, a shard's order-number epoch (see mint.lua).
-- KEYS[1] the shard's epoch hash (generation, run_id)
-- ARGV[1] '' to read; else a generation just taken in MySQL, installed only when the hash is
-- missing or was written on another server (run id): never over an epoch of this server's life.
-- Returns {generation or '', 1 when the hash belongs to this server else 0}.
local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
local epoch = redis.call('HMGET', KEYS[1], 'generation', 'run_id')
local current = epoch[1] ~= false and epoch[2] == run_id
if ARGV[1] ~= '' and not current then
  redis.call('HSET', KEYS[1], 'generation', ARGV[1], 'run_id', run_id)
  return {ARGV[1], 1}
end
return {epoch[1] or '', current and 1 or 0}
