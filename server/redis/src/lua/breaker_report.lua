-- A probe's outcome. ARGV[13]: the probe's generation, ARGV[14]: 1 success,
-- 2 failure, 3 ignored; ARGV[15]: 1 when slow. Result 1 when it counted.
local gen, outcome, slow = tonumber(ARGV[13]), tonumber(ARGV[14]), tonumber(ARGV[15])
if b.s ~= 3 or b.g ~= gen then return save(0) end
if outcome == 3 then
  b.pi = math.max(0, b.pi - 1)
  return save(1)
end
b.pr = b.pr + 1
if outcome == 2 then b.pf = b.pf + 1 end
b.ps = b.ps + slow
if b.pr >= PROBES then
  if probes_trip(b.pr, b.pf, b.ps) then open() else close() end
end
return save(1)
