-- Summaries of a session's streams, or of one of them.
-- KEYS: none (keys are built from the prefix).
-- ARGV: prefix, id, a stream name or '' for all of the session's streams.
-- Returns {name, first seq, last seq, finished 0/1} per stream (unordered);
-- first is last + 1 when the stream holds no events.
local p, id = ARGV[1], ARGV[2]
local names
if ARGV[3] == '' then
  names = redis.call('SMEMBERS', p..'ss:'..id)
elseif redis.call('SISMEMBER', p..'ss:'..id, ARGV[3]) == 1 then
  -- One stream: no walk over all of a long session's streams.
  names = {ARGV[3]}
else
  names = {}
end
local out = {}
for _, s in ipairs(names) do
  if ARGV[3] == '' or ARGV[3] == s then
    local last = tonumber(redis.call('HGET', p..'q:'..id, s) or '0')
    local first = last + 1
    local head = redis.call('XRANGE', p..'e:'..id..':'..s, '-', '+', 'COUNT', 1)
    if head[1] then first = tonumber(string.sub(head[1][1], 3)) end
    local fin = redis.call('HGET', p..'f:'..id, s) and 1 or 0
    table.insert(out, {s, first, last, fin})
  end
end
return out
