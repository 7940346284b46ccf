-- Moves a session's cursor on a stream forward (never back); the cursors
-- expire with the session.
-- KEYS[1]: the session hash; KEYS[2]: its cursors hash (one slot).
-- ARGV: stream, seq.
-- Returns 1, or 0 if the session is gone (nothing stored).
local e = redis.call('HGET', KEYS[1], 'expires')
if not e then return 0 end
local cur = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if tonumber(ARGV[2]) > cur then redis.call('HSET', KEYS[2], ARGV[1], ARGV[2]) end
redis.call('PEXPIREAT', KEYS[2], e)
return 1
