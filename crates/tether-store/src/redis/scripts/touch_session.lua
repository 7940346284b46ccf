-- Moves a session's expiry forward (never back) and every key of the
-- session with it: its hash, its index entries, its event streams and
-- their per-stream hashes.
-- KEYS: none (keys are built from the prefix).
-- ARGV: prefix, id, expires ms.
-- Returns 1, or 0 if the session is gone.
local p, id = ARGV[1], ARGV[2]
local k = p..'s:'..id
local e = redis.call('HGET', k, 'expires')
if not e then return 0 end
local new = tonumber(ARGV[3])
if tonumber(e) > new then new = tonumber(e) end
local at = string.format('%d', new)
redis.call('HSET', k, 'expires', at)
redis.call('PEXPIREAT', k, at)
local principal = redis.call('HGET', k, 'principal')
redis.call('ZADD', p..'sp:'..principal, at, id)
redis.call('ZADD', p..'sx', at, id)
for _, s in ipairs(redis.call('SMEMBERS', p..'ss:'..id)) do redis.call('PEXPIREAT', p..'e:'..id..':'..s, at) end
for _, x in ipairs({'ss:', 'q:', 'f:', 'c:'}) do redis.call('PEXPIREAT', p..x..id, at) end
return 1
