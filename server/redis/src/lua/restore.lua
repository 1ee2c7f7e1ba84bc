-- Redis lost a resource's state (its marker is gone, holds another token
-- than the replica knew, or was set by another Redis process: Redis went back
-- in time), or the replica touches it for the first time: the
-- replica puts back what it knew, so that the replicas go on from there
-- rather than from full buckets, and learns the marker's token.
--
-- Several replicas restore the same bucket, before and after others pushed
-- what they took since. A replicated bucket: each restore lowers what is
-- available by what it knows beyond the restores before it (`key:r` keeps
-- the lowest figure so far, Redis's own at the first restore included,
-- refilled since for rate limits), never adds, so the result is the lowest
-- knowledge less every push, in whatever order they arrive.
--
-- A strict bucket changes only in Redis, and every change answers its
-- replica with the figure after it, Redis's time and the marker's token
-- then. Within one token, the most recent figure is the bucket's true state
-- at that time, give-backs included, where the lowest could predate a
-- give-back and lose it. Its restores keep the most recent figure of the
-- same token (`key:r` keeps when and under which token it was seen;
-- Redis's own figure is as old as the bucket's `key:w`) and move the bucket
-- up or down by the difference, which keeps whatever was taken since the
-- earlier restore. Figures of different tokens are not compared by time:
-- one given after a loss, before every replica that knew the bucket had
-- restored it, lacks what they knew (Redis went back, a replica took from
-- the older figure, Redis went back again). Those, a bucket without
-- `key:w` (written by an older version), and one changed after the loss by
-- a replica that had nothing to restore keep the lowest figure, as a
-- replicated bucket does.
--
-- KEYS[1]: the resource's marker; then the buckets. Per bucket in ARGV, nine
-- values: the limit's five numbers, what was available, when that was seen
-- (us, Redis time), 1 for a strict bucket (0: replicated), and the marker
-- token the figure was seen under (strict; may be empty). Rate limits
-- refill since then; a window that has ended since is left as it is.
-- Returns {how many buckets were changed, the marker's token}.
local now = now_us()
local changed_buckets = 0
-- The first restore since Redis lost the resource sets a new token; the
-- others of the same loss find it, and the targets stored with it.
-- A token set by another Redis process (this one restarted from a file, or
-- was promoted from a replica) is as good as gone: counts may be older.
local token = redis.call('GET', KEYS[1])
if not token or string.sub(token, -40) ~= identity() then
  token = new_token(now)
  redis.call('SET', KEYS[1], token, 'EX', MARKER_TTL)
end
-- Moves a bucket by `change` units available (rounded to a millionth, to
-- remove floating-point noise): down takes, up gives back in the current
-- window. True when it moved.
local function move(key, alg, p, change)
  change = math.floor(change * 1e6 + 0.5) / 1e6
  if change == 0 then return false end
  local st = A[alg].status(key, p, now, 0)
  if change < 0 then
    A[alg].take(key, p, now, -change, st)
  else
    A[alg].give(key, p, now, change, st, 0)
  end
  return true
end

for i = 2, #KEYS do
  local b = (i - 2) * 9
  local alg = tonumber(ARGV[b + 1])
  local p = { tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5]) }
  local known, at = tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7])
  local strict = tonumber(ARGV[b + 8]) == 1
  local under = ARGV[b + 9]
  local target = A[alg].restored(p, known, at, now)
  if target then
    local r = KEYS[i] .. ':r'
    local before = redis.call('HMGET', r, 't', 'at', 'token', 'seen', 'by')
    -- `current` is where the bucket was left before the takes since: the
    -- last restore's figure of this loss, refilled to now, or at the first
    -- restore Redis's own. `seen` is how old that figure is and `by` the
    -- token it was given under (nil: unknown).
    local current, seen, by = nil, nil, nil
    if before[1] and before[3] == token then
      current = A[alg].restored(p, tonumber(before[1]), tonumber(before[2]), now)
      seen, by = tonumber(before[4]), before[5]
    end
    local first = not current
    local empty = false
    if first then
      -- The first restore of this bucket in this loss. What Redis recorded
      -- of each replica's pushes (`key:p`, see sync.lua) is as old as the
      -- rest of its state: measured against it, a replica's next push would
      -- apply again what it pushed after that record, which the figure
      -- restored here already counts. Without a record, each replica
      -- pushes only what it has not pushed yet. Redis's own figure may be
      -- lower than what this replica knew (Redis restarted from a save of
      -- its last state, and another replica synced after this one).
      redis.call('DEL', KEYS[i] .. ':p')
      current = A[alg].status(KEYS[i], p, now, 0).avail
      if strict then seen, by = written(KEYS[i]) end
      -- Redis holds nothing of a strict bucket (no state, no time of a
      -- change): it lost the bucket, and its "figure" is only the state a
      -- new bucket starts in. For most algorithms that is full, and the
      -- lower figure below wins anyway; for a balance it is empty, which
      -- would lose every credit. So the replica's figure is kept, dated,
      -- and the later restores of this loss compare theirs by time.
      empty = strict and not seen and redis.call('EXISTS', KEYS[i]) == 0
    end
    local keep
    if empty then
      keep = true
    elseif strict and seen and under ~= '' and by == under then
      keep = at > seen
    else
      keep = target < current
    end
    if keep then
      -- A sliding log's entries carry their times; a figure does not. Entries
      -- of Redis's older copy may have been given back since (a settled
      -- estimate) and stand in for units taken later: expiring at their own
      -- time, they would free those units too early. So they count from the
      -- kept figure's time: they expire no sooner than what they stand for
      -- (a call or two may wait longer than it had to).
      if strict and alg == CODE.sliding_log then
        local older = redis.call('ZRANGEBYSCORE', KEYS[i], '-inf', '(' .. int(at))
        for j = 1, #older, 500 do
          local args = {}
          for m = j, math.min(#older, j + 499) do
            args[#args + 1] = at
            args[#args + 1] = older[m]
          end
          redis.call('ZADD', KEYS[i], 'XX', unpack(args))
        end
      end
      if move(KEYS[i], alg, p, target - current) then changed_buckets = changed_buckets + 1 end
      -- Takes after this restore answer under the new token; the figure
      -- kept here is dated by it.
      if strict then changed(KEYS[i], at, alg, p, token) end
    end
    -- What the next restore of this loss starts from: this figure, or the
    -- one kept before (at the first restore, Redis's own).
    if first or keep then
      redis.call('DEL', r)
      local figure = keep and target or current
      local figure_seen, figure_by = seen, by
      if keep then figure_seen, figure_by = strict and at or nil, strict and under or nil end
      redis.call('HSET', r, 't', figure, 'at', now, 'token', token)
      if figure_seen and figure_by then redis.call('HSET', r, 'seen', int(figure_seen), 'by', figure_by) end
      redis.call('EXPIRE', r, MARKER_TTL)
    end
  end
end
return { changed_buckets, token }
