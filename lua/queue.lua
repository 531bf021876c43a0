-- A buyer joins, or looks at, a product's waiting room; the room moves on in the same call
-- (docs/ARCHITECTURE.md, "Waiting room"). One round trip per join or poll, atomic:
--   1. the sale's terms and stock (no room, not loaded, closed: answered, nothing written);
--   2. the first call that finds the sale open fixes the pre-queue's drawn order (opened_ms);
--   3. admissions past their expiry are dropped (their holders' places go to the next);
--   4. a join puts the buyer in line once: before the opening at its lottery place, after it in
--      arrival order behind the whole pre-queue, arrival counted in windows of ARGV[9] ms with a
--      random order within a window (the fastest of many parallel joins gains little; 0: exact);
--   5. while stock is left and the sale is open, the next in line are admitted while admitted
--      buyers who have not bought stay under ceil(units left x factor);
--   6. the buyer's state. News of an admission is told only at a call at or after the buyer's due
--      time (the moment its last answer said to ask again; for a join after the opening, the
--      end of its arrival window plus a random spread): an earlier look answers 'early', an
--      earlier join 'waiting', with the ms still to wait, so polling harder learns nothing sooner.
-- KEYS[1] stock   KEYS[2] sale   KEYS[3] room (hash: seed, seq, opened_ms, entrants, admitted,
-- expired, used)   KEYS[4] line (zset user -> place score: the order of the line, for positions)
-- KEYS[5] waiting (zset user -> place score)   KEYS[6] admitted (zset user -> token expiry ms)
-- KEYS[7] grants (hash user -> admission token)   KEYS[8] joined (hash user -> ms joined)
-- KEYS[9] pre-queue (zset user -> lottery score; never changed after the opening: the record)
-- KEYS[10] due (hash user -> ms before which a call learns no admission)
-- ARGV[1] user id   ARGV[2] '1' join, '0' look   ARGV[3] admit factor   ARGV[4] admission ttl ms
-- ARGV[5] 32 random hex from the caller: the room's secret seed if this is its first pre-queue
-- join, and the nonce the admission tokens, an arrival's place within its window and the poll
-- spread of this call derive from   ARGV[6] poll min ms   ARGV[7] poll max ms
-- ARGV[8] poll ms per buyer ahead   ARGV[9] arrival window ms   ARGV[10] polls per second the
-- whole line is paced to (0: none): the back of a long line is told to ask again after as many
-- ms as keep the line's polls near it, past poll max ms if need be
-- Returns {state, position, ahead, units left, token, expires_ms, waiting, outstanding, opened,
-- admitted now, expired now, per-user limit, ms left in the sale (-1: no end), now_ms, starts_ms,
-- poll after ms, wait ms of each buyer admitted now ...}; position (the buyer's place in the
-- line, 1 first) and ahead (buyers waiting before them) -1 when unknown: before the opening, or
-- not waiting.
-- state: waiting | admitted | sold_out | closed | none (a look by a buyer not in line) | early (a
-- look before the buyer's due time) | off (the product has no waiting room) | not_loaded.
local BATCH = 256 -- the most admissions or expiries one call makes (bounds the time Redis is held)
local SCALE = 4503599627370496 -- 2^52: a lottery score is 13 hex digits of sha1 over 2^52, exact

local sale = redis.call('HMGET', KEYS[2], 'starts_ms', 'ends_ms', 'limit', 'room', 'mode')
local stock = redis.call('GET', KEYS[1])
if not sale[1] or not stock then return {'not_loaded'} end
if sale[4] ~= '1' or sale[5] == 'database' then return {'off'} end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local starts_ms, ends_ms = tonumber(sale[1]), tonumber(sale[2])
local left_ms = ends_ms > 0 and ends_ms - now_ms or -1
stock = tonumber(stock)
local user = ARGV[1]
local low, high = tonumber(ARGV[6]), tonumber(ARGV[7])
-- A random fraction in [0, 1) drawn from this call's nonce (what: a name per use).
local function fraction(what)
  return tonumber(string.sub(redis.sha1hex(ARGV[5] .. ':' .. what), 1, 8), 16) / 4294967296
end
local function answer(state, position, ahead, token, expires, opened, admitted, expired, waits, poll)
  local reply = {state, position, ahead, stock, token, expires, redis.call('ZCARD', KEYS[5]),
    redis.call('ZCARD', KEYS[6]), opened, admitted, expired, tonumber(sale[3]), left_ms, now_ms, starts_ms,
    poll or high}
  for i = 1, #waits do reply[#reply + 1] = waits[i] end
  return reply
end
if ends_ms > 0 and now_ms >= ends_ms then return answer('closed', -1, -1, '', 0, 0, 0, 0, {}) end

-- 2. The opening: from here on the pre-queue's order is fixed (its lottery scores were drawn
-- with the secret seed as each buyer joined) and later joiners queue in arrival order.
local room = redis.call('HMGET', KEYS[3], 'opened_ms', 'seed')
local open = now_ms >= starts_ms
local opened = 0
if open and not room[1] then
  redis.call('HSET', KEYS[3], 'opened_ms', now_ms, 'entrants', redis.call('ZCARD', KEYS[9]))
  room[1] = tostring(now_ms)
  opened = 1
end

-- 3. Admissions past their expiry: their places go to the next in line.
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now_ms, 'LIMIT', 0, BATCH)
if #lapsed > 0 then
  redis.call('ZREM', KEYS[6], unpack(lapsed))
  redis.call('HDEL', KEYS[7], unpack(lapsed))
  redis.call('HDEL', KEYS[10], unpack(lapsed))
  redis.call('HINCRBY', KEYS[3], 'expired', #lapsed)
end

-- 4. A join: one place per buyer (a buyer in line or admitted keeps theirs). A sold-out room
-- takes nobody in (what the process's sold-out flag answers too).
local waiting_score = redis.call('ZSCORE', KEYS[5], user)
local expires = redis.call('ZSCORE', KEYS[6], user)
if ARGV[2] == '1' and not waiting_score and not expires and stock > 0 then
  local score
  local width = tonumber(ARGV[9])
  if room[1] and width == 0 then
    score = 1 + redis.call('HINCRBY', KEYS[3], 'seq', 1) -- exact arrival order
  elseif room[1] then
    -- Above every lottery score (< 1): the window of the arrival, and a random place within it.
    local window = math.floor((now_ms - tonumber(room[1])) / width)
    score = 1 + window + fraction('arrival')
    redis.call('HSET', KEYS[10], user, tonumber(room[1]) + (window + 1) * width + math.floor(fraction('spread') * low))
  else
    local seed = room[2]
    if not seed then
      seed = ARGV[5]
      redis.call('HSET', KEYS[3], 'seed', seed)
    end
    score = tonumber(string.sub(redis.sha1hex(seed .. ':' .. user), 1, 13), 16) / SCALE
    redis.call('ZADD', KEYS[9], score, user)
  end
  redis.call('ZADD', KEYS[5], score, user)
  redis.call('ZADD', KEYS[4], score, user)
  redis.call('HSET', KEYS[8], user, now_ms)
end

-- 5. Admissions, in line order, while the admitted who have not bought stay under the bound.
local admitted, waits = 0, {}
if open and stock > 0 then
  local free = math.ceil(stock * tonumber(ARGV[3])) - redis.call('ZCARD', KEYS[6])
  if free > 0 then
    local popped = redis.call('ZPOPMIN', KEYS[5], math.min(free, BATCH))
    local until_ms = now_ms + tonumber(ARGV[4])
    for i = 1, #popped, 2 do
      local who = popped[i]
      redis.call('ZADD', KEYS[6], until_ms, who)
      -- Bound to its holder (reserve.lua compares it with the buyer's own grant), unguessable
      -- without the caller's nonce.
      redis.call('HSET', KEYS[7], who, string.sub(redis.sha1hex(ARGV[5] .. ':' .. who), 1, 32))
      local joined = tonumber(redis.call('HGET', KEYS[8], who) or now_ms)
      redis.call('HDEL', KEYS[8], who)
      -- A pre-queue buyer waited from the opening, not from when they joined.
      waits[#waits + 1] = now_ms - math.max(joined, starts_ms)
      admitted = admitted + 1
    end
    if admitted > 0 then redis.call('HINCRBY', KEYS[3], 'admitted', admitted) end
  end
end

-- 6. The buyer's state. No stock: sold_out for everyone (an admission holder keeps it, for
-- units that may come back). Before the buyer's due time the answer is the one it was given
-- (waiting, ahead of it nobody it can overtake), with the ms still to wait.
if stock <= 0 then return answer('sold_out', -1, -1, '', 0, opened, admitted, #lapsed, waits) end
local due = tonumber(redis.call('HGET', KEYS[10], user) or '0')
local early = now_ms < due
if early and ARGV[2] ~= '1' then return answer('early', -1, -1, '', 0, opened, admitted, #lapsed, waits, due - now_ms) end
expires = redis.call('ZSCORE', KEYS[6], user)
if expires and early then
  return answer('waiting', redis.call('ZRANK', KEYS[4], user) + 1, 0, '', 0, opened, admitted, #lapsed, waits,
    due - now_ms)
end
if expires then
  redis.call('HDEL', KEYS[10], user)
  return answer('admitted', redis.call('ZRANK', KEYS[4], user) + 1, -1, redis.call('HGET', KEYS[7], user),
    tonumber(expires), opened, admitted, #lapsed, waits)
end
if not redis.call('ZSCORE', KEYS[5], user) then
  return answer('none', -1, -1, '', 0, opened, admitted, #lapsed, waits)
end
local position, ahead, poll = -1, -1, due - now_ms
if open then
  position, ahead = redis.call('ZRANK', KEYS[4], user) + 1, redis.call('ZRANK', KEYS[5], user)
end
if not early then
  -- Before the opening: at the opening, spread over poll_min so a pre-queue does not ask in one
  -- instant (asking first gains nothing: the order is drawn); in line, sooner nearer the front.
  if open then
    local ceiling, budget = high, tonumber(ARGV[10])
    if budget > 0 then ceiling = math.max(high, math.ceil(redis.call('ZCARD', KEYS[5]) * 1000 / budget)) end
    poll = math.min(math.max(ahead * tonumber(ARGV[8]), low), ceiling)
  else
    poll = math.min(math.max(starts_ms - now_ms, low), high) + math.floor(fraction('spread') * low)
  end
  redis.call('HSET', KEYS[10], user, now_ms + poll)
end
return answer('waiting', position, ahead, '', 0, opened, admitted, #lapsed, waits, poll)
