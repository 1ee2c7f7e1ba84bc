-- A replica's window since its last sync. ARGV[13..16]: calls, failures,
-- slow calls, and 1 when its own window just tripped.
local dc, df, ds, tripped = tonumber(ARGV[13]), tonumber(ARGV[14]), tonumber(ARGV[15]), tonumber(ARGV[16])
expire_half_open()
if b.s == 1 or b.s == 6 then
  add(dc, df, ds)
  local c, f, s = window()
  if b.s == 1 and (tripped == 1 or (c >= MIN and trips(c, f, s))) then
    open()
    clear_window()
  end
end
return save(0)
