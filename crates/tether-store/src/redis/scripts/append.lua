-- Appends events to a session's stream, numbered after its last one, in
-- one step (a batch is one round trip): each is a Redis Stream entry with
-- ID 0-{seq}, the stream capped at its newest `cap` entries; a final event
-- (kind 2) marks the stream finished. The stream's keys expire with the
-- session (an hour if it has none). On a single server the batch is
-- announced here, on `channel`, as "{session}\n{stream}\n{last seq}"; on a
-- cluster (`channel` '') the caller announces it on a sharded channel.
-- KEYS[1]: the session hash (`P{id}:s`; every key used is in its slot).
-- ARGV: key base (`P{id}:`), session id, stream, cap, channel or '', then kind and payload of each event.
-- Returns the first event's seq.
local b, id, s, cap, channel = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local n = (#ARGV - 5) / 2
local first = redis.call('HINCRBY', b..'q', s, n) - n + 1
local key = b..'e:'..s
local finished = false
for i = 0, n - 1 do
  local kind = ARGV[6 + 2 * i]
  redis.call('XADD', key, 'MAXLEN', cap, '0-'..(first + i), 'k', kind, 'p', ARGV[7 + 2 * i])
  if kind == '2' then
    redis.call('HSET', b..'f', s, 1)
    finished = true
  end
end
redis.call('SADD', b..'ss', s)
local e = redis.call('HGET', KEYS[1], 'expires')
-- The per-session keys carry the session's expiry from their first write on
-- (touch_session.lua moves them all together): set it on those this script
-- created, found by their missing TTL, and on the event stream.
local keys = {key}
if redis.call('PTTL', b..'ss') < 0 then
  keys = {key, b..'ss', b..'q', b..'f'}
elseif finished and redis.call('PTTL', b..'f') < 0 then
  keys = {key, b..'f'}
end
for _, k in ipairs(keys) do
  if e then redis.call('PEXPIREAT', k, e) else redis.call('PEXPIRE', k, 3600000) end
end
if channel ~= '' then redis.call('PUBLISH', channel, id..'\n'..s..'\n'..(first + n - 1)) end
return first
