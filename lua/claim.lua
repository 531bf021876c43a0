-- Consumer side: mark a reservation as taken before its order is written to MySQL.
-- KEYS[1] journal   KEYS[2] replay record
-- ARGV[1] request id
-- Returns 'held' (journal entry present, now claimed, so release.lua will not give it back),
-- 'released' (the API gave the reservation back: drop the message), or 'unknown' (no trace in
-- Redis, e.g. already resolved or Redis lost its data: MySQL's unique request id decides).
local entry = redis.call('HGET', KEYS[1], ARGV[1])
if entry then
  if string.sub(entry, -1) == '0' then
    redis.call('HSET', KEYS[1], ARGV[1], string.sub(entry, 1, -2) .. '1')
  end
  return 'held'
end
if redis.call('HGET', KEYS[2], 'state') == 'released' then return 'released' end
return 'unknown'
