-- A replicated concurrency limit: the slots each replica may hold at once.
-- KEYS[1]: the leases (hash: replica -> "slots until short", until in Redis
-- ms, short 1 when its last renewal got less than it wanted).
-- ARGV[1]: this replica; ARGV[2]: the calls it has in flight; ARGV[3]: what
-- it may still hold under its last lease (kept reserved this round, since it
-- may have admitted up to it while this sync was on its way); ARGV[4]: the
-- slots it wants; ARGV[5]: max in flight; ARGV[6]: how long its reservation
-- stands without a new sync, ms (the lease's life plus the permits' time to
-- live: a replica that dies keeps its slots until its permits expire);
-- ARGV[7]: a deadline in Redis time, us (0: none); ARGV[8]: the lease's
-- life, ms (how long a replica that holds nothing is counted as wanting).
-- Returns {its lease, the slots the others hold}. A lease is never more
-- than the others leave free, even below what the replica has in flight
-- (after an outage, or a rule that changed, the replicas may together hold
-- more than the limit: each then admits nothing until the fleet is back
-- under it). While another replica is short of what it wants, a lease is
-- at most a fair share (the limit over the replicas holding or wanting
-- slots), so slots held by busy replicas move to a starved one as their
-- calls end. Its reservation is the larger of the lease and what it may
-- still hold.
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local DEADLINE = tonumber(ARGV[7])
if DEADLINE > 0 and now_us > DEADLINE then return { 'late' } end
local now = math.floor(now_us / 1000)
local me = ARGV[1]
local used, floor, want, max, hold, life =
  tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[8])
local others, active, starved = 0, 1, false
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if all[i] ~= me then
    local n, untl, short = string.match(all[i + 1], '(%d+) (%d+) ?(%d*)')
    n, untl = tonumber(n) or 0, tonumber(untl) or 0
    if untl <= now then
      redis.call('HDEL', KEYS[1], all[i])
    else
      others = others + n
      active = active + 1
      if short == '1' then starved = true end
    end
  end
end
local lease = math.max(0, math.min(want, max - others))
if starved then lease = math.min(lease, math.ceil(max / active)) end
local held = math.max(lease, floor, used)
local short = lease < want and 1 or 0
if held > 0 or short == 1 then
  local untl = now + (held > 0 and hold or life)
  redis.call('HSET', KEYS[1], me, held .. ' ' .. untl .. ' ' .. short)
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl < hold + 1000 then redis.call('PEXPIRE', KEYS[1], hold + 1000) end
else
  redis.call('HDEL', KEYS[1], me)
end
return { lease, others }
