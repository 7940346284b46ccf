-- Compare-and-set of a session's state: replaces it only if the stored
-- revision is the expected one, and bumps the revision.
-- KEYS[1]: the session hash.
-- ARGV: expected revision, state JSON.
-- Returns the new revision, or -1 (stale revision or no such session).
local r = redis.call('HGET', KEYS[1], 'revision')
if not r or tonumber(r) ~= tonumber(ARGV[1]) then return -1 end
redis.call('HSET', KEYS[1], 'state', ARGV[2])
return redis.call('HINCRBY', KEYS[1], 'revision', 1)
