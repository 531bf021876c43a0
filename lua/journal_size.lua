-- How big a product bucket's journal is, for realignment to choose its pass, and whether Redis
-- still holds the bucket as it was loaded.
-- KEYS[1] stock   KEYS[2] journal units   KEYS[3] journal   KEYS[4] sale
-- Returns {entries or -1, run id of this server}. -1: Redis lost the bucket (no stock or no units
-- counter), or holds it from another life of the server (the sale's 'server' is not this run id:
-- a restart from an older snapshot, a promoted replica), so the journal, quotas and replay
-- records may be rolled back: only a full pass after the replay records are given back heals it.
local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
if redis.call('EXISTS', KEYS[1], KEYS[2]) ~= 2 or redis.call('HGET', KEYS[4], 'server') ~= run_id then
  return {-1, run_id}
end
return {redis.call('HLEN', KEYS[3]), run_id}
