-- A replica says it is alive. KEYS[1]: the replicas (sorted set, score =
-- expiry ms). ARGV[1]: this replica, ARGV[2]: time to live ms. Returns how
-- many replicas are alive, and Redis's clock in us (replicas translate their
-- deadlines into it).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 10)
return { redis.call('ZCARD', KEYS[1]), tonumber(t[1]) * 1000000 + tonumber(t[2]) }
