-- Layout 2 → 3, a page of sessions: a session's `ss` now lists only its
-- open streams (those without a final event), and the per-stream hashes of
-- last seq (`q`, now the event stream's own last ID) and finished flags
-- (`f`) go. A finished stream keeps its TTL.
-- KEYS: on a cluster the one session's hash (its slot); none on a single server.
-- ARGV: each session's key base (`P{id}:`).
-- Returns the number of sessions converted.
local n = 0
for i = 1, #ARGV do
  local b = ARGV[i]
  for _, s in ipairs(redis.call('HKEYS', b..'f')) do redis.call('SREM', b..'ss', s) end
  redis.call('DEL', b..'q', b..'f')
  n = n + 1
end
return n
