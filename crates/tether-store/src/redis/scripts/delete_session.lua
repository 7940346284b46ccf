-- Deletes a session with everything it holds (drop_session.lua).
-- KEYS: none (keys are built from the prefix).
-- ARGV: prefix, id.
-- Returns 1 if the session existed, else 0.
return drop(ARGV[1], ARGV[2])
