-- adjust: units taken from strict buckets, beyond their limit if need be (a
-- Charge, an estimate settled higher than it took, what a replica admitted
-- on its own while Redis was away), or given back (an estimate settled
-- lower), as far as each bucket's state allows.
--
-- KEYS[1]: the resource's marker (see take.lua); then the buckets (one
-- resource's). ARGV[1]: a deadline in Redis time, us (0: none), after which
-- nothing changes ({'late'}); ARGV[2]: the marker's token as this replica knows
-- it ({'lost'} unless it is the one in Redis: restore first). Then per bucket seven numbers: units
-- (negative: given back), the Redis time of the take they were part of (us;
-- 0 when unknown: for a give-back, the current window, and nothing from a
-- sliding log), and the limit's five numbers.
-- Returns per bucket floor(what is available after), negative for a debt.
local now = now_us()
local deadline = tonumber(ARGV[1])
if deadline > 0 and now > deadline then return { 'late' } end
if not marked(KEYS[1], ARGV[2]) then return { 'lost' } end
-- Redis's time first: the replica keeps the newest figure it was given.
local out = { now }
for i = 2, #KEYS do
  local key, b = KEYS[i], 2 + (i - 2) * 7
  local units, at = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local alg = tonumber(ARGV[b + 3])
  local p = { tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7]) }
  local s = A[alg].status(key, p, now, 0)
  if units > 0 then
    A[alg].take(key, p, now, units, s)
    s = A[alg].status(key, p, now, 0)
  elseif units < 0 then
    A[alg].give(key, p, now, -units, s, at)
    s = A[alg].status(key, p, now, 0)
  end
  if units ~= 0 then changed(key, now, alg, p, ARGV[2]) end
  table.insert(out, math.floor(s.avail))
end
return out
