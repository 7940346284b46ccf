-- Drops sessions whose expiry has passed, oldest first (drop_session.lua).
-- KEYS: none (keys are built from the prefix).
-- ARGV: prefix, now ms, at most this many sessions.
-- Returns the IDs of the dropped sessions.
local ids = redis.call('ZRANGEBYSCORE', ARGV[1]..'sx', '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(ids) do drop(ARGV[1], id) end
return ids
