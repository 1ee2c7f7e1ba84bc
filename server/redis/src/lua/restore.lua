-- Redis lost a resource's state (its marker is gone, holds another token
-- than the replica knew, or was set by another Redis process: Redis went back
-- in time), or the replica touches it for the first time: the
-- replica puts back what it knew, so that the replicas go on from there
-- rather than from full buckets, and learns the marker's token.
--
-- Several replicas restore the same bucket, before and after others pushed
-- what they took since: each restore lowers what is available by what it
-- knows beyond the restores before it (`key:r` keeps the lowest figure so
-- far, Redis's own at the first restore included, refilled since for rate
-- limits), never adds, so the result is the lowest knowledge less every
-- push, in whatever order they arrive.
--
-- KEYS[1]: the resource's marker; then the buckets. Per bucket in ARGV, seven
-- numbers: the limit's five, what was available, and when that was seen (us,
-- Redis time). Rate limits refill since then; a window that has ended since
-- is left as it is.
-- Returns {how many buckets were lowered, the marker's token}.
local now = now_us()
local lowered = 0
-- The first restore since Redis lost the resource sets a new token; the
-- others of the same loss find it, and the targets stored with it.
-- A token set by another Redis process (this one restarted from a file, or
-- was promoted from a replica) is as good as gone: counts may be older.
local token = redis.call('GET', KEYS[1])
if not token or string.sub(token, -40) ~= identity() then
  token = new_token(now)
  redis.call('SET', KEYS[1], token, 'EX', MARKER_TTL)
end
for i = 2, #KEYS do
  local b = (i - 2) * 7
  local alg = tonumber(ARGV[b + 1])
  local p = { tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5]) }
  local known, at = tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7])
  local target = A[alg].restored(p, known, at, now)
  if target then
    local r = KEYS[i] .. ':r'
    local before = redis.call('HMGET', r, 't', 'at', 'token')
    local floor = nil
    if before[1] and before[3] == token then
      floor = A[alg].restored(p, tonumber(before[1]), tonumber(before[2]), now)
    else
      -- The first restore of this bucket in this loss. What Redis recorded
      -- of each replica's pushes (`key:p`, see sync.lua) is as old as the
      -- rest of its state: measured against it, a replica's next push would
      -- apply again what it pushed after that record, which the figure
      -- restored here already counts. Without a record, each replica
      -- pushes only what it has not pushed yet.
      redis.call('DEL', KEYS[i] .. ':p')
    end
    -- `stored` is where this restore leaves the bucket, before the pushes
    -- that come after it: the floor the next restore of this loss starts
    -- from. The first restore of a loss finds Redis's own figure, which may
    -- be lower than what this replica knew (Redis restarted from a save of
    -- its last state, and another replica synced after this one): the
    -- bucket then stays where it is, and that figure is the floor, so that
    -- the next restore does not take again what Redis had counted already.
    local lower, stored = 0, nil
    if not floor then
      local s = A[alg].status(KEYS[i], p, now, 0)
      lower = s.avail - target
      stored = math.min(target, s.avail)
    elseif target < floor then
      lower = floor - target
      stored = target
    end
    -- Exactly what the replica knew, not a whole unit more: rounding up
    -- would take a unit nobody used. Rate limits take fractions; windows
    -- and logs count whole units, and their figures are whole already. The
    -- rounding to a millionth only removes floating-point noise.
    lower = math.floor(lower * 1e6 + 0.5) / 1e6
    if lower > 0 then
      A[alg].take(KEYS[i], p, now, lower, A[alg].status(KEYS[i], p, now, 0))
      lowered = lowered + 1
    end
    if stored then
      redis.call('HSET', r, 't', stored, 'at', now, 'token', token)
      redis.call('EXPIRE', r, MARKER_TTL)
    end
  end
end
return { lowered, token }
