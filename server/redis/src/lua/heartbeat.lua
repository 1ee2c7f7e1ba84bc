-- A replica says it is alive. KEYS[1]: the replicas (sorted set, score =
-- expiry ms). ARGV[1]: this replica, ARGV[2]: time to live ms. Returns how
-- many replicas are alive, Redis's clock in us (replicas translate their
-- deadlines into it), this Redis process's run id (another one than last
-- time: Redis restarted or failed over, and may have gone back in time), then
-- the first 1000 live replicas' names (a permit
-- reported to one replica is passed on to the live replica that issued it).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 10)
local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
local reply = { redis.call('ZCARD', KEYS[1]), tonumber(t[1]) * 1000000 + tonumber(t[2]), run_id }
for _, name in ipairs(redis.call('ZRANGE', KEYS[1], 0, 999)) do table.insert(reply, name) end
return reply
