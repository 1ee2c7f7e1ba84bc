-- strict: independent decisions (one, or a batch's items of one resource),
-- each all or nothing over its request's strict limits, in order: a later
-- decision sees what an earlier one took.
-- KEYS: every decision's limits, in order. ARGV[1]: the number of decisions;
-- then per decision: its cost, its number of limits n, and five numbers per limit.
-- Returns per decision {admitted, then per limit: ok, floor(avail after), reset us, retry us, wait us}.
local now = now_us()
local out = {}
local a, k = 2, 0
for _ = 1, tonumber(ARGV[1]) do
  local cost, n = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  a = a + 2
  local algs, ps, st, all = {}, {}, {}, true
  for i = 1, n do
    algs[i] = tonumber(ARGV[a])
    ps[i] = { tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]) }
    a = a + 5
    st[i] = A[algs[i]].status(KEYS[k + i], ps[i], now, cost)
    all = all and st[i].ok
  end
  table.insert(out, all and 1 or 0)
  for i = 1, n do
    local s = st[i]
    if all then A[algs[i]].take(KEYS[k + i], ps[i], now, cost, s) end
    local left = (all and s.ok) and s.avail - cost or s.avail
    table.insert(out, s.ok and 1 or 0)
    table.insert(out, math.floor(math.max(left, 0)))
    table.insert(out, math.ceil(s.reset))
    table.insert(out, math.ceil(s.retry))
    table.insert(out, math.ceil(s.wait))
  end
  k = k + n
end
return out
