-- Drops one session if its expiry has passed (drop_session.lua). The reaper
-- finds candidates in the by-expiry set and runs this on each one's slot;
-- the hash is the authority, so a session renewed meanwhile (on any
-- replica) is kept.
-- KEYS[1]: the session hash (`P{id}:s`).
-- ARGV: key base (`P{id}:`), now ms.
-- Returns {1, principal} when dropped, {0, ''} when the session is gone
-- already, {2, expires} when it lives on.
local e = redis.call('HGET', KEYS[1], 'expires')
if not e then return {0, ''} end
if tonumber(e) > tonumber(ARGV[2]) then return {2, e} end
return {1, drop(ARGV[1]) or ''}
