-- Appends events to a session's stream, numbered after its last one, in
-- one step (a batch is one round trip): each is a Redis Stream entry with
-- ID 0-{seq}, the stream capped at its newest `cap` entries; a final event
-- (kind 2) marks the stream finished. The stream's keys expire with the
-- session (an hour if it has none), and every event is announced on the
-- `live` channel as "{session}\n{stream}\n{seq}".
-- KEYS: none (keys are built from the prefix).
-- ARGV: prefix, id, stream, cap, then kind and payload of each event.
-- Returns the first event's seq.
local p, id, s, cap = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local n = (#ARGV - 4) / 2
local first = redis.call('HINCRBY', p..'q:'..id, s, n) - n + 1
local key = p..'e:'..id..':'..s
for i = 0, n - 1 do
  local kind = ARGV[5 + 2 * i]
  redis.call('XADD', key, 'MAXLEN', cap, '0-'..(first + i), 'k', kind, 'p', ARGV[6 + 2 * i])
  if kind == '2' then redis.call('HSET', p..'f:'..id, s, 1) end
end
redis.call('SADD', p..'ss:'..id, s)
local e = redis.call('HGET', p..'s:'..id, 'expires')
for _, k in ipairs({key, p..'ss:'..id, p..'q:'..id, p..'f:'..id}) do
  if e then redis.call('PEXPIREAT', k, e) else redis.call('PEXPIRE', k, 3600000) end
end
for i = 0, n - 1 do redis.call('PUBLISH', p..'live', id..'\n'..s..'\n'..(first + i)) end
return first
