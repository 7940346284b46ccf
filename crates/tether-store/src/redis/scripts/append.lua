-- Appends events to a session's stream, numbered after its last one, in
-- one step. An operation of a batch (`redis/batch.rs`); records.lua comes
-- first.
-- A stream that starts with its final event (a quick request's answer,
-- mode 'done') is stored whole as one string, `P{id}:d:{stream}`
-- (records.lua), kept for the time given (the session TTL), unless the
-- stream exists: a Redis Stream key costs its server a 4 KiB node. Any
-- other append goes to a Redis Stream, `P{id}:e:{stream}`, each event an entry with ID 0-{seq} (`0-*`: Redis
-- numbers it after the stream's last ID, which trimming keeps), capped at
-- its newest `cap` entries; a stream stored whole that gets more events is
-- moved there first. A stream whose last event is not final (kind 2) is
-- open: it is listed in `ss` and expires with the session
-- (touch_session.lua moves it). A final event closes it: it leaves `ss` and
-- keeps the session's expiry of that moment (kept for replay about one
-- session TTL, then gone on its own). Leaves the announcement
-- "{session}\n{stream}\n{last seq}" in `notes` (published once per batch;
-- on a cluster the caller announces it on a sharded channel).
-- Keys (ARGV[k + 1]): the session hash (`P{id}:s`; every key used is in its slot).
-- Arguments (ARGV[a + 1] … ARGV[a + n]): key base (`P{id}:`), session id,
-- stream, cap, then either 'done', the number of events, the events as
-- records.lua reads them and how long to keep them (ms), or 'add' and the
-- kind and payload of each event.
-- Returns the first event's seq.
local function op(k, a, n, notes)
  local b, id, s, cap, mode = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5]
  local key, whole = b..'e:'..s, b..'d:'..s
  if mode == 'done' and redis.call('EXISTS', key) == 0
      and redis.call('SET', whole, ARGV[a + 7], 'PX', ARGV[a + 8], 'NX') then
    notes[#notes + 1] = id..'\n'..s..'\n'..ARGV[a + 6]
    return 1
  end
  local e = redis.call('HGET', ARGV[k + 1], 'expires')
  local function expire(name)
    if e then redis.call('PEXPIREAT', name, e) else redis.call('PEXPIRE', name, 3600000) end
  end
  local events = {}
  if mode == 'done' then
    events = records(ARGV[a + 7])
  else
    for i = a + 6, a + n, 2 do events[#events + 1] = {ARGV[i], ARGV[i + 1]} end
  end
  local stored = redis.call('GET', whole)
  if stored then
    for _, r in ipairs(records(stored)) do
      redis.call('XADD', key, 'MAXLEN', cap, '0-*', 'k', r[1], 'p', r[2])
    end
    redis.call('DEL', whole)
  end
  local first, last, kind
  for _, r in ipairs(events) do
    kind = r[1]
    last = tonumber(string.sub(redis.call('XADD', key, 'MAXLEN', cap, '0-*', 'k', kind, 'p', r[2]), 3))
    first = first or last
  end
  expire(key)
  if kind ~= '2' then
    redis.call('SADD', b..'ss', s)
    expire(b..'ss')
  elseif first > 1 then
    redis.call('SREM', b..'ss', s)
  end
  notes[#notes + 1] = id..'\n'..s..'\n'..last
  return first
end
