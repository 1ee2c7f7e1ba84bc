-- replicated: push one bucket's consumption since this replica's last sync
-- (taken even beyond the limit: it already happened), then lease this
-- replica a share of what is left until its next sync.
--
-- Leases are reservations, not consumption: each replica's lease is replaced
-- at its every sync and expires if the replica stops syncing, and no lease
-- is granted from what other replicas hold. So the replicas together never
-- hold more than is available; what they admit beyond it comes only from
-- their local refill between syncs.
--
-- KEYS[1]: the bucket. ARGV[1]: units to push; ARGV[2..6]: the limit's five
-- numbers; ARGV[7]: this replica; ARGV[8]: its share (1 / live replicas);
-- ARGV[9]: the lease's time to live, us; ARGV[10]: the least lease wanted
-- (a request larger than the usual share), granted only from what is free.
-- Returns {lease (a fraction, as text), window start us, prev, cur, available (text)}.
local now = now_us()
local delta = tonumber(ARGV[1])
local alg, p = limit_at(1)
local replica, share, ttl, want = ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local leases = KEYS[1] .. ':l'
local s = A[alg].status(KEYS[1], p, now, 0)
if delta > 0 then
  A[alg].take(KEYS[1], p, now, delta, s)
  s = A[alg].status(KEYS[1], p, now, 0)
end
local window = int(s.start or 0)
local held = 0
local all = redis.call('HGETALL', leases)
for i = 1, #all, 2 do
  local amount, expiry, w = string.match(all[i + 1], '(%S+) (%S+) (%S+)')
  if tonumber(expiry) <= now or w ~= window then
    redis.call('HDEL', leases, all[i])
  elseif all[i] ~= replica then
    held = held + tonumber(amount)
  end
end
local avail = math.max(s.avail, 0)
local lease = math.min(math.max(avail - held, 0), math.max(math.ceil(avail * share), want))
redis.call('HSET', leases, replica, tostring(lease) .. ' ' .. int(now + ttl) .. ' ' .. window)
expire(leases, ttl)
return { tostring(lease), s.start or 0, s.prev or 0, s.cur or 0, tostring(avail) }
