-- Moves a session's cursor on a stream forward (never back); the cursors
-- expire with the session.
-- KEYS: none (keys are built from the prefix).
-- ARGV: prefix, id, stream, seq.
-- Returns 1, or 0 if the session is gone (nothing stored).
local p, id = ARGV[1], ARGV[2]
local e = redis.call('HGET', p..'s:'..id, 'expires')
if not e then return 0 end
local k = p..'c:'..id
local cur = tonumber(redis.call('HGET', k, ARGV[3]) or '0')
if tonumber(ARGV[4]) > cur then redis.call('HSET', k, ARGV[3], ARGV[4]) end
redis.call('PEXPIREAT', k, e)
return 1
