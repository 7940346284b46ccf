-- Summaries of a session's open streams, or of one stream (open or
-- finished, in a Redis Stream or stored whole). records.lua comes first.
-- KEYS[1]: the session's set of open streams (`P{id}:ss`).
-- ARGV: key base (`P{id}:`, for the event streams `P{id}:e:NAME` and
-- `P{id}:d:NAME`), a stream name or '' for the open ones.
-- Returns {name, first seq, last seq, finished 0/1} per stream (unordered).
local b, one = ARGV[1], ARGV[2]
local names
if one == '' then names = redis.call('SMEMBERS', KEYS[1]) else names = {one} end
local out = {}
for _, s in ipairs(names) do
  local key = b..'e:'..s
  local head = redis.call('XRANGE', key, '-', '+', 'COUNT', 1)[1]
  local tail = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)[1]
  if head and tail then
    -- An entry is {id, {'k', kind, 'p', payload}}.
    local fin = tail[2][2] == '2' and 1 or 0
    table.insert(out, {s, tonumber(string.sub(head[1], 3)), tonumber(string.sub(tail[1], 3)), fin})
  else
    local stored = redis.call('GET', b..'d:'..s)
    if stored then
      local events = records(stored)
      table.insert(out, {s, 1, #events, events[#events][1] == '2' and 1 or 0})
    end
  end
end
return out
