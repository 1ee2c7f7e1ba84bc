-- A strict concurrency limit's in-flight set, for the whole fleet.
-- KEYS[1]: the set (sorted set: permit id -> expiry, Redis ms).
-- ARGV[1]: 1 take, 2 give back, 3 add (a permit issued while Redis could not
-- be asked); ARGV[2]: the permit id; ARGV[3]: its time to live, ms;
-- ARGV[4]: max in flight (take); ARGV[5]: a deadline in Redis time, us (0:
-- none): a take that runs after it changes nothing and returns {'late'}
-- (the replica stopped waiting: nobody would hold the slot).
-- Returns {1, 0} when the permit holds a slot, {0, ms until the first
-- expiry} when every slot is held.
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local op = tonumber(ARGV[1])
if op == 2 then
  redis.call('ZREM', KEYS[1], ARGV[2])
  return { 1, 0 }
end
local DEADLINE = tonumber(ARGV[5])
if DEADLINE > 0 and now_us > DEADLINE then return { 'late' } end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if op == 1 and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return { 0, math.max(1, tonumber(first[2]) - now) }
end
local expires = now + math.max(1, tonumber(ARGV[3]))
redis.call('ZADD', KEYS[1], expires, ARGV[2])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], tonumber(last[2]) + 1000)
return { 1, 0 }
