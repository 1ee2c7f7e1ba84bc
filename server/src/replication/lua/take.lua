-- strict: one decision over every strict limit of a request, all or nothing.
-- KEYS: one per limit. ARGV[1]: cost; then five numbers per limit.
-- Returns {admitted, then per limit: ok, floor(avail after), reset us, retry us, wait us}.
local now = now_us()
local cost = tonumber(ARGV[1])
local st, all = {}, true
for i = 1, #KEYS do
  local alg, p = limit_at(i)
  st[i] = A[alg].status(KEYS[i], p, now, cost)
  all = all and st[i].ok
end
local out = { all and 1 or 0 }
for i = 1, #KEYS do
  local alg, p = limit_at(i)
  local s = st[i]
  if all then A[alg].take(KEYS[i], p, now, cost, s) end
  local left = (all and s.ok) and s.avail - cost or s.avail
  table.insert(out, s.ok and 1 or 0)
  table.insert(out, math.floor(math.max(left, 0)))
  table.insert(out, math.ceil(s.reset))
  table.insert(out, math.ceil(s.retry))
  table.insert(out, math.ceil(s.wait))
end
return out
