-- Floodgate's limiter algorithms, run inside Redis.
--
-- Time is Redis's own clock (TIME, microseconds), so replicas with skewed
-- clocks still agree. Every limit is passed as five numbers in ARGV: its
-- algorithm's code, then p1 to p4. The codes are CODE.<name>, a table the
-- server prepends to this file from its own list (replication/scripts.rs):
-- token_bucket    p1 capacity, p2 refill per second
-- gcra            p1 rate per second, p2 burst
-- leaky_bucket    p1 capacity, p2 leak per second, p3 max wait us (-1: none), p4 1 shape / 0 police
-- fixed_window    p1 limit, p2 window us
-- sliding_log     p1 limit, p2 window us
-- sliding_window  p1 limit, p2 window us
-- calendar        p1 limit, p2 window start us, p3 its end (the next one's
--                 start), p4 the next one's end: a fixed window whose
--                 boundaries the replica computed (a day, week, month or
--                 year in a time zone); Redis's clock picks one of the two.
-- warm_up         p1 rate per second, p2 warm-up period ms, p3 cold factor
--                 (police only: Sentinel's WarmUpController, see limiter/warm_up.rs)
-- balance         p1 the most it holds
-- Keys share the resource's hash tag, so every key a script touches is in the
-- slot of its KEYS. Numbers are doubles: exact for whole values below 2^53.

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- A whole number as text: Lua's own concatenation would write 1.7e+15.
local function int(n)
  return string.format('%.0f', n)
end

local function expire(key, us)
  redis.call('PEXPIRE', key, math.ceil(math.max(us, 0) / 1000) + 1000)
end

-- Each algorithm: status(key, p, now, cost) -> st with
--   avail (units takeable now), ok (cost admitted), reset (us until full
--   again after taking cost if ok), retry (us until cost fits, when not ok),
--   wait (shaping), and the extra numbers replicas adopt (start, prev, cur);
-- take(key, p, now, cost, st) consumes cost, even beyond the limit (a
-- replica's consumption is pushed whether or not it still fits); give(key,
-- p, now, units, st, at) gives back units taken at `at` (Redis time, us; 0
-- when unknown: the current window), never beyond a full bucket or below an
-- empty window, and only while the window of `at` is the current one (a
-- later window never took them); a sliding log gives back only the entries
-- of the instant `at`, never another caller's;
-- restored(p, known, at, now), what a bucket of which a replica knew `known`
-- available at `at` has available now (nil: unknown, leave it), for a Redis
-- that lost its data; lifetime(p, now), how long (us) a figure of the bucket
-- from now can matter to `restored`: until a rate limit would be full again
-- from empty, or the window ends.
local A = {}

-- Rate limits refill since `at`; windows keep `known` only while the window
-- of `at` is still the current one.
local function refilled(cap, rate)
  return function(p, known, at, now) return math.min(p[cap], known + math.max(0, now - at) * p[rate] / 1e6) end
end
local function full_after(cap, rate)
  return function(p, now) return p[cap] / p[rate] * 1e6 end
end
local function windowed(p, known, at, now)
  if math.floor(at / p[2]) == math.floor(now / p[2]) then return known end
  return nil
end
local function one_window(p, now) return p[2] end

A[CODE.token_bucket] = {
  restored = refilled(1, 2),
  lifetime = full_after(1, 2),
  status = function(key, p, now, cost)
    local v = redis.call('HMGET', key, 't', 'u')
    local cap, rate = p[1], p[2]
    local tokens = cap
    if v[1] then tokens = math.min(cap, tonumber(v[1]) + math.max(0, now - tonumber(v[2])) * rate / 1e6) end
    local ok = tokens >= cost
    local left = ok and tokens - cost or tokens
    return { avail = tokens, ok = ok, reset = (cap - left) / rate * 1e6,
             retry = ok and 0 or (cost - tokens) / rate * 1e6, wait = 0 }
  end,
  take = function(key, p, now, cost, st)
    local left = st.avail - cost
    redis.call('HSET', key, 't', left, 'u', now)
    expire(key, (p[1] - left) / p[2] * 1e6)
  end,
  give = function(key, p, now, units, st, at)
    local left = math.min(p[1], st.avail + units)
    redis.call('HSET', key, 't', left, 'u', now)
    expire(key, (p[1] - left) / p[2] * 1e6)
  end,
}

-- GCRA, as limiter/gcra.rs decides it: the emission interval is 1/rate
-- rounded up to a whole nanosecond (so it never admits more than the rate),
-- and the TAT is kept to the nanosecond. A double cannot hold a Unix time in
-- us with a fraction of a us (its step there is 0.25 us), so the TAT is
-- stored as text, '<us>.<ns>', and computed in ns from now (exact).
local function gcra_t(p) return math.ceil(1e12 / math.floor(p[1] * 1000 + 0.5)) end
local function gcra_tat(key, now)
  local v = redis.call('GET', key)
  if not v then return 0 end
  local us, ns = string.match(v, '^(%d+)%.(%d%d%d)$')
  if us then return math.max(0, (tonumber(us) - now) * 1000 + tonumber(ns)) end
  -- A TAT stored by an older version: us, as a number.
  return math.max(0, (tonumber(v) - now) * 1000)
end
local function gcra_set(key, now, ns)
  local us = math.floor(ns / 1000)
  redis.call('SET', key, int(now + us) .. '.' .. string.format('%03d', ns - us * 1000))
  expire(key, ns / 1000)
end

A[CODE.gcra] = {
  restored = refilled(2, 1),
  lifetime = full_after(2, 1),
  status = function(key, p, now, cost)
    -- In ns from now: base is the TAT (never before now), horizon now + burst.
    local t = gcra_t(p)
    local base = gcra_tat(key, now)
    local horizon = p[2] * t
    local new_tat = base + cost * t
    local ok = new_tat <= horizon
    return { avail = (horizon - base) / t, ok = ok, base = base, reset = (ok and new_tat or base) / 1000,
             retry = ok and 0 or (new_tat - horizon) / 1000, wait = 0 }
  end,
  take = function(key, p, now, cost, st)
    gcra_set(key, now, st.base + cost * gcra_t(p))
  end,
  give = function(key, p, now, units, st, at)
    gcra_set(key, now, math.max(0, st.base - units * gcra_t(p)))
  end,
}

A[CODE.leaky_bucket] = {
  restored = refilled(1, 2),
  lifetime = full_after(1, 2),
  status = function(key, p, now, cost)
    local cap, rate, max_wait, shape = p[1], p[2], p[3], p[4] == 1
    local drain = math.max(tonumber(redis.call('GET', key) or now), now)
    local level = (drain - now) * rate / 1e6
    local wait = shape and (drain - now) or 0
    local over = math.max(0, level + cost - cap)
    local late = (shape and max_wait >= 0) and math.max(0, wait - max_wait) or 0
    local ok = over == 0 and late == 0
    local after = ok and level + cost or level
    return { avail = cap - level, ok = ok, drain = drain, reset = after / rate * 1e6,
             retry = ok and 0 or math.max(over / rate * 1e6, late), wait = ok and wait or 0 }
  end,
  take = function(key, p, now, cost, st)
    local drain = st.drain + cost / p[2] * 1e6
    redis.call('SET', key, drain)
    expire(key, drain - now)
  end,
  give = function(key, p, now, units, st, at)
    local drain = math.max(now, st.drain - units / p[2] * 1e6)
    redis.call('SET', key, drain)
    expire(key, drain - now)
  end,
}

A[CODE.fixed_window] = {
  restored = windowed,
  lifetime = one_window,
  status = function(key, p, now, cost)
    local limit, w = p[1], p[2]
    local start = now - now % w
    local used = tonumber(redis.call('GET', key .. ':' .. int(start)) or 0)
    local ok = used + cost <= limit
    local after = ok and used + cost or used
    local to_end = start + w - now
    return { avail = limit - used, ok = ok, start = start, prev = 0, cur = used,
             reset = after > 0 and to_end or 0, retry = ok and 0 or to_end, wait = 0 }
  end,
  take = function(key, p, now, cost, st)
    local k = key .. ':' .. int(st.start)
    redis.call('INCRBY', k, cost)
    expire(k, p[2])
  end,
  give = function(key, p, now, units, st, at)
    if at > 0 and at - at % p[2] ~= st.start then return end
    local k = key .. ':' .. int(st.start)
    if redis.call('DECRBY', k, units) < 0 then redis.call('SET', k, 0) end
    expire(k, p[2])
  end,
}

A[CODE.calendar] = {
  -- Known only while the window of `at` (p2 to p3) is still the current one.
  restored = function(p, known, at, now)
    if at >= p[2] and at < p[3] and now < p[3] then return known end
    return nil
  end,
  lifetime = function(p, now) return p[4] - now end,
  status = function(key, p, now, cost)
    local limit, start, e = p[1], p[2], p[3]
    if now >= e then start, e = p[3], p[4] end
    local used = tonumber(redis.call('GET', key .. ':' .. int(start)) or 0)
    local ok = used + cost <= limit
    local after = ok and used + cost or used
    local to_end = e - math.max(now, start)
    return { avail = limit - used, ok = ok, start = start, e = e, prev = 0, cur = used,
             reset = after > 0 and to_end or 0, retry = ok and 0 or to_end, wait = 0 }
  end,
  take = function(key, p, now, cost, st)
    local k = key .. ':' .. int(st.start)
    redis.call('INCRBY', k, cost)
    expire(k, st.e - now)
  end,
  give = function(key, p, now, units, st, at)
    if at > 0 and (at < st.start or at >= st.e) then return end
    local k = key .. ':' .. int(st.start)
    if redis.call('DECRBY', k, units) < 0 then redis.call('SET', k, 0) end
    expire(k, st.e - now)
  end,
}

A[CODE.sliding_log] = {
  restored = windowed,
  lifetime = one_window,
  status = function(key, p, now, cost)
    local limit, w = p[1], p[2]
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - w)
    local used = redis.call('ZCARD', key)
    local ok = used + cost <= limit
    local reset, retry = 0, 0
    if not ok then
      local nth = redis.call('ZRANGE', key, used + cost - limit - 1, used + cost - limit - 1, 'WITHSCORES')
      retry = tonumber(nth[2]) + w - now
    end
    if ok and cost > 0 then
      reset = w
    elseif used > 0 then
      local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      reset = tonumber(newest[2]) + w - now
    end
    return { avail = limit - used, ok = ok, used = used, reset = reset, retry = retry, wait = 0 }
  end,
  take = function(key, p, now, cost, st)
    -- At most `limit` entries: those past it are all of this instant, so
    -- the log is full until they go whether there are more or not, and a
    -- charge of millions costs Redis what one of the limit does. Added 500
    -- to a ZADD. Members are unique: each is numbered after the highest
    -- number of this instant (a give-back may have removed lower ones, so
    -- the count alone could name a member that is still there). The number
    -- is written with ten digits, so the members of one instant sort by it.
    local last = redis.call('ZREVRANGEBYSCORE', key, now, now, 'LIMIT', 0, 1)[1]
    local base = last and tonumber(string.match(last, ':(%d+)$')) or 0
    local n = math.min(cost, p[1])
    local i = 1
    while i <= n do
      local args = {}
      for j = i, math.min(n, i + 499) do
        args[#args + 1] = now
        args[#args + 1] = int(now) .. ':' .. string.format('%010d', base + j)
      end
      redis.call('ZADD', key, unpack(args))
      i = i + 500
    end
    expire(key, p[2])
  end,
  give = function(key, p, now, units, st, at)
    if at <= 0 then return end
    local left = units
    while left > 0 do
      local members = redis.call('ZRANGEBYSCORE', key, at, at, 'LIMIT', 0, math.min(left, 1000))
      if #members == 0 then break end
      redis.call('ZREM', key, unpack(members))
      left = left - #members
    end
  end,
}

A[CODE.sliding_window] = {
  restored = windowed,
  -- The window before still counts.
  lifetime = function(p, now) return 2 * p[2] end,
  status = function(key, p, now, cost)
    local limit, w = p[1], p[2]
    local start = now - now % w
    local cur = tonumber(redis.call('GET', key .. ':' .. int(start)) or 0)
    local prev = tonumber(redis.call('GET', key .. ':' .. int(start - w)) or 0)
    local e = now - start
    local est = prev * (w - e) / w + cur
    local ok = est + cost <= limit
    local retry = 0
    if not ok then
      local room = limit - cur - cost
      local at = w
      if room >= 0 and prev > 0 then at = w - math.min(w, math.floor(room * w / prev)) end
      if at < w then
        retry = math.max(0, at - e)
      else
        local keep = w
        if cur > 0 then keep = math.min(w, math.floor((limit - cost) * w / cur)) end
        retry = (w - e) + (w - keep)
      end
    end
    local cur_after = ok and cur + cost or cur
    local reset = 0
    if cur_after > 0 then reset = (w - e) + w elseif prev > 0 then reset = w - e end
    return { avail = limit - est, ok = ok, start = start, prev = prev, cur = cur, reset = reset, retry = retry, wait = 0 }
  end,
  take = function(key, p, now, cost, st)
    local k = key .. ':' .. int(st.start)
    redis.call('INCRBY', k, cost)
    expire(k, 2 * p[2])
  end,
  give = function(key, p, now, units, st, at)
    if at > 0 and at - at % p[2] ~= st.start then return end
    local k = key .. ':' .. int(st.start)
    if redis.call('DECRBY', k, units) < 0 then redis.call('SET', k, 0) end
    expire(k, 2 * p[2])
  end,
}

-- Sentinel's warm-up, as limiter/warm_up.rs decides it (times in ms): a store
-- of tokens between a warning line and a maximum, synced once per second
-- (cooling, then less the last second's admissions), and admissions counted
-- per 500 ms and per second. Through Redis the store syncs when something
-- is taken (a replica's decision alone syncs it on every call).
local function warm_lines(p)
  local c, secs, f = p[1], p[2] / 1000, p[3]
  local w = math.floor(math.floor(secs * c) / (f - 1))
  local m = w + math.floor(2 * secs * c / (1 + f))
  return c, f, w, m, (f - 1) / c / (m - w)
end

local function warm_state(key, p, now)
  local c, f, w, m, slope = warm_lines(p)
  local t = math.floor(now / 1000)
  local v = redis.call('HMGET', key, 'S', 'L', 'h', 'hc', 'ph', 's', 'sc', 'ps')
  local st = { S = tonumber(v[1] or 0), L = tonumber(v[2] or 0), h = tonumber(v[3] or 0), hc = tonumber(v[4] or 0),
               ph = tonumber(v[5] or 0), s = tonumber(v[6] or 0), sc = tonumber(v[7] or 0), ps = tonumber(v[8] or 0) }
  local dh, ds = math.floor(t / 500) - st.h, math.floor(t / 1000) - st.s
  local pass = (dh == 0 and st.hc + st.ph) or (dh == 1 and st.hc) or 0
  local q = (ds == 0 and st.ps) or (ds == 1 and st.sc) or 0
  local second = t - t % 1000
  if second > st.L then
    local cooled = st.S
    if st.S < w or (st.S > w and q < math.floor(math.floor(c) / f)) then
      cooled = math.floor(st.S + (second - st.L) * c / 1000)
    end
    st.S, st.L = math.max(0, math.min(cooled, m) - q), second
  end
  local rate = c
  -- Sentinel's Math.nextUp, near enough: at least the next double up.
  if st.S >= w then rate = (1 / ((st.S - w) * slope + 1 / c)) * (1 + 2.3e-16) end
  st.t, st.pass, st.rate, st.m = t, pass, rate, m
  return st
end

A[CODE.warm_up] = {
  restored = function(p, known, at, now) return nil end,
  -- Never restored: no figure of it matters.
  lifetime = function(p, now) return 0 end,
  status = function(key, p, now, cost)
    local st = warm_state(key, p, now)
    local ok = st.pass + cost <= st.rate
    st.avail, st.ok, st.wait = math.floor(st.rate) - st.pass, ok, 0
    st.retry = ok and 0 or (500 - st.t % 500) * 1000
    st.reset = (st.m / p[1] + 2) * 1e6
    return st
  end,
  take = function(key, p, now, cost, st)
    local h, s = math.floor(st.t / 500), math.floor(st.t / 1000)
    if h == st.h then st.hc = st.hc + cost elseif h == st.h + 1 then st.ph, st.hc = st.hc, cost else st.ph, st.hc = 0, cost end
    if s == st.s then st.sc = st.sc + cost elseif s == st.s + 1 then st.ps, st.sc = st.sc, cost else st.ps, st.sc = 0, cost end
    redis.call('HSET', key, 'S', st.S, 'L', st.L, 'h', h, 'hc', st.hc, 'ph', st.ph, 's', s, 'sc', st.sc, 'ps', st.ps)
    expire(key, st.reset)
  end,
  give = function(key, p, now, units, st, at)
    local t = math.floor(at / 1000)
    if at > 0 and math.floor(t / 500) == st.h and math.floor(st.t / 500) == st.h then
      redis.call('HSET', key, 'hc', math.max(0, st.hc - units))
    end
    if at > 0 and math.floor(t / 1000) == st.s and math.floor(st.t / 1000) == st.s then
      redis.call('HSET', key, 'sc', math.max(0, st.sc - units))
    end
  end,
}

-- A balance, as limiter/balance.rs decides it: units topped up by an
-- operator (a give), which never come back with time. It starts at 0, may
-- go below 0 by a charge (a debt the next top-up pays first), and is kept
-- without expiry: it is money. Its reset is a hundred years while it holds
-- anything, and a denial retries in an hour (see KEPT and RETRY there).
local BALANCE_KEPT = 100 * 365 * 86400 * 1e6
local BALANCE_RETRY = 3600 * 1e6
A[CODE.balance] = {
  restored = function(p, known, at, now) return known end,
  lifetime = function(p, now) return BALANCE_KEPT end,
  status = function(key, p, now, cost)
    local units = tonumber(redis.call('GET', key) or 0)
    local ok = units >= cost
    local after = ok and units - cost or units
    return { avail = units, ok = ok, reset = after ~= 0 and BALANCE_KEPT or 0,
             retry = ok and 0 or BALANCE_RETRY, wait = 0 }
  end,
  take = function(key, p, now, cost, st)
    redis.call('SET', key, int(st.avail - cost))
  end,
  give = function(key, p, now, units, st, at)
    redis.call('SET', key, int(math.min(p[1], st.avail + units)))
  end,
}

-- A resource's marker holds a token: Redis's time when the marker was set
-- (by restore.lua, the first time a replica touches the resource, or after
-- Redis lost it), then a colon and the run id of the Redis process that set
-- it. The marker is kept for a week from the last sync. Every other script
-- is given the token its replica learned, and does nothing unless it is the
-- one in Redis and was set by this very Redis process. A replica that does
-- not know the token yet, one whose token is gone (Redis lost its data) or
-- replaced (lost, and another replica has touched the resource since), and
-- one whose token was set by another process restores what it knows first
-- and learns the token then. So every replica that knew something of a lost
-- resource puts it back, not only the first to notice.
--
-- The run id matters because Redis can go back in time without losing the
-- marker: a restart from an older dump file, or a failover to a replica that
-- had not received the last writes, brings back the marker together with
-- counts older than what the replicas know. Redis draws a new run id every
-- time its process starts, and a promoted replica has its own, so a marker
-- set before such an event never matches the Redis that answers after it.
-- Asked once per script run: INFO formats a page of text, and a script may
-- check many markers.
local run_id
local function identity()
  if not run_id then run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') end
  return run_id
end
local MARKER_TTL = 604800
-- How long Redis remembers what a replica last pushed to a bucket (s): longer
-- than most outages a replica's unanswered push waits out, short enough that
-- buckets of many keys do not pile up (one small hash per active bucket).
local PUSHED_TTL = 3600
local function marked(key, known)
  if known == '' or redis.call('GET', key) ~= known then return false end
  return string.sub(known, -40) == identity()
end
-- When a strict bucket last changed (Redis time, us), kept beside it as
-- `key:w` with the marker's token of that change, by every script that
-- changes it, for as long as the algorithm's `lifetime` says. After Redis
-- went back to an older copy, this dates the bucket's figure, so that a
-- restore can tell whether a replica's last answer given under the same
-- token is newer (and so the true state) or not (see restore.lua).
local function changed(key, now, alg, p, token)
  local us = math.min(A[alg].lifetime(p, now), MARKER_TTL * 1e6)
  redis.call('SET', key .. ':w', int(now) .. ' ' .. token, 'PX', math.ceil(math.max(us, 0) / 1000) + 1000)
end
-- When the bucket's figure in Redis was last changed (us), and the marker
-- token of that change; nil when there is no record.
local function written(key)
  local v = redis.call('GET', key .. ':w')
  if not v then return nil, nil end
  local at, by = string.match(v, '^(%d+) (.+)$')
  if not at then return nil, nil end
  return tonumber(at), by
end
-- A new token for a marker set now by this Redis process.
local function new_token(now)
  return int(now) .. ':' .. identity()
end
