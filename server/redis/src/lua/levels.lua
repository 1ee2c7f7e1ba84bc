-- Operators' degradation levels, newest wins. KEYS[1]: the levels (hash:
-- system -> "<level|-> <set at, ns>"; "-" is back to automatic; field "#v":
-- the version). ARGV[1]: a new version; then triples: system, level or "-",
-- when it was set (ns). A triple older than what the hash holds for its
-- system changes nothing. Returns how many were written; the version moves
-- only when one was.
local written = 0
for i = 2, #ARGV, 3 do
    local held = redis.call('HGET', KEYS[1], ARGV[i])
    local held_at = held and tonumber(string.match(held, ' (%d+)$')) or -1
    if tonumber(ARGV[i + 2]) > held_at then
        redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1] .. ' ' .. ARGV[i + 2])
        written = written + 1
    end
end
if written > 0 then redis.call('HSET', KEYS[1], '#v', ARGV[1]) end
return written
