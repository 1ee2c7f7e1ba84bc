-- Redis lost a resource's state (its marker is gone): a replica puts back
-- what it knew, so that the replicas go on from there rather than from full
-- buckets. Several replicas may restore the same bucket: each only lowers
-- what is available to what it knew, never adds, so the lowest wins.
--
-- KEYS[1]: the resource's marker; then the buckets. Per bucket in ARGV, seven
-- numbers: the limit's five, what was available, and when that was seen (us,
-- Redis time). Rate limits refill since then; a window that has ended since
-- is left as it is.
-- Returns how many buckets were lowered.
local now = now_us()
local lowered = 0
for i = 2, #KEYS do
  local b = (i - 2) * 7
  local alg = tonumber(ARGV[b + 1])
  local p = { tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5]) }
  local known, at = tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7])
  local target = A[alg].restored(p, known, at, now)
  if target then
    local s = A[alg].status(KEYS[i], p, now, 0)
    if s.avail > target then
      A[alg].take(KEYS[i], p, now, math.ceil(s.avail - target), s)
      lowered = lowered + 1
    end
  end
end
redis.call('SET', KEYS[1], '1', 'EX', MARKER_TTL)
return lowered
