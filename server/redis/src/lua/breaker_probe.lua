-- May a call go ahead? Result 1: a probe, 2: a plain call (closed), 0: no.
expire_half_open()
if b.s == 2 and now >= b.ou then
  b.hs = now
  transition(3)
end
if b.s == 3 and b.pi < PROBES then
  b.pi = b.pi + 1
  return save(1)
end
if b.s == 1 or b.s == 5 or b.s == 6 then return save(2) end
return save(0)
