-- Moves a session's expiry forward (never back) and every key of the
-- session with it: its hash, its open event streams, their set, its cursors
-- (finished streams keep theirs: see append.lua).
-- The by-principal and by-expiry entries are the caller's next step.
-- KEYS[1]: the session hash (`P{id}:s`).
-- ARGV: key base (`P{id}:`), expires ms.
-- Returns {principal, expires ms} or false if the session is gone.
local k, b = KEYS[1], ARGV[1]
local e = redis.call('HGET', k, 'expires')
if not e then return false end
local new = tonumber(ARGV[2])
if tonumber(e) > new then new = tonumber(e) end
local at = string.format('%d', new)
redis.call('HSET', k, 'expires', at)
redis.call('PEXPIREAT', k, at)
for _, s in ipairs(redis.call('SMEMBERS', b..'ss')) do redis.call('PEXPIREAT', b..'e:'..s, at) end
for _, x in ipairs({'ss', 'c'}) do redis.call('PEXPIREAT', b..x, at) end
return {redis.call('HGET', k, 'principal'), at}
