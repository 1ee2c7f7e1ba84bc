-- Units one replica counted, added to a limit's traffic record, which sums
-- the replicas' calls of each minute and keeps each key's busiest minute
-- of each day. KEYS[1]: the minute's units (hash: key -> units of every
-- replica); KEYS[2] on: the day's peaks, one hash per part of the keys
-- (key -> units in its busiest minute). ARGV[1]: how long the minute's
-- hash is kept (ms); ARGV[2]: how long a day's (ms); ARGV[3]: the most keys
-- a day's part holds; then triples: key, units, the index in KEYS of its
-- day's part. A key new to a full part is not recorded. Returns the units
-- not recorded.
local refused = 0
local most = tonumber(ARGV[3])
for i = 4, #ARGV, 3 do
    local key = ARGV[i]
    local day = KEYS[tonumber(ARGV[i + 2])]
    local peak = redis.call('HGET', day, key)
    if not peak and redis.call('HLEN', day) >= most then
        refused = refused + tonumber(ARGV[i + 1])
    else
        local total = redis.call('HINCRBY', KEYS[1], key, ARGV[i + 1])
        if not peak or total > tonumber(peak) then
            redis.call('HSET', day, key, total)
        end
    end
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
for k = 2, #KEYS do
    redis.call('PEXPIRE', KEYS[k], ARGV[2])
end
return refused
