-- strict: independent decisions (one, or a batch's items of one resource),
-- each all or nothing over its request's strict limits, in order: a later
-- decision sees what an earlier one took.
--
-- KEYS[1]: the resource's marker; then every decision's limits, in order.
-- ARGV[1]: a deadline in Redis time, us (0: none): a script that runs after
-- it changes nothing and returns {'late'}, so a decision the replica gave up on
-- is never applied later. ARGV[2]: the marker's token as this replica knows
-- it (see limits.lua): unless it is the one in Redis, nothing is decided and
-- {'lost'} asks the replica to restore what it holds first. ARGV[3]: the number of
-- decisions; then per decision: its number of limits n, 1 for a check (a
-- dry run or a peek: decided, reported, nothing taken) or 0, and per limit
-- five numbers and the cost the decision takes from it.
-- Returns Redis's time (us: the instant every decision here took its units,
-- for giving them back later), then per decision {admitted, then per limit:
-- ok, floor(avail after), reset us, retry us, wait us}. What is available
-- after may be negative: a Charge takes beyond the limit, and the replica
-- must know that debt to put it back if Redis loses it.
local now = now_us()
local deadline = tonumber(ARGV[1])
if deadline > 0 and now > deadline then return { 'late' } end
if not marked(KEYS[1], ARGV[2]) then return { 'lost' } end
local out = { now }
local a, k = 4, 1
for _ = 1, tonumber(ARGV[3]) do
  local n, check = tonumber(ARGV[a]), tonumber(ARGV[a + 1]) == 1
  a = a + 2
  local algs, ps, costs, st, all = {}, {}, {}, {}, true
  for i = 1, n do
    algs[i] = tonumber(ARGV[a])
    ps[i] = { tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]) }
    costs[i] = tonumber(ARGV[a + 5])
    a = a + 6
    st[i] = A[algs[i]].status(KEYS[k + i], ps[i], now, costs[i])
    all = all and st[i].ok
  end
  table.insert(out, all and 1 or 0)
  for i = 1, n do
    local s = st[i]
    if all and not check then
      A[algs[i]].take(KEYS[k + i], ps[i], now, costs[i], s)
      changed(KEYS[k + i], now, algs[i], ps[i], ARGV[2])
    end
    local left = (all and s.ok) and s.avail - costs[i] or s.avail
    table.insert(out, s.ok and 1 or 0)
    table.insert(out, math.floor(left))
    table.insert(out, math.ceil(s.reset))
    table.insert(out, math.ceil(s.retry))
    table.insert(out, math.ceil(s.wait))
  end
  k = k + n
end
return out
