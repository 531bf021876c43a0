-- Which overdue reservations realignment should publish again now: each at most once per
-- back-off period (the period doubles with every re-publish, up to a cap), however many passes
-- run and however many processes run them.
-- KEYS[1] journal   KEYS[2] re-publish times (request id -> 'ms|count')
-- ARGV[1] first back-off (ms)   ARGV[2] longest back-off (ms)   ARGV[3..] request ids
-- Returns the request ids that are due (still in the journal), now marked re-published.
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local first, cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local due = {}
for i = 3, #ARGV do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
    local last, count = 0, 0
    local mark = redis.call('HGET', KEYS[2], ARGV[i])
    if mark then
      local at, times = string.match(mark, '^(%d+)|(%d+)$')
      last, count = tonumber(at), tonumber(times)
    end
    if now_ms - last >= math.min(first * 2 ^ count, cap) then
      redis.call('HSET', KEYS[2], ARGV[i], now_ms .. '|' .. (count + 1))
      due[#due + 1] = ARGV[i]
    end
  end
end
return due
