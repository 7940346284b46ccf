-- Summaries of a session's streams, or of one of them.
-- KEYS[1..3]: the session's stream names set, last-seq hash and finished
-- hash (`P{id}:ss`, `:q`, `:f`; one slot).
-- ARGV: key base (`P{id}:`, for the event streams `P{id}:e:NAME`), a stream name or '' for all.
-- Returns {name, first seq, last seq, finished 0/1} per stream (unordered);
-- first is last + 1 when the stream holds no events.
local b, one = ARGV[1], ARGV[2]
local names
if one == '' then
  names = redis.call('SMEMBERS', KEYS[1])
elseif redis.call('SISMEMBER', KEYS[1], one) == 1 then
  -- One stream: no walk over all of a long session's streams.
  names = {one}
else
  names = {}
end
local out = {}
for _, s in ipairs(names) do
  local last = tonumber(redis.call('HGET', KEYS[2], s) or '0')
  local first = last + 1
  local head = redis.call('XRANGE', b..'e:'..s, '-', '+', 'COUNT', 1)
  if head[1] then first = tonumber(string.sub(head[1][1], 3)) end
  local fin = redis.call('HGET', KEYS[3], s) and 1 or 0
  table.insert(out, {s, first, last, fin})
end
return out
