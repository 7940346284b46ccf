-- Layout 1 → 2, a page of key/value records (single server only): renames
-- each `P kv:NS:KEY` to its tagged name and raises its slot's revision
-- counter to at least the old shared one, so no revision is handed out twice.
-- KEYS: none. ARGV: the old shared counter, then each record's old key, new
-- key and new counter.
-- Returns the number of records renamed.
local old = tonumber(redis.call('GET', ARGV[1]) or '0')
local n = 0
for i = 2, #ARGV, 3 do
  if redis.call('EXISTS', ARGV[i]) == 1 then
    redis.call('RENAME', ARGV[i], ARGV[i + 1])
    n = n + 1
  end
  if old > tonumber(redis.call('GET', ARGV[i + 2]) or '0') then redis.call('SET', ARGV[i + 2], old) end
end
return n
