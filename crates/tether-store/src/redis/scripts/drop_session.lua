-- Not a script of its own: prepended to the scripts that remove sessions
-- (create over an expired one, delete, expire).
-- drop(b): deletes the session whose keys begin with `b` (`P{id}:`, one
-- cluster slot) with its event streams and stream indexes (names, last seq,
-- finished, cursors). Its entries in the by-principal and by-expiry sets
-- live in other slots: the caller removes them after this script.
-- Returns the session's principal, or false if it did not exist.
local function drop(b)
  for _, s in ipairs(redis.call('SMEMBERS', b..'ss')) do redis.call('DEL', b..'e:'..s) end
  local principal = redis.call('HGET', b..'s', 'principal')
  redis.call('DEL', b..'s', b..'ss', b..'q', b..'f', b..'c')
  return principal
end
