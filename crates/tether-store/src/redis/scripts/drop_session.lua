-- Not a script of its own: prepended to the scripts that remove sessions
-- (create over an expired one, delete, expire).
-- drop(p, id): deletes session `id` under prefix `p` with its event streams,
-- stream indexes (names, last seq, finished, cursors) and its entries in the
-- by-principal and by-expiry sets. Returns 1 if the session existed, else 0.
local function drop(p, id)
  local streams = redis.call('SMEMBERS', p..'ss:'..id)
  for _, s in ipairs(streams) do redis.call('DEL', p..'e:'..id..':'..s) end
  redis.call('DEL', p..'ss:'..id, p..'q:'..id, p..'f:'..id, p..'c:'..id)
  local principal = redis.call('HGET', p..'s:'..id, 'principal')
  if principal then redis.call('ZREM', p..'sp:'..principal, id) end
  redis.call('ZREM', p..'sx', id)
  return redis.call('DEL', p..'s:'..id)
end
