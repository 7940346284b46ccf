-- Layout 1 → 2, a page of sessions (single server only: layout 1 never ran
-- on a cluster). Renames each session's keys from `P s:ID`, `P ss:ID`,
-- `P e:ID:STREAM`, `P q:ID`, `P f:ID`, `P c:ID` to the tagged layout
-- `B s`, `B ss`, `B e:STREAM`, `B q`, `B f`, `B c` (B = `P{tag}:`), keeping
-- values and TTLs. Keys that do not exist (expired) are skipped.
-- KEYS: none (layout 1 keys are built from the prefix).
-- ARGV: prefix, then each session's id and new key base.
-- Returns the number of keys renamed.
local p = ARGV[1]
local n = 0
local function move(from, to)
  if redis.call('EXISTS', from) == 1 then
    redis.call('RENAME', from, to)
    n = n + 1
  end
end
for i = 2, #ARGV, 2 do
  local id, b = ARGV[i], ARGV[i + 1]
  for _, s in ipairs(redis.call('SMEMBERS', p..'ss:'..id)) do move(p..'e:'..id..':'..s, b..'e:'..s) end
  move(p..'s:'..id, b..'s')
  for _, x in ipairs({'ss', 'q', 'f', 'c'}) do move(p..x..':'..id, b..x) end
end
return n
