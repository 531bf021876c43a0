-- Give back the replay records Redis lost (FLUSHALL, a failover to an empty replica), from the
-- order rows MySQL holds: a client that retries a purchase with its Idempotency-Key after the
-- loss is answered its order again, never a second one. Run by realignment before it loads the
-- product's stock (until then every reserve answers 'not loaded', so none slips in between).
-- KEYS[i] the replay record of the i-th order (all in the product's slot)
-- ARGV[3i-2] quantity   ARGV[3i-1] order number   ARGV[3i] seconds the record has left to live
-- A record that exists is left alone (it is newer than the row, or the same). Returns how many
-- records were written.
local written = 0
for i, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 0 then
    redis.call('HSET', key, 'quantity', ARGV[3 * i - 2], 'order_no', ARGV[3 * i - 1], 'state', 'queued')
    redis.call('EXPIRE', key, ARGV[3 * i])
    written = written + 1
  end
end
return written
