-- A buyer joins, or looks at, a product's waiting room; the room moves on in the same call
-- (docs/ARCHITECTURE.md, "Waiting room"). One round trip per join or poll, atomic:
--   1. the sale's terms and stock (no room, not loaded, closed: answered, nothing written); a
--      new opening once the room has opened starts a new room (the old line is kept only to
--      answer its buyers 'closed', the old room's held units go back to the stock);
--   2. the first call that finds the sale open fixes the pre-queue's drawn order (opened_ms);
--   3. admissions past their expiry are dropped, and departure buckets that passed are counted
--      (a waiting buyer with no call within ARGV[10] x the longest poll interval it was told, at
--      least poll max, plus ARGV[12], has departed: never admitted, not counted, its place lost when found); then, should the units left no longer cover them (a realignment lowered the stock),
--      the latest admissions are withdrawn until admitted-but-unused <= ceil(units left x factor);
--   4. a join puts the buyer in line once: before the opening at its lottery place, after it in
--      arrival order behind the whole pre-queue, arrival counted in windows of ARGV[9] ms with a
--      random order within a window (the fastest of many parallel joins gains little; 0: exact);
--   5. while units are left and the sale is open, the next in line whose place is final are
--      admitted while admitted buyers who have not bought stay under ceil(units left x factor). With factor 1 each
--      admission holds one unit, taken from the stock in this very call (the grant ends in '+'):
--      lua/reserve.lua sells it to its holder only; it comes back at expiry or withdrawal;
--   6. the buyer's state. News of an admission is told only at a call at or after the buyer's due
--      time (the moment its last answer said to ask again; for a join after the opening, the
--      end of its arrival window plus a random spread): an earlier look answers 'early', an
--      earlier join 'waiting', with the ms still to wait, so polling harder learns nothing sooner.
--      A place (position, ahead) is told only once final: once the sale is open and the
--      buyer's arrival window has closed (nobody can be placed before them any more); a place
--      left (departed, re-joined) stays taken by a placeholder, so no later place moves.
-- Units: the stock key counts units free to admit or sell; the room's 'held' units kept for
-- admitted buyers are not sold (realign.lua subtracts them); units left = stock + held.
-- KEYS[1] stock   KEYS[2] sale   KEYS[3] room (hash: seed, seq, opened_ms, entrants, admitted,
-- expired, used, held, factor, starts_ms, departed, withdrawn, rolled: the last departure bucket
-- counted, gone: departed buyers not yet found, expiry: no admission expires before it, 'none'
-- with none, absent: not known; expired admissions are looked for only from then on)
-- KEYS[4] line (zset user -> place score: the order of the line, for positions)
-- KEYS[5] waiting (zset user -> place score)   KEYS[6] admitted (zset user -> token expiry ms)
-- KEYS[7] grants (hash user -> admission token, '+' appended when it holds a unit)
-- KEYS[8] joined (hash user -> ms joined)
-- KEYS[9] pre-queue (zset user -> lottery score; never changed after the opening: the record)
-- KEYS[10] due (hash user -> 'ms before which a call learns no admission:longest poll ms
-- told:departure bucket', then ':position' once final)
-- KEYS[11] seen (hash departure bucket -> waiting buyers whose deadline falls in it; a buyer
-- departs once its bucket has passed, found when it comes back or reaches the front: per poll
-- two increments of a small hash, not a sorted set of every buyer)   KEYS[12] the previous window's
-- line (zset: its buyers are answered 'closed')
-- ARGV[1] user id   ARGV[2] '1' join, '0' look   ARGV[3] admit factor   ARGV[4] admission ttl ms
-- ARGV[5] 32 random hex from the caller: the room's secret seed if this is its first pre-queue
-- join, and the nonce the admission tokens, an arrival's place within its window and the poll
-- spread of this call derive from   ARGV[6] poll min ms   ARGV[7] poll max ms
-- ARGV[8] poll ms per buyer ahead   ARGV[9] arrival window ms   ARGV[10] departure multiple
-- ARGV[11] polls per second the whole line is paced to (0: none): the back of a long line is
-- told to ask again after as many ms as keep the line's polls near it, past poll max ms if need be
-- ARGV[12] departure grace ms: added to every departure deadline (a call's time in a loaded server's queue)
-- ARGV[13] opening draw ms: the room opens (the draw is fixed, admissions begin) this long after the sale
-- Returns {state, position, ahead, units left, token, expires_ms, waiting, outstanding, opened,
-- admitted now, expired now, per-user limit, ms left in the sale (-1: no end), now_ms, starts_ms,
-- poll after ms, 1 when the buyer's admission holds a unit, units held, wait ms of each buyer
-- admitted now ...}; position (the buyer's place in the line, 1 first) and ahead (buyers
-- waiting before them) -1 while not final, or not waiting.
-- state: waiting | admitted | sold_out | closed | none (a look by a buyer not in line) | early (a
-- look before the buyer's due time) | off (the product has no waiting room) | not_loaded.
local BATCH = 256 -- the most admissions, expiries or departures one call makes (bounds the time Redis is held)
local SCALE = 4503599627370496 -- 2^52: a lottery score is 13 hex digits of sha1 over 2^52, exact
local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min -- a global's lookup less a call

local sale = redis.call('HMGET', KEYS[2], 'starts_ms', 'ends_ms', 'limit', 'room', 'mode')
local stock = redis.call('GET', KEYS[1])
if not sale[1] or not stock then return {'not_loaded'} end
if sale[4] ~= '1' or sale[5] == 'database' then return {'off'} end
local now = redis.call('TIME')
-- A number is read by Lua's arithmetic (s + 0: parsed once), not tonumber (a C call parsing it
-- twice, several times the cost: two dozen a call were a tenth of a poll's, docs/BENCHMARKS.md).
local now_ms = now[1] * 1000 + floor(now[2] / 1000)
local starts_ms, ends_ms = sale[1] + 0, sale[2] + 0
local left_ms = ends_ms > 0 and ends_ms - now_ms or -1
stock = stock + 0
local user = ARGV[1]
local factor = ARGV[3] + 0
local hold = factor <= 1
local low, high, width = ARGV[6] + 0, ARGV[7] + 0, ARGV[9] + 0
local room = redis.call('HMGET', KEYS[3], 'opened_ms', 'seed', 'held', 'starts_ms', 'rolled', 'gone', 'expiry')
local held = (room[3] or 0) + 0
local opened_ms = room[1] and room[1] + 0 -- nil before the opening
-- Departure deadlines are counted in buckets of a quarter of the shortest departure bound
-- (bucket b: deadlines in ((b - 1) x W, b x W]; a handful of buckets ahead at any time); a buyer
-- whose bucket is at or before now's has departed (up to W ms after its deadline).
local departs, grace = ARGV[10] + 0, ARGV[12] + 0
local W = max(1, ceil(departs * high / 4))
local now_b = floor(now_ms / W)
local gone = (room[6] or 0) + 0 -- departed buyers still in wr:waiting (found lazily)
-- No admission expires before 'expiry' ('none': no admission; absent: not known yet), so a call
-- before it has no expiry to look for.
local expiry = room[7] == 'none' and math.huge or (room[7] or 0) + 0
-- A random fraction in [0, 1) drawn from this call's nonce (what: a name per use).
local function fraction(what)
  return tonumber(string.sub(redis.sha1hex(ARGV[5] .. ':' .. what), 1, 8), 16) / 4294967296
end
local outstanding, in_line -- admissions not used, buyers in wr:waiting, once known (else asked at the answer)
local function answer(state, position, ahead, token, expires, opened, admitted, expired, waits, poll, holds)
  local reply = {state, position, ahead, stock + held, token, expires,
    (in_line or redis.call('ZCARD', KEYS[5])) - gone, outstanding or redis.call('ZCARD', KEYS[6]), opened,
    admitted, expired, sale[3] + 0, left_ms, now_ms, starts_ms, poll or high, holds and 1 or 0, held}
  for i = 1, #waits do reply[#reply + 1] = waits[i] end
  return reply
end
if ends_ms > 0 and now_ms >= ends_ms then return answer('closed', -1, -1, '', 0, 0, 0, 0, {}) end

-- 1. A new opening after the room opened: a new room. The old line answers its buyers
-- 'closed'; held units go back. (An opening moved before it came is the same room.)
if room[4] ~= sale[1] then
  if opened_ms then
    if held > 0 then
      stock = redis.call('INCRBY', KEYS[1], held)
      held = 0
    end
    redis.call('DEL', KEYS[12])
    if redis.call('EXISTS', KEYS[4]) == 1 then redis.call('RENAME', KEYS[4], KEYS[12]) end
    redis.call('DEL', KEYS[3], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11])
    room, opened_ms = {false, false, false, false, false, false, false}, nil
    gone, expiry = 0, 0
  end
  redis.call('HSET', KEYS[3], 'starts_ms', sale[1])
end

-- 2. The opening: from here on the pre-queue's order is fixed (its lottery scores were drawn
-- with the secret seed as each buyer joined) and later joiners queue in arrival order. The room
-- opens ARGV[13] ms after the sale does: who joins before then is drawn, so being read first
-- among a stampede the server is still absorbing earns nothing.
local draw_ms = starts_ms + ARGV[13]
local open = now_ms >= draw_ms
local opened = 0
if open and not opened_ms then
  redis.call('HSET', KEYS[3], 'opened_ms', now_ms, 'entrants', redis.call('ZCARD', KEYS[9]))
  opened_ms = now_ms
  opened = 1
end

-- A place given up: after the opening a placeholder keeps its rank (no other place moves);
-- before it, places are not shown yet and the pre-queue lists only who is there at the opening.
local function vacate(who)
  local score = redis.call('ZSCORE', KEYS[4], who)
  if not score then return end
  redis.call('ZREM', KEYS[4], who)
  if open then
    redis.call('ZADD', KEYS[4], score, '\0left:' .. redis.call('HINCRBY', KEYS[3], 'vacated', 1))
  else
    redis.call('ZREM', KEYS[9], who)
  end
end
-- Admissions dropped (expired or withdrawn): the units they held go back to the stock.
local function drop(users)
  local grants = redis.call('HMGET', KEYS[7], unpack(users))
  local back = 0
  for i = 1, #grants do
    if grants[i] and string.sub(grants[i], 33) == '+' then back = back + 1 end
  end
  redis.call('ZREM', KEYS[6], unpack(users))
  redis.call('HDEL', KEYS[7], unpack(users))
  redis.call('HDEL', KEYS[10], unpack(users))
  if back > 0 then
    stock = redis.call('INCRBY', KEYS[1], back)
    held = redis.call('HINCRBY', KEYS[3], 'held', -back)
  end
end
-- Departed buyers found (their bucket passed): out of the line, no longer counted.
local function departed(users)
  redis.call('ZREM', KEYS[5], unpack(users))
  redis.call('HDEL', KEYS[10], unpack(users))
  redis.call('HDEL', KEYS[8], unpack(users))
  for i = 1, #users do vacate(users[i]) end
  redis.call('HINCRBY', KEYS[3], 'departed', #users)
  gone = redis.call('HINCRBY', KEYS[3], 'gone', -#users)
end
-- A due entry: 'due ms:longest poll ms told:departure bucket:final position' (older: 'due ms'),
-- written with one string.format (concatenating numbers costs several times more).
local function parse_due(entry)
  if not entry then return 0, 0, 0, nil end
  local d, l, b, p = string.match(entry, '^(%d+):?(%d*):?(%d*):?(%d*)$')
  if not d then return 0, 0, 0, nil end
  return d + 0, l ~= '' and l + 0 or 0, b ~= '' and b + 0 or 0, p ~= '' and p + 0 or nil
end

-- 3. Admissions past their expiry, departed buyers, admissions the units left no longer cover.
local lapsed = {}
if expiry <= now_ms then
  lapsed = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now_ms, 'LIMIT', 0, BATCH)
  if #lapsed > 0 then
    drop(lapsed)
    redis.call('HINCRBY', KEYS[3], 'expired', #lapsed)
  end
  if #lapsed < BATCH then
    local first = redis.call('ZRANGE', KEYS[6], '0', '0', 'WITHSCORES')
    expiry = first[2] and first[2] + 0 or math.huge
    redis.call('HSET', KEYS[3], 'expiry', first[2] or 'none')
  end
end
-- Buckets that passed: their buyers have departed (counted in 'gone' until found). Once per
-- bucket of time per room; the hash holds only the buckets ahead.
if not room[5] then
  redis.call('HSET', KEYS[3], 'rolled', now_b)
elseif room[5] + 0 < now_b then
  local fields, passed, add = redis.call('HGETALL', KEYS[11]), {}, 0
  for i = 1, #fields, 2 do
    if tonumber(fields[i]) <= now_b then
      passed[#passed + 1] = fields[i]
      add = add + tonumber(fields[i + 1])
    end
  end
  if #passed > 0 then redis.call('HDEL', KEYS[11], unpack(passed)) end
  gone = gone + add
  redis.call('HSET', KEYS[3], 'rolled', now_b, 'gone', gone)
end
outstanding = redis.call('ZCARD', KEYS[6])
local excess = max(outstanding - ceil(max(stock + held, 0) * factor), -stock)
if excess > 0 and outstanding > 0 then
  local latest = redis.call('ZRANGE', KEYS[6], -min(excess, BATCH), -1)
  drop(latest)
  redis.call('HINCRBY', KEYS[3], 'withdrawn', #latest)
  outstanding = outstanding - #latest
end

-- No unit left (none held either): sold_out for everyone, nothing else to learn or write.
if stock + held <= 0 then return answer('sold_out', -1, -1, '', 0, opened, 0, #lapsed, {}) end

-- 4. A join: one place per buyer (a buyer in line or admitted keeps theirs; one whose place
-- was left re-joins at the back). A sold-out room takes nobody in (what the process's
-- sold-out flag answers too).
local waiting_score = redis.call('ZSCORE', KEYS[5], user)
local expires = not waiting_score and redis.call('ZSCORE', KEYS[6], user) -- admitted leave the line
local due, longest, bucket, place = parse_due(redis.call('HGET', KEYS[10], user))
if waiting_score and bucket > 0 and bucket <= now_b then
  departed({user}) -- back after its departure: the place is lost
  waiting_score, due, longest, bucket, place = nil, 0, 0, 0, nil
end
if ARGV[2] == '1' and not waiting_score and not expires then
  local score
  if opened_ms and width == 0 then
    score = 1 + redis.call('HINCRBY', KEYS[3], 'seq', 1) -- exact arrival order
  elseif opened_ms then
    -- Above every lottery score (< 1): the window of the arrival, and a random place within it.
    local window = floor((now_ms - opened_ms) / width)
    score = 1 + window + fraction('arrival')
    due = opened_ms + (window + 1) * width + floor(fraction('spread') * low)
    redis.call('HSET', KEYS[10], user, due)
  else
    local seed = room[2]
    if not seed then
      seed = ARGV[5]
      redis.call('HSET', KEYS[3], 'seed', seed)
    end
    score = tonumber(string.sub(redis.sha1hex(seed .. ':' .. user), 1, 13), 16) / SCALE
    redis.call('ZADD', KEYS[9], score, user)
  end
  if opened_ms then vacate(user) end
  redis.call('ZADD', KEYS[5], score, user)
  redis.call('ZADD', KEYS[4], score, user)
  redis.call('HSET', KEYS[8], user, now_ms)
  waiting_score = score
end

-- 5. Admissions, in line order, while the admitted who have not bought stay under the bound;
-- with holds, no more than the free units.
local admitted, waits, me = 0, {}, false
if open and stock > 0 then
  local free = ceil((stock + held) * factor) - outstanding
  if hold then free = min(free, stock) end
  local until_ms = now_ms + tonumber(ARGV[4])
  local mark = hold and '+' or ''
  local rounds = 0
  -- Departed buyers popped take no unit: the next in line do (a few rounds at most a call).
  while free > 0 and rounds < 4 do
    rounds = rounds + 1
    -- Only places that are final: a later joiner of an arrival window still open may yet be
    -- placed before one of its buyers.
    local popped
    if width == 0 then
      popped = redis.call('ZPOPMIN', KEYS[5], min(free, BATCH))
    else
      local closed = '(' .. (1 + floor((now_ms - opened_ms) / width))
      popped = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', closed, 'WITHSCORES', 'LIMIT', 0, min(free, BATCH))
    end
    if #popped == 0 then break end
    local who_all = {}
    for i = 1, #popped, 2 do who_all[#who_all + 1] = popped[i] end
    if width > 0 then redis.call('ZREM', KEYS[5], unpack(who_all)) end
    local late, leaving, before = {}, {}, admitted
    local dues = redis.call('HMGET', KEYS[10], unpack(who_all))
    for i = 1, #who_all do
      local who = who_all[i]
      local _, _, b = parse_due(dues[i])
      if b > 0 and b <= now_b then
        late[#late + 1] = who -- departed: never admitted
      else
        if b > now_b then leaving[b] = (leaving[b] or 0) + 1 end
        redis.call('ZADD', KEYS[6], until_ms, who)
        -- Bound to its holder (reserve.lua compares it with the buyer's own grant), unguessable
        -- without the caller's nonce.
        redis.call('HSET', KEYS[7], who, string.sub(redis.sha1hex(ARGV[5] .. ':' .. who), 1, 32) .. mark)
        local joined = tonumber(redis.call('HGET', KEYS[8], who) or now_ms)
        redis.call('HDEL', KEYS[8], who)
        -- A pre-queue buyer waited from the opening, not from when they joined.
        waits[#waits + 1] = now_ms - max(joined, starts_ms)
        admitted = admitted + 1
        if who == user then
          me = true
          expires = until_ms
        end
      end
    end
    for b, n in pairs(leaving) do redis.call('HINCRBY', KEYS[11], b, -n) end
    if #late > 0 then departed(late) end
    free = free - (admitted - before)
    if #late == 0 then break end
  end
  outstanding = outstanding + admitted
  if admitted > 0 then
    redis.call('HINCRBY', KEYS[3], 'admitted', admitted)
    expiry = min(expiry, until_ms)
    redis.call('HSET', KEYS[3], 'factor', ARGV[3], 'expiry', expiry)
    if hold then
      stock = redis.call('DECRBY', KEYS[1], admitted)
      held = redis.call('HINCRBY', KEYS[3], 'held', admitted)
    end
  end
end

-- 6. The buyer's state. Before the buyer's due time the answer is the one it was given
-- (waiting, ahead of it nobody it can overtake), with the ms still to wait.
-- A place is final once nobody can be placed before it: the sale is open and its window closed
-- (score 1 + w + r: window w closed; a lottery score < 1: the draw is fixed).
local closed_windows = not open and -1 or width == 0 and math.huge or floor((now_ms - opened_ms) / width)
local early = now_ms < due
waiting_score = not me and waiting_score
-- A call by a waiting buyer keeps the place: the departure deadline moves on, by the multiple
-- of the longest interval told and never less than of poll_max (at an arrival window's end a
-- buyer is told a few ms: 3 x that would drop it while its next call is on the wire), plus the
-- grace (the room sees a call when it arrives: a server's backlog must not drop the buyers whose
-- one poll waits in it); its bucket's count moves with it. True when the bucket changed.
local function seen(poll)
  longest = max(longest, poll)
  local b = ceil((now_ms + departs * max(longest, high) + grace) / W)
  if b == bucket then return false end
  if bucket > now_b then redis.call('HINCRBY', KEYS[11], bucket, '-1') end
  redis.call('HINCRBY', KEYS[11], b, '1')
  bucket = b
  return true
end
if early and ARGV[2] ~= '1' then
  if waiting_score and seen(0) then
    redis.call('HSET', KEYS[10], user, string.format(place and '%d:%d:%d:%d' or '%d:%d:%d', due, longest, bucket, place))
  end
  return answer('early', -1, -1, '', 0, opened, admitted, #lapsed, waits, due - now_ms)
end
if expires then
  local score = redis.call('ZSCORE', KEYS[4], user)
  score = score and score + 0
  local position = score and open and (score < 1 or floor(score) <= closed_windows)
    and redis.call('ZRANK', KEYS[4], user) + 1 or -1
  if early then
    return answer('waiting', position, position > 0 and 0 or -1, '', 0, opened, admitted, #lapsed, waits, due - now_ms)
  end
  redis.call('HDEL', KEYS[10], user)
  local grant = redis.call('HGET', KEYS[7], user)
  return answer('admitted', position, -1, string.sub(grant, 1, 32), expires + 0, opened, admitted,
    #lapsed, waits, nil, string.sub(grant, 33) == '+')
end
if not waiting_score then
  local closed = ARGV[2] ~= '1' and redis.call('ZSCORE', KEYS[12], user)
  return answer(closed and 'closed' or 'none', -1, -1, '', 0, opened, admitted, #lapsed, waits)
end
local position, ahead, poll = -1, -1, due - now_ms
waiting_score = waiting_score + 0
if open and (waiting_score < 1 or floor(waiting_score) <= closed_windows) then
  -- A final position never changes: kept with the due time, asked of the line once.
  position, ahead = place or redis.call('ZRANK', KEYS[4], user) + 1, redis.call('ZRANK', KEYS[5], user)
end
if not early then
  -- In line, sooner nearer the front; before the opening, at the opening in drawn order, spread
  -- over as long as the poll budget takes to hear the whole pre-queue (at least poll_min): the
  -- lottery score is uniform, so the first drawn, admitted at the opening, ask first and hear of
  -- it within their admission, and a stampede drawn at the opening does not ask in one instant.
  local ceiling, spread, budget = high, low, ARGV[11] + 0
  if budget > 0 then
    in_line = redis.call('ZCARD', KEYS[5])
    spread = max(low, ceil(in_line * 1000 / budget))
    ceiling = max(high, spread)
  end
  if open then
    poll = min(max(max(ahead, 0) * ARGV[8], low), ceiling)
  else
    poll = min(max(draw_ms - now_ms, low), ceiling) + floor((waiting_score + 0) * spread)
  end
  due = now_ms + poll
end
seen(poll)
redis.call('HSET', KEYS[10], user,
  string.format(position > 0 and '%d:%d:%d:%d' or '%d:%d:%d', due, longest, bucket, position))
return answer('waiting', position, ahead, '', 0, opened, admitted, #lapsed, waits, poll)
