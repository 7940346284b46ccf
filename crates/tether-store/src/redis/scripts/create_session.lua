-- Creates a session unless a live one has its ID; an expired one with the ID
-- is dropped first (drop_session.lua). Its hash expires with it. The
-- by-principal and by-expiry entries are the caller's next step (other slots).
-- KEYS[1]: the session hash (`P{id}:s`).
-- ARGV: key base (`P{id}:`), principal, created ms, expires ms, revision, state JSON, now ms.
-- Returns 1 when created, 0 when a live session has the ID.
local k, b = KEYS[1], ARGV[1]
local e = redis.call('HGET', k, 'expires')
if e and tonumber(e) > tonumber(ARGV[7]) then return 0 end
if e then drop(b) end
redis.call('HSET', k, 'principal', ARGV[2], 'created', ARGV[3], 'expires', ARGV[4], 'revision', ARGV[5], 'state', ARGV[6])
redis.call('PEXPIREAT', k, ARGV[4])
return 1
