-- Reserve stock for one purchase, atomically (the hot path: one round trip, accept or reject).
-- KEYS[1] stock   KEYS[2] sale (starts_ms, ends_ms, limit, price, token, mode)   KEYS[3] journal
-- KEYS[4] quota   KEYS[5] replay record
-- KEYS[6] the user's rate bucket   KEYS[7] the client address's rate bucket (both in the product's slot)
-- KEYS[8] order token (user id; the anti-duplicate token, deleted
-- atomically on submit)   KEYS[9] units of the journal's entries (realignment reads it)
-- KEYS[10] waiting room admissions (zset user -> expiry ms)   KEYS[11] admission tokens (hash
-- user -> token, '+' appended when the admission holds a unit)   KEYS[12] the waiting room's
-- counters (lua/queue.lua: 'held' units kept for admitted buyers, the admit 'factor')
-- KEYS[13] the waiting room's due times (hash user -> when a call may learn of its admission)
-- ARGV[1] request id   ARGV[2] user id   ARGV[3] quantity   ARGV[4] order number to use
-- ARGV[5] replay record ttl (seconds)   ARGV[6] attempt token (unique to this HTTP attempt)
-- ARGV[7] user emission interval (ms, 0: no user limit)   ARGV[8] user burst (requests)
-- ARGV[9] address emission interval (ms, 0: no address limit)   ARGV[10] address burst
-- ARGV[11] '1' when the request carries an order token (KEYS[8] names it), else '0'
-- ARGV[12] the product's stock buckets K as the caller knows them (KEYS are those of the buyer's
-- bucket among K: service/domain/stock/buckets.py)
-- ARGV[13] the Admission-Token ('' without one): needed when the sale's room is '1', consumed by
-- the reservation it makes
-- Returns {outcome, order_no[, reserved_at_ms, unit price[, admissions outstanding, units held
-- (a sale with a waiting room)]]}, or for sold_out
-- {'sold_out', '', units left, per-user limit, ms left in the sale or -1}, or for rate_limited
-- {'rate_limited', '', ms until a request is allowed}, or for rebucket {'rebucket', '', K} (the
-- product has K buckets, not ARGV[12]: the caller asks the buyer's bucket among K). outcome: reserved | replay | in_flight |
-- key_reused | abandoned | rebucket | moved | not_loaded | sale_not_active | over_limit | sold_out |
-- token_required | token_invalid | admission_required | limit_exceeded | rate_limited. Only 'reserved' writes stock,
-- quota, journal or replay record; every request that is not rate_limited spends from the rate
-- buckets.
-- Before anything is read or spent: the keys are another bucket's when the caller's K is not the
-- product's (a process that has not met the product's K yet).
local buckets = tonumber(redis.call('HGET', KEYS[2], 'buckets') or '1')
if buckets ~= tonumber(ARGV[12]) then return {'rebucket', '', buckets} end

local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)

-- GCRA (the generic cell rate algorithm, ITU-T I.371): a bucket holds its theoretical arrival
-- time; a request is allowed when that time, pushed one interval on, is at most burst intervals
-- ahead of now. Returns the new arrival time, or nil and the ms to wait.
local function gcra(key, interval, burst)
  if interval <= 0 then return nil, 0 end
  local tat = math.max(tonumber(redis.call('GET', key) or '0'), now_ms) + interval
  local wait = tat - now_ms - interval * burst
  if wait > 0 then return nil, wait end
  return tat, 0
end
local user_tat, user_wait = gcra(KEYS[6], tonumber(ARGV[7]), tonumber(ARGV[8]))
local address_tat, address_wait = gcra(KEYS[7], tonumber(ARGV[9]), tonumber(ARGV[10]))
if user_wait > 0 or address_wait > 0 then
  return {'rate_limited', '', math.max(user_wait, address_wait)}
end
if user_tat then redis.call('SET', KEYS[6], user_tat, 'PX', user_tat - now_ms) end
if address_tat then redis.call('SET', KEYS[7], address_tat, 'PX', address_tat - now_ms) end

local quantity = tonumber(ARGV[3])
local record = redis.call('HMGET', KEYS[5], 'quantity', 'order_no', 'state', 'abandoned:' .. ARGV[6])
-- This attempt was already answered 503 and release.lua found nothing to give back (this call
-- was still on the wire): it must not take effect now.
if record[4] then return {'abandoned', ''} end
local order_no = ARGV[4]
if record[1] then
  if tonumber(record[1]) ~= quantity then return {'key_reused', record[2]} end
  if record[3] == 'queued' then return {'replay', record[2]} end
  if record[3] == 'pending' then
    -- Still in the journal: not confirmed yet. Gone from it: realignment found its order row
    -- (the API had lost the step that marks it queued), so it is a replay.
    if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then return {'in_flight', record[2]} end
    return {'replay', record[2]}
  end
  -- 'released': the first attempt never took effect; a retry reuses its order number, so a
  -- delayed copy of the first message and this retry describe one and the same order.
  order_no = record[2]
end

local sale = redis.call('HMGET', KEYS[2], 'starts_ms', 'ends_ms', 'limit', 'price', 'token', 'mode', 'room', 'server')
-- The product sells from MySQL (stock mode 'database'), or is being switched there: the marker
-- is written before MySQL serves, so no reservation is taken here after it.
if sale[6] == 'database' then return {'moved', ''} end
local stock = redis.call('GET', KEYS[1])
if not sale[1] or not sale[4] or not stock then return {'not_loaded', ''} end
-- Loaded in another life of this server (a restart from an older snapshot or AOF, a replica
-- promoted before it had the last writes): stock, quotas and replay records may be rolled back.
-- Not loaded until realignment has given back what MySQL knows (lua/realign.lua writes 'server').
local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
if not sale[8] then
  -- Loaded by a release that did not record the server: taken as this server's, as that release
  -- sold it, so an upgrade has no not_loaded window (docs/OPERATIONS.md, "Upgrades and roll-backs").
  redis.call('HSET', KEYS[2], 'server', run_id)
elseif sale[8] ~= run_id then
  return {'not_loaded', ''}
end

local ends_ms = tonumber(sale[2])
if now_ms < tonumber(sale[1]) or (ends_ms > 0 and now_ms >= ends_ms) then
  return {'sale_not_active', ''}
end

local limit = tonumber(sale[3])
if quantity > limit then return {'over_limit', ''} end
-- Units kept for the buyers a waiting room admitted (lua/queue.lua) are not sold: units left =
-- stock + held; only their holders buy them.
local room = sale[7] == '1' and redis.call('HMGET', KEYS[12], 'held', 'factor') or {}
local room_held = tonumber(room[1] or '0')
-- Stock before the user's quota: a sold-out product answers sold_out whoever asks, so an API
-- process can answer it from its sold-out flag (service/domain/purchase/sold_out.py) without the quota.
-- The reply carries what the flag needs: the units left, the limit, the ms left in the sale
-- (-1: no end).
stock = tonumber(stock)
local function sold_out()
  return {'sold_out', '', stock + room_held, limit, ends_ms > 0 and ends_ms - now_ms or -1}
end
if stock + room_held < quantity then return sold_out() end
-- An order token is checked only on a first attempt: a retry after a release ('released'
-- record above) already consumed it under this very request id (the token is its key).
local needs_token = sale[5] == '1' and not record[1]
if needs_token then
  if ARGV[11] ~= '1' then return {'token_required', ''} end
  if redis.call('GET', KEYS[8]) ~= ARGV[2] then return {'token_invalid', ''} end
end
-- The waiting room's admission, likewise only on a first attempt: the admitted buyer's own token,
-- not expired (lua/queue.lua hands it out and drops it at its expiry). One that holds a unit
-- buys it: it needs one unit fewer from the stock.
local needs_admission = sale[7] == '1' and not record[1]
local holds = 0
if needs_admission then
  local expires = tonumber(redis.call('ZSCORE', KEYS[10], ARGV[2]) or '0')
  local grant = redis.call('HGET', KEYS[11], ARGV[2]) or ''
  if ARGV[13] == '' or expires <= now_ms or string.sub(grant, 1, 32) ~= ARGV[13] then
    return {'admission_required', ''}
  end
  if string.sub(grant, 33) == '+' then holds = 1 end
end
if stock + holds < quantity then return sold_out() end
local held = tonumber(redis.call('HGET', KEYS[4], ARGV[2]) or '0')
if held + quantity > limit then return {'limit_exceeded', ''} end

redis.call('DECRBY', KEYS[1], quantity - holds)
redis.call('HINCRBY', KEYS[4], ARGV[2], quantity)
-- The unit price is fixed here (minor units, the string Redis holds: Lua numbers are doubles),
-- so a re-publish by realignment charges what this reservation was accepted at.
-- The journal's units counter counts this entry; an entry it replaces (the same request id,
-- reused after its replay record expired) no longer counts.
local replaced = redis.call('HGET', KEYS[3], ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2] .. '|' .. quantity .. '|' .. order_no .. '|' .. now_ms .. '|' .. sale[4] .. '|0')
redis.call('INCRBY', KEYS[9], quantity - tonumber(replaced and (string.match(replaced, '^.*|(%d+)|[^|]*|%d+|%d+|%d$')
  or string.match(replaced, '^.*|(%d+)|[^|]*|%d+|%d$')) or 0))
redis.call('HSET', KEYS[5], 'quantity', quantity, 'order_no', order_no, 'state', 'pending', 'attempt', ARGV[6])
redis.call('EXPIRE', KEYS[5], tonumber(ARGV[5]))
if needs_token then redis.call('DEL', KEYS[8]) end
if needs_admission then
  redis.call('ZREM', KEYS[10], ARGV[2])
  redis.call('HDEL', KEYS[11], ARGV[2])
  redis.call('HINCRBY', KEYS[12], 'used', 1)
  if holds > 0 then room_held = redis.call('HINCRBY', KEYS[12], 'held', -1) end
end
if sale[7] ~= '1' then return {'reserved', order_no, now_ms, sale[4]} end
-- The bound at every moment: admitted-but-unused <= ceil(units left x factor). A purchase took
-- units; the latest admissions the units left no longer cover are withdrawn (their held units,
-- if any, go back to the stock).
stock = stock - quantity + holds
local outstanding = redis.call('ZCARD', KEYS[10])
local excess = outstanding - math.ceil(math.max(stock + room_held, 0) * tonumber(room[2] or '1'))
if excess > 0 then
  local latest = redis.call('ZRANGE', KEYS[10], -excess, -1)
  local grants = redis.call('HMGET', KEYS[11], unpack(latest))
  local back = 0
  for i = 1, #grants do
    if grants[i] and string.sub(grants[i], 33) == '+' then back = back + 1 end
  end
  redis.call('ZREM', KEYS[10], unpack(latest))
  redis.call('HDEL', KEYS[11], unpack(latest))
  -- As lua/queue.lua withdraws: a buyer not told yet has nothing left to wait for ('none').
  redis.call('HDEL', KEYS[13], unpack(latest))
  redis.call('HINCRBY', KEYS[12], 'withdrawn', #latest)
  if back > 0 then
    redis.call('INCRBY', KEYS[1], back)
    room_held = redis.call('HINCRBY', KEYS[12], 'held', -back)
  end
  outstanding = outstanding - #latest
end
return {'reserved', order_no, now_ms, sale[4], outstanding, room_held}
