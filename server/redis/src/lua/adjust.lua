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
-- A Charge with an idempotency key claims it in the same script, so that a
-- replica that dies after the script has both claimed and taken, or neither:
-- then one more key follows the buckets (the claim, in the resource's slot),
-- and one more number the seven of each bucket (the claim's lifetime, ms).
-- A key claimed before answers {'dup'} and nothing changes.
-- Returns Redis's time (us), then per bucket floor(what is available after),
-- negative for a debt.
local now = now_us()
local deadline = tonumber(ARGV[1])
if deadline > 0 and now > deadline then return { 'late' } end
if not marked(KEYS[1], ARGV[2]) then return { 'lost' } end
local buckets = math.floor((#ARGV - 2) / 7)
local claim = KEYS[buckets + 2]
-- (The lifetime comes as a decimal number: an integer is made of it for SET.)
if claim and not redis.call('SET', claim, 1, 'NX', 'PX', math.floor(tonumber(ARGV[3 + buckets * 7]))) then
  return { 'dup' }
end
-- Redis's time first: the replica keeps the newest figure it was given.
local out = { now }
for i = 2, buckets + 1 do
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
