-- An adaptive concurrency limit for the whole fleet (SPEC section 5).
-- KEYS[1]: a hash: the window being gathered (w_samples, w_sum, w_min,
-- w_drops, and p:<replica>, each replica's peak in flight), when it closes
-- (closes_at, Redis ms), the algorithm's state as the last replica to close
-- a window left it (state) with its version, and that window (last).
-- ARGV[1]: 'push' or 'publish'.
-- push: ARGV[2] this replica, ARGV[3] the window (ms), ARGV[4] the samples a
-- window needs, ARGV[5..9] this replica's window since its last push:
-- samples, latency sum (us), least latency (us, 0: none), peak in flight,
-- drops. Adds it to the fleet's. Once the fleet's window is over it goes
-- to this replica, to run the algorithm on and publish: returns
-- {1, version, state, samples, sum, min, peak, drops}; a window short of
-- samples is dropped. Otherwise returns {0, version, state, last}.
-- publish: ARGV[2] the version the new state was computed from, ARGV[3]
-- the state, ARGV[4] the window it came from. Stored only if no other
-- replica published since: returns {1, new version}, else {0, version}.
local key = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Anything here that is not what this script wrote (a corrupted key) is
-- dropped: the window starts over, and a bad state goes with its version,
-- so that the next replica to close a window starts from its own.
local function whole(f)
  local v = redis.call('HGET', key, f)
  if v == false then return 0 end
  local n = tonumber(v)
  if n == nil or n < 0 or n ~= math.floor(n) or n > 9007199254740991 then
    redis.call('HDEL', key, f)
    return nil
  end
  return n
end
local version = whole('version')
if version == nil then
  redis.call('HDEL', key, 'state', 'last')
  version = 0
end
for _, f in ipairs({ 'w_samples', 'w_sum', 'w_drops', 'w_min', 'closes_at' }) do whole(f) end
if ARGV[1] == 'publish' then
  if tonumber(ARGV[2]) ~= version then return { 0, tostring(version) } end
  version = version + 1
  redis.call('HSET', key, 'state', ARGV[3], 'version', version, 'last', ARGV[4])
  return { 1, tostring(version) }
end
local me, window, need = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local samples, sum, least, peak, drops =
  tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
redis.call('HINCRBY', key, 'w_samples', samples)
redis.call('HINCRBY', key, 'w_sum', sum)
redis.call('HINCRBY', key, 'w_drops', drops)
local m = tonumber(redis.call('HGET', key, 'w_min') or '0') or 0
if least > 0 and (m == 0 or least < m) then redis.call('HSET', key, 'w_min', least) end
local p = whole('p:' .. me) or 0
if peak > p then redis.call('HSET', key, 'p:' .. me, peak) end
redis.call('PEXPIRE', key, math.max(window * 20, 60000))
local state = redis.call('HGET', key, 'state') or ''
local closes = tonumber(redis.call('HGET', key, 'closes_at') or '')
if not closes or closes > now + window then
  -- New, or set by a clock that has since gone back: from now.
  redis.call('HSET', key, 'closes_at', now + window)
  closes = now + window
end
if now < closes then
  return { 0, tostring(version), state, redis.call('HGET', key, 'last') or '' }
end
local all = redis.call('HGETALL', key)
local got, peaks = {}, 0
for i = 1, #all, 2 do
  local f = all[i]
  if string.sub(f, 1, 2) == 'p:' then
    peaks = peaks + (tonumber(all[i + 1]) or 0)
    redis.call('HDEL', key, f)
  elseif string.sub(f, 1, 2) == 'w_' then
    got[f] = all[i + 1]
    redis.call('HDEL', key, f)
  end
end
redis.call('HSET', key, 'closes_at', now + window)
local n, d = tonumber(got.w_samples or '0'), tonumber(got.w_drops or '0')
if n + d < need then
  return { 0, tostring(version), state, redis.call('HGET', key, 'last') or '' }
end
return { 1, tostring(version), state, tostring(n), got.w_sum or '0', got.w_min or '0', tostring(peaks), tostring(d) }
