-- replicated: for each bucket, push this replica's consumption since its last
-- sync (taken even beyond the limit: it already happened), then lease this
-- replica a share of what is left until its next sync.
--
-- Leases are reservations, not consumption: each replica's lease is replaced
-- at its every sync and expires if the replica stops syncing, and no lease is
-- granted from what other replicas hold. What Redis keeps reserved for a
-- replica is the larger of its new lease and what it still held when the sync
-- went out (it may admit that much before the reply reaches it). So the
-- replicas together never hold more than is available; what they admit beyond
-- it comes only from their local refill between syncs.
--
-- KEYS[1]: the resource's marker (see take.lua); then the buckets (one
-- resource's, so one slot). ARGV[1]: this replica; ARGV[2]: its share
-- (1 / live replicas); ARGV[3]: a lease's time to live, us; ARGV[4]: the
-- least lease wanted (a request larger than the usual share), granted only
-- from what is free; ARGV[5]: a deadline in Redis time, us (0: none), after
-- which nothing is pushed ({'late'}: the replica pushes it again next time);
-- ARGV[6]: the marker's token as this replica knows it ({'lost'} unless it is
-- the one in Redis: restore first). Then per bucket nine numbers: units to
-- push, what the replica still held as it sent this, its count of what it
-- took (an epoch, and the net total taken in it), and the limit's five
-- numbers.
--
-- Pushes are idempotent: Redis keeps per replica the total it last applied
-- (`key:p`), and of the same epoch applies only what the total adds to it. A
-- sync that ran but whose answer never reached the replica (a timeout on a
-- busy machine) is pushed again with the next, and its units count once.
-- Without a record (the first push of an epoch, or Redis lost it) the units
-- to push are what the replica says it has not pushed.
-- Returns per bucket {lease (text), window start us, prev, cur, available
-- (text; negative while a debt is being paid), sequence}: the sequence
-- increases with every reply to this replica for this bucket, so that it
-- adopts none over a newer one.
local now = now_us()
local replica, share, ttl, want = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local deadline = tonumber(ARGV[5])
if deadline > 0 and now > deadline then return { 'late' } end
if not marked(KEYS[1], ARGV[6]) then return { 'lost' } end
redis.call('EXPIRE', KEYS[1], MARKER_TTL)
local out = {}
for i = 2, #KEYS do
  local key, b = KEYS[i], 6 + (i - 2) * 9
  local delta, hold = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local epoch, total = ARGV[b + 3], tonumber(ARGV[b + 4])
  local alg = tonumber(ARGV[b + 5])
  local p = { tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7]), tonumber(ARGV[b + 8]), tonumber(ARGV[b + 9]) }
  local pushed = key .. ':p'
  local last = redis.call('HGET', pushed, replica)
  if last then
    local e, t = string.match(last, '(%S+) (%S+)')
    if e == epoch then delta = total - tonumber(t) end
  end
  redis.call('HSET', pushed, replica, epoch .. ' ' .. int(total))
  redis.call('EXPIRE', pushed, PUSHED_TTL)
  local leases = key .. ':l'
  local s = A[alg].status(key, p, now, 0)
  if delta > 0 then
    A[alg].take(key, p, now, delta, s)
    -- Every algorithm has exactly `delta` less to give after taking it.
    s.avail = s.avail - delta
    if s.cur then s.cur = s.cur + delta end
  elseif delta < 0 then
    -- Given back (an estimate settled lower): as far as the state allows.
    A[alg].give(key, p, now, -delta, s, 0)
    s = A[alg].status(key, p, now, 0)
  end
  local window = int(s.start or 0)
  -- held: what the other replicas hold; mine: what was reserved for this
  -- one (what it holds now cannot be more, but for local refill).
  local held, mine, seq = 0, 0, now
  local all = redis.call('HGETALL', leases)
  for j = 1, #all, 2 do
    local amount, expiry, w, last = string.match(all[j + 1], '(%S+) (%S+) (%S+) ?(%S*)')
    if all[j] == replica and last ~= '' then seq = math.max(seq, tonumber(last) + 1) end
    if tonumber(expiry) <= now or w ~= window then
      redis.call('HDEL', leases, all[j])
    elseif all[j] ~= replica then
      held = held + tonumber(amount)
    else
      mine = tonumber(amount)
    end
  end
  local avail = math.max(s.avail, 0)
  local lease = math.min(math.max(avail - held, 0), math.max(math.ceil(avail * share), want))
  local reserved = math.max(lease, math.min(hold, mine))
  redis.call('HSET', leases, replica, tostring(reserved) .. ' ' .. int(now + ttl) .. ' ' .. window .. ' ' .. int(seq))
  expire(leases, ttl)
  table.insert(out, tostring(lease))
  table.insert(out, s.start or 0)
  table.insert(out, s.prev or 0)
  table.insert(out, s.cur or 0)
  -- What is available in common, negative for a debt (units taken beyond
  -- the limit): every replica waits it out.
  table.insert(out, tostring(s.avail))
  table.insert(out, seq)
end
return out
