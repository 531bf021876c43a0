-- Make Redis = MySQL for one product, atomically against the journal as it is now (entries added
-- since the caller's read count as unresolved):
--   stock = MySQL stock - units of journal entries not resolved in the caller's snapshot
--           - units the waiting room holds for admitted buyers (not sold: lua/queue.lua; below
--           0 when MySQL no longer covers them, and queue.lua then withdraws admissions)
--   sale  = the sale terms in the snapshot (window, per-user limit, price)
-- Two forms:
-- * incremental (ARGV[15] = -1; the caller already dropped the resolved entries with
--   realign_drop.lua): O(1), the journal's units come from the running counter KEYS[6] that
--   reserve, release, purge and realign_drop keep. Quotas are left as those scripts keep them.
--   Answers {'full'} when the stock or the counter is missing (Redis lost data): the caller
--   runs the full form.
-- * full (ARGV[15] = n >= 0): walks the whole journal once, drops resolved entries, rebuilds the
--   per-user quota (units held in MySQL + units still in the journal) and sets the counter.
--   For a product whose Redis state is missing or predates the counter.
-- KEYS[1] stock   KEYS[2] journal   KEYS[3] quota   KEYS[4] versions   KEYS[5] sale
-- KEYS[6] journal units   KEYS[7] re-publish times   KEYS[8] the waiting room's counters ('held')
-- ARGV[1] MySQL stock in the snapshot   ARGV[2] '0' dry run, else write: the run id of the
-- server the caller read the journal on (journal_size.lua); a server restarted since answers {'full'}
-- ARGV[3] inventory version of the snapshot
-- ARGV[4..10] sale terms in the snapshot: starts_ms, ends_ms (0 = no end), per-user limit, price,
-- token ('1': a purchase needs an order token), buckets (the product's K), room ('1': a purchase
-- needs an admission from the product's waiting room)
-- ARGV[11] stock-mode marker: 'database' writes the sale's mode = database (reserve.lua answers
-- 'moved'), 'open' removes it (the switch to redis mode), 'keep' leaves it as it is (a pass
-- whose snapshot says redis must not undo a switch to database that has begun)
-- ARGV[12] restock channel   ARGV[13] product id: announced there when a write leaves stock to sell
-- or changes the sale terms, so every API process drops its sold-out flag for the product
-- ARGV[14] rebalancing pass number: 0 for a product of one bucket (stock is set as above). A pass
-- p > 0 (a bucket of a product of several: service/domain/stock/realign.py) drains the bucket instead:
-- stock 0, versions pass = filling = p, and leaves the computation to its caller (the units in
-- flight it answers, summed over every bucket), whose bucket_fill.lua then adds the bucket's
-- share. Stale too when a newer pass has drained the bucket.
-- incremental: ARGV[15] -1   ARGV[16] units / ARGV[17] entries still in the journal that are
-- resolved in the snapshot (a dry run, which dropped nothing; 0 and 0 otherwise)
-- full: ARGV[15] n = number of resolved request ids   ARGV[16 .. 15+n] request ids whose order
-- has a row in the snapshot   ARGV[16+n] k   ARGV[17+n .. 16+n+k] request ids resolved in the
-- snapshot but kept in the journal (FLASHSALE_REALIGN__KEEP_RESOLVED_SECONDS: not in flight, not
-- dropped, so that an order whose row a database failover loses is in flight again)
-- ARGV[17+n+k ..] pairs: user id, units that user holds in MySQL
-- The sale hash records the run id of the server it was written on ('server'): reserve.lua
-- sells only on that server's life, so a Redis restarted from older data sells nothing until a
-- full pass (after the caller gave the replay records back from MySQL) writes it again.
-- Returns {stock_before or '', stock_after, in_flight_count, in_flight_units, resolved_dropped, stale,
-- units held by the waiting room}.
-- stale = 1: Redis already reflects a newer MySQL state (another pass, or a restock); nothing
-- was written (the next pass, with a newer snapshot, writes).
local n = tonumber(ARGV[15])
local version = tonumber(ARGV[3])
local pass = tonumber(ARGV[14])
local versions = redis.call('HMGET', KEYS[4], 'synced', 'restocked', 'dropped', 'pass')
-- Stale: a pass with a newer snapshot already wrote or dropped entries, or units returned after
-- this snapshot already reached Redis. Writing would turn the clock back.
local stale = tonumber(versions[1] or '0') > version or tonumber(versions[2] or '0') > version
  or tonumber(versions[3] or '0') > version or tonumber(versions[4] or '0') > pass
local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
if ARGV[2] ~= '0' and ARGV[2] ~= run_id then return {'full'} end
local write = ARGV[2] ~= '0' and not stale
local before = redis.call('GET', KEYS[1]) or ''
local in_flight, units, dropped = 0, 0, 0

if n < 0 then
  local counted = redis.call('GET', KEYS[6])
  if before == '' or not counted or redis.call('HGET', KEYS[5], 'server') ~= run_id then return {'full'} end
  in_flight = redis.call('HLEN', KEYS[2]) - tonumber(ARGV[17])
  units = tonumber(counted) - tonumber(ARGV[16])
else
  local resolved = {}
  for i = 16, 15 + n do resolved[ARGV[i]] = 'drop' end
  local k = tonumber(ARGV[16 + n])
  for i = 17 + n, 16 + n + k do resolved[ARGV[i]] = 'keep' end
  local quota = {}
  for i = 17 + n + k, #ARGV, 2 do quota[ARGV[i]] = tonumber(ARGV[i + 1]) end
  local entries = redis.call('HGETALL', KEYS[2])
  local journal_units = 0
  for i = 1, #entries, 2 do
    local request_id = entries[i]
    -- user|quantity|order_no|reserved_at_ms|unit_price|claimed, or (written before the unit
    -- price was recorded) user|quantity|order_no|reserved_at_ms|claimed.
    local user, quantity = string.match(entries[i + 1], '^(.*)|(%d+)|[^|]*|%d+|%d+|%d$')
    if not user then user, quantity = string.match(entries[i + 1], '^(.*)|(%d+)|[^|]*|%d+|%d$') end
    quantity = tonumber(quantity)
    if resolved[request_id] == 'keep' then
      journal_units = journal_units + quantity
    elseif resolved[request_id] then
      dropped = dropped + 1
      if write then
        redis.call('HDEL', KEYS[2], request_id)
        redis.call('HDEL', KEYS[7], request_id)
      else
        journal_units = journal_units + quantity
      end
    else
      in_flight = in_flight + 1
      units = units + quantity
      journal_units = journal_units + quantity
      quota[user] = (quota[user] or 0) + quantity
    end
  end
  if write then
    redis.call('SET', KEYS[6], journal_units)
    redis.call('DEL', KEYS[3])
    for user, held in pairs(quota) do
      if held > 0 then redis.call('HSET', KEYS[3], user, held) end
    end
  end
end

-- More units in flight than MySQL holds: some will be rejected by the consumer; sell nothing more.
-- A drained bucket sells nothing until its share is filled in.
local held = tonumber(redis.call('HGET', KEYS[8], 'held') or '0')
local after = pass > 0 and 0 or math.max(tonumber(ARGV[1]) - units, 0) - held
if write then
  local terms = redis.call('HMGET', KEYS[5], 'starts_ms', 'ends_ms', 'limit', 'price', 'token', 'buckets', 'room')
  if after > 0 or terms[1] ~= ARGV[4] or terms[2] ~= ARGV[5] or terms[3] ~= ARGV[6] or terms[4] ~= ARGV[7]
      or terms[5] ~= ARGV[8] or (terms[6] or '1') ~= ARGV[9] or (terms[7] or '0') ~= ARGV[10] then
    redis.call('PUBLISH', ARGV[12], ARGV[13])
  end
  redis.call('HSET', KEYS[5], 'starts_ms', ARGV[4], 'ends_ms', ARGV[5], 'limit', ARGV[6], 'price', ARGV[7],
    'token', ARGV[8], 'buckets', ARGV[9], 'room', ARGV[10])
  if n >= 0 then redis.call('HSET', KEYS[5], 'server', run_id) end
  if ARGV[11] == 'database' then
    redis.call('HSET', KEYS[5], 'mode', 'database')
  elseif ARGV[11] == 'open' then
    redis.call('HDEL', KEYS[5], 'mode')
  end
  redis.call('SET', KEYS[1], after)
  redis.call('HSET', KEYS[4], 'synced', version)
  if pass > 0 then redis.call('HSET', KEYS[4], 'pass', pass, 'filling', pass) end
end
return {before, after, in_flight, units, dropped, stale and 1 or 0, held}
