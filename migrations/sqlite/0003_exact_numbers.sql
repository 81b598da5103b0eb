-- Numbers as written. SQLite's `real` is already an 8-byte double, but until
-- now engram bound importance, confidence and rewards as 4-byte floats, so a
-- client's 0.4 was stored as 0.4000000059604645; from now on they are bound
-- as doubles and stored exactly as the client's JSON decimal parses.
--
-- Rows written before are rounded to 6 decimals: every one came from a JSON
-- decimal through a 4-byte float (about 7 significant digits), so this
-- recovers what the client wrote for values of up to 6 decimals, which is
-- what clients send. avg_reward is a running mean, computed, not written:
-- 6 decimals is as near as the 4-byte float ever held it, and the Postgres
-- migration (0002_exact_numbers.sql) rounds the same way, so both backends
-- keep agreeing.
--
-- success_rate is a virtual generated column: it was always computed in
-- double precision on read, and only the readers rounded it to a 4-byte
-- float (the note in 0001 about that no longer holds). Nothing to change.
--
-- The rounding is round(x * 1000000) / 1000000.0, not round(x, 6): SQLite's
-- round(x, 6) prints the value and parses it back, and its parser misses the
-- nearest double for some decimals (0.002877 became 0.0028770000000000002).
-- Here round() only yields a whole number, exact in a double, and one IEEE
-- division by 10^6 gives the double nearest to the 6-decimal value, as
-- Postgres's numeric-to-double cast does.
--
-- updated_at is left alone: the memories did not change, their stored
-- representation did.
update memories set
    importance = round(importance * 1000000) / 1000000.0,
    confidence = round(confidence * 1000000) / 1000000.0,
    avg_reward = round(avg_reward * 1000000) / 1000000.0;
