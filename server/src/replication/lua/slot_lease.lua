-- A replicated concurrency limit: the slots each replica may hold at once.
-- KEYS[1]: the leases (hash: replica -> "slots until", until in Redis ms).
-- ARGV[1]: this replica; ARGV[2]: the calls it has in flight; ARGV[3]: what
-- it may still hold under its last lease (kept reserved this round, since it
-- may have admitted up to it while this sync was on its way); ARGV[4]: the
-- slots it wants; ARGV[5]: max in flight; ARGV[6]: how long its reservation
-- stands without a new sync, ms (the lease's life plus the permits' time to
-- live: a replica that dies keeps its slots until its permits expire);
-- ARGV[7]: a deadline in Redis time, us (0: none).
-- Returns {its lease, the slots the others hold}: never more than the others
-- leave free, even below what it has in flight (after an outage, or a rule
-- that changed, the replicas may together hold more than the limit: each
-- then admits nothing until the fleet is back under it). Its reservation is
-- the larger of the lease and what it may still hold.
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local DEADLINE = tonumber(ARGV[7])
if DEADLINE > 0 and now_us > DEADLINE then return { 'late' } end
local now = math.floor(now_us / 1000)
local me = ARGV[1]
local used, floor, want, max, hold =
  tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local others = 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if all[i] ~= me then
    local n, untl = string.match(all[i + 1], '(%d+) (%d+)')
    n, untl = tonumber(n) or 0, tonumber(untl) or 0
    if untl <= now then redis.call('HDEL', KEYS[1], all[i]) else others = others + n end
  end
end
local lease = math.max(0, math.min(want, max - others))
local held = math.max(lease, floor, used)
if held > 0 then
  redis.call('HSET', KEYS[1], me, held .. ' ' .. (now + hold))
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl < hold + 1000 then redis.call('PEXPIRE', KEYS[1], hold + 1000) end
else
  redis.call('HDEL', KEYS[1], me)
end
return { lease, others }
