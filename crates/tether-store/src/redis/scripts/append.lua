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
-- Mode 'above' is an append by the process that runs the stream's request,
-- which may have seen a failover take back what it wrote (`normal`
-- durability): the first event is numbered above `floor` (the highest
-- number the caller was given on the stream), so a number a client may
-- hold is never given to another event, and a stream lost altogether
-- starts again with its priming event `restart` at 1, where it stood
-- (every request stream starts with it). With no events, only that restart.
-- Keys (ARGV[k + 1]): the session hash (`P{id}:s`; every key used is in its slot).
-- Arguments (ARGV[a + 1] … ARGV[a + n]): key base (`P{id}:`), session id,
-- stream, cap, then either 'done', the number of events, the events as
-- records.lua reads them and how long to keep them (ms), or 'add' and the
-- kind and payload of each event, or 'above', the floor, the restart
-- payload and the kind and payload of each event (none or more).
-- Returns the first event's seq ('above' with no events: 1 if the stream
-- was started again, else 0).
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
  local events, floor, restart = {}, 0, nil
  if mode == 'done' then
    events = records(ARGV[a + 7])
  else
    local from = a + 6
    if mode == 'above' then
      floor, restart, from = tonumber(ARGV[a + 6]), ARGV[a + 7], a + 8
    end
    for i = from, a + n, 2 do events[#events + 1] = {ARGV[i], ARGV[i + 1]} end
  end
  local stored = redis.call('GET', whole)
  if stored then
    for _, r in ipairs(records(stored)) do
      redis.call('XADD', key, 'MAXLEN', cap, '0-*', 'k', r[1], 'p', r[2])
    end
    redis.call('DEL', whole)
  end
  local first, last, kind
  if restart and redis.call('EXISTS', key) == 0 then
    redis.call('XADD', key, 'MAXLEN', cap, '0-1', 'k', '0', 'p', restart)
    last, kind = 1, '0'
  elseif #events == 0 then
    return 0
  end
  for i, r in ipairs(events) do
    local at = '0-*'
    if i == 1 and floor > 0 then
      -- Numbered after the stream's last entry anyway: above the floor
      -- only where the store lost what the caller was given.
      local top = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)[1]
      if not top or tonumber(string.sub(top[1], 3)) <= floor then at = '0-'..(floor + 1) end
    end
    kind = r[1]
    last = tonumber(string.sub(redis.call('XADD', key, 'MAXLEN', cap, at, 'k', kind, 'p', r[2]), 3))
    first = first or last
  end
  expire(key)
  if kind ~= '2' then
    redis.call('SADD', b..'ss', s)
    expire(b..'ss')
  elseif (first or last) > 1 or restart then
    redis.call('SREM', b..'ss', s)
  end
  notes[#notes + 1] = id..'\n'..s..'\n'..last
  return first or last
end
