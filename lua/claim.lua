-- Consumer side: mark reservations of one product as taken before their orders are written to MySQL.
-- KEYS[1] the product's journal   KEYS[1 + i] replay record of request i (all in the product's slot)
-- ARGV[2i-1] request id i   ARGV[2i] the attempt token its message carries ('' when unknown)
-- Returns one status per request id, in order: 'held' (journal entry present, now claimed, so
-- release.lua will not give it back), 'released' (the API gave back the reservation of this very
-- attempt and answered 503: drop the message), or 'unknown' (no trace in Redis, e.g. already
-- resolved, or Redis lost its data or came back from an older snapshot: MySQL's unique request
-- id and its conditional stock UPDATE decide). A 'released' tombstone of another attempt never
-- drops a message: after a rollback it may be the tombstone of the first attempt of a retry
-- that was confirmed.
local statuses = {}
for i = 1, #ARGV / 2 do
  local request_id, attempt = ARGV[2 * i - 1], ARGV[2 * i]
  local entry = redis.call('HGET', KEYS[1], request_id)
  if entry then
    if string.sub(entry, -1) == '0' then
      redis.call('HSET', KEYS[1], request_id, string.sub(entry, 1, -2) .. '1')
    end
    statuses[i] = 'held'
  else
    local record = redis.call('HMGET', KEYS[1 + i], 'state', 'attempt')
    if attempt ~= '' and record[1] == 'released' and record[2] == attempt then
      statuses[i] = 'released'
    else
      statuses[i] = 'unknown'
    end
  end
end
return statuses
