-- Creates a session unless a live one has its ID; an expired one with the ID
-- is dropped first (drop_session.lua). Indexes it by principal and expiry;
-- its hash expires with it.
-- KEYS: none (keys are built from the prefix).
-- ARGV: prefix, id, principal, created ms, expires ms, revision, state JSON, now ms.
-- Returns 1 when created, 0 when a live session has the ID.
local p, id = ARGV[1], ARGV[2]
local k = p..'s:'..id
local e = redis.call('HGET', k, 'expires')
if e and tonumber(e) > tonumber(ARGV[8]) then return 0 end
if e then drop(p, id) end
redis.call('HSET', k, 'principal', ARGV[3], 'created', ARGV[4], 'expires', ARGV[5], 'revision', ARGV[6], 'state', ARGV[7])
redis.call('PEXPIREAT', k, ARGV[5])
redis.call('ZADD', p..'sp:'..ARGV[3], ARGV[5], id)
redis.call('ZADD', p..'sx', ARGV[5], id)
return 1
