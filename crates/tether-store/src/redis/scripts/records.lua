-- Not a script of its own: prepended to the scripts that read a finished
-- stream stored whole (`P{id}:d:{stream}`, written by append.lua).
-- records(blob): the events of such a stream, in order, as {kind, payload};
-- the blob is, per event, its kind (one digit), its payload's length in
-- decimal, ':' and the payload.
local function records(blob)
  local out, pos = {}, 1
  while pos <= #blob do
    local colon = string.find(blob, ':', pos, true)
    local len = tonumber(string.sub(blob, pos + 1, colon - 1))
    out[#out + 1] = {string.sub(blob, pos, pos), string.sub(blob, colon + 1, colon + len)}
    pos = colon + len + 1
  end
  return out
end
