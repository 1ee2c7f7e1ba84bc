-- A replica says it is alive. KEYS[1]: the replicas (sorted set, score =
-- expiry ms); KEYS[2]: the digest of each live replica's rules (a hash).
-- ARGV[1]: this replica, ARGV[2]: time to live ms, ARGV[3]: the digest of
-- the rules this replica decides by. Returns how many replicas are alive,
-- Redis's clock in us (replicas translate their deadlines into it), this
-- Redis process's run id (another one than last time: Redis restarted or
-- failed over, and may have gone back in time), then the first 1000 live
-- replicas, each as its name, a newline and the digest of its rules (a
-- permit reported to one replica is passed on to the live replica that
-- issued it; replicas whose rules differ say so).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  redis.call('HDEL', KEYS[2], gone)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], ttl * 10)
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ttl * 10)
local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
local reply = { redis.call('ZCARD', KEYS[1]), tonumber(t[1]) * 1000000 + tonumber(t[2]), run_id }
for _, name in ipairs(redis.call('ZRANGE', KEYS[1], 0, 999)) do
  table.insert(reply, name .. '\n' .. (redis.call('HGET', KEYS[2], name) or ''))
end
return reply
