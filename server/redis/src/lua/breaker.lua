-- Floodgate's circuit breakers, shared through Redis.
--
-- KEYS[1]: the breaker (hash), KEYS[2]: its time window (hash: second -> "calls failures slow").
-- ARGV[1..11]: failure rate threshold, slow-call rate threshold, minimum calls,
-- window kind (1 count, 2 time, 3 tumbling), window size (calls, seconds or
-- milliseconds), wait in open: initial us, multiplier, max us, half-open calls,
-- max wait in half-open us, failure count threshold (0: none).
-- ARGV[12]: a deadline in Redis time, us (0: none): a script that runs after
-- it changes nothing and returns {'late'}, so a probe asked for, or an outcome
-- sent, that the replica gave up on is never applied later (an outcome is
-- sent again; a probe a replica did not wait for is never counted as out).
-- States use the proto's numbers: 1 CLOSED, 2 OPEN, 3 HALF_OPEN, 4 FORCED_OPEN,
-- 5 DISABLED, 6 METRICS_ONLY. Every transition bumps the generation g.
-- Each script returns {result, state, generation, open until us, consecutive openings, now us, changed}.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local DEADLINE = tonumber(ARGV[12])
if DEADLINE > 0 and now > DEADLINE then return { 'late' } end
local cfg = {}
for i = 1, 11 do cfg[i] = tonumber(ARGV[i]) end
local FAIL_T, SLOW_T, MIN, KIND, SIZE, W0, MULT, WMAX, PROBES, HALF_MAX, COUNT_T = unpack(cfg)

local F = { 's', 'g', 'ou', 'c', 'hs', 'pi', 'pr', 'pf', 'ps', 'wc', 'wf', 'ws', 'wt' }
local b = {}
local raw = redis.call('HMGET', KEYS[1], unpack(F))
for i, f in ipairs(F) do b[f] = tonumber(raw[i]) or 0 end
if b.s == 0 then b.s, b.g = 1, 1 end
local changed = 0

-- A tumbling window: emptied when now is past its interval (of SIZE ms since the epoch).
local function roll()
  local start = math.floor(now / 1000 / SIZE) * SIZE
  if start > b.wt then b.wc, b.wf, b.ws, b.wt = 0, 0, 0, start end
end

local function window()
  if KIND == 1 then return b.wc, b.wf, b.ws end
  if KIND == 3 then
    roll()
    return b.wc, b.wf, b.ws
  end
  local c, f, s = 0, 0, 0
  local fields = redis.call('HGETALL', KEYS[2])
  local sec = math.floor(now / 1e6)
  for i = 1, #fields, 2 do
    local at = tonumber(fields[i])
    if at + SIZE <= sec then
      redis.call('HDEL', KEYS[2], fields[i])
    else
      local a, bb, cc = string.match(fields[i + 1], '(%d+) (%d+) (%d+)')
      c, f, s = c + tonumber(a), f + tonumber(bb), s + tonumber(cc)
    end
  end
  return c, f, s
end

local function add(dc, df, ds)
  if dc <= 0 then return end
  if KIND == 3 then
    roll()
    b.wc, b.wf, b.ws = b.wc + dc, b.wf + df, b.ws + ds
  elseif KIND == 1 then
    b.wc, b.wf, b.ws = b.wc + dc, b.wf + df, b.ws + ds
    if b.wc > SIZE then
      -- An approximation of "the last N calls" across replicas: scale down.
      local k = SIZE / b.wc
      b.wc, b.wf, b.ws = SIZE, b.wf * k, b.ws * k
    end
  else
    local sec = tostring(math.floor(now / 1e6))
    local old = redis.call('HGET', KEYS[2], sec)
    local c, f, s = 0, 0, 0
    if old then
      local a, bb, cc = string.match(old, '(%d+) (%d+) (%d+)')
      c, f, s = tonumber(a), tonumber(bb), tonumber(cc)
    end
    redis.call('HSET', KEYS[2], sec, (c + dc) .. ' ' .. (f + df) .. ' ' .. (s + ds))
    redis.call('EXPIRE', KEYS[2], SIZE + 5)
  end
end

local function clear_window()
  b.wc, b.wf, b.ws = 0, 0, 0
  redis.call('DEL', KEYS[2])
end

local function transition(to)
  b.s, b.g = to, b.g + 1
  b.pi, b.pr, b.pf, b.ps = 0, 0, 0, 0
  changed = 1
end

local function open()
  b.c = b.c + 1
  b.ou = now + math.min(W0 * MULT ^ (b.c - 1), WMAX)
  transition(2)
end

local function close()
  b.c = 0
  clear_window()
  transition(1)
end

-- COUNT is the failure count that trips (0: none).
local function trips_at(c, f, s, count)
  return c > 0 and (f / c >= FAIL_T or s / c >= SLOW_T or (count > 0 and f >= count))
end

local function trips(c, f, s)
  return trips_at(c, f, s, COUNT_T)
end

-- HALF_OPEN's probes: the failure count capped at the probes handed out.
local function probes_trip(c, f, s)
  return trips_at(c, f, s, math.min(COUNT_T, PROBES))
end

local function expire_half_open()
  if b.s == 3 and now >= b.hs + HALF_MAX then open() end
end

local function save(result)
  local args = {}
  for _, f in ipairs(F) do
    table.insert(args, f)
    table.insert(args, b[f])
  end
  redis.call('HSET', KEYS[1], unpack(args))
  return { result, b.s, b.g, b.ou, b.c, now, changed }
end
