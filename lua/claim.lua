-- Consumer side: mark reservations of one product as taken before their orders are written to MySQL.
-- KEYS[1] the product's journal   KEYS[1 + i] replay record of request i (all in the product's slot)
-- ARGV[i] request id i (one per replay record, same order)
-- Returns one status per request id, in order: 'held' (journal entry present, now claimed, so
-- release.lua will not give it back), 'released' (the API gave the reservation back: drop the
-- message), or 'unknown' (no trace in Redis, e.g. already resolved or Redis lost its data:
-- MySQL's unique request id decides).
local statuses = {}
for i, request_id in ipairs(ARGV) do
  local entry = redis.call('HGET', KEYS[1], request_id)
  if entry then
    if string.sub(entry, -1) == '0' then
      redis.call('HSET', KEYS[1], request_id, string.sub(entry, 1, -2) .. '1')
    end
    statuses[i] = 'held'
  elseif redis.call('HGET', KEYS[1 + i], 'state') == 'released' then
    statuses[i] = 'released'
  else
    statuses[i] = 'unknown'
  end
end
return statuses
