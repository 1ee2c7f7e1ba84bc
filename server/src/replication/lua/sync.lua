-- replicated: push one bucket's consumption since the last sync (taken even
-- beyond the limit: it already happened) and return the merged state.
-- KEYS[1]: the bucket. ARGV[1]: units to push; then the limit's five numbers.
-- Returns {avail (string: a fraction), window start us, prev, cur}.
local now = now_us()
local delta = tonumber(ARGV[1])
local alg, p = limit_at(1)
local s = A[alg].status(KEYS[1], p, now, 0)
if delta > 0 then
  A[alg].take(KEYS[1], p, now, delta, s)
  s = A[alg].status(KEYS[1], p, now, 0)
end
return { tostring(s.avail), s.start or 0, s.prev or 0, s.cur or 0 }
