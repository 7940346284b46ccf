-- Compare-and-set of a key/value record: writes it only if its live
-- revision is the expected one ('' for absent or expired) under a new
-- revision from its slot's counter (never reused), with an optional expiry
-- (also set as a native TTL).
-- KEYS[1]: the record hash; KEYS[2]: the revision counter (same hash tag).
-- ARGV: expected revision or '', value, expires ms or '', now ms.
-- Returns the new revision, or -1 when the expected one did not match.
local cur = redis.call('HMGET', KEYS[1], 'r', 'x')
local live = cur[1] and (cur[2] == false or cur[2] == '' or tonumber(cur[2]) > tonumber(ARGV[4]))
local rev = ''
if live then rev = cur[1] end
if rev ~= ARGV[1] then return -1 end
local n = redis.call('INCR', KEYS[2])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'r', n, 'x', ARGV[3])
if ARGV[3] ~= '' then redis.call('PEXPIREAT', KEYS[1], ARGV[3]) end
return n
