-- Not a script of its own: prepended to the scripts that remove sessions
-- (create over an expired one, delete, expire).
-- drop(b): deletes the session whose keys begin with `b` (`P{id}:`, one
-- cluster slot) with its open event streams, their set and its cursors
-- (finished streams expire on their own, within one session TTL; the
-- session gone, nothing serves them). Its entries in the by-principal and
-- by-expiry sets live in other slots: the caller removes them after this
-- script.
-- Returns the session's principal, or false if it did not exist.
local function drop(b)
  for _, s in ipairs(redis.call('SMEMBERS', b..'ss')) do redis.call('DEL', b..'e:'..s) end
  local principal = redis.call('HGET', b..'s', 'principal')
  redis.call('DEL', b..'s', b..'ss', b..'c')
  return principal
end
