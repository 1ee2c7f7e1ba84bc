-- An operator's state. ARGV[13]: 1 CLOSED (reset), 4, 5 or 6.
local to = tonumber(ARGV[13])
clear_window()
if to == 1 then close() else transition(to) end
return save(0)
