-- Deletes a session with everything it holds (drop_session.lua).
-- KEYS[1]: the session hash (`P{id}:s`).
-- ARGV: key base (`P{id}:`).
-- Returns the session's principal (for its index entries), or false if it did not exist.
return drop(ARGV[1])
