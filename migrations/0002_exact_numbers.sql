-- Numbers as written: the fractions a client gives (importance, confidence,
-- reward) are kept as the doubles its JSON decimals parse to, so that 0.4
-- reads back as 0.4. In `real` (4 bytes) they were rounded to the nearest
-- float, which reads back as 0.4000000059604645 once widened to a double.
--
-- Every value stored so far was written from a JSON decimal and rounded into
-- `real`, whose 24-bit mantissa keeps about 7 significant digits. Rounding
-- the widened value to 6 decimals (through numeric, which rounds in decimal,
-- half away from zero) recovers what the client wrote for every value of up
-- to 6 decimals, which is what clients send; anything finer was already lost
-- to `real`. avg_reward is a running mean, computed, not written: 6 decimals
-- is as near as `real` ever held it. (success_rate is generated; see below.)
--
-- The value is widened to double precision before numeric: real::numeric
-- keeps only 6 significant digits and would round twice (1.25e-05 stored as
-- 1.2499999e-05 would become 0.000013), while double::numeric keeps 15, so
-- the one rounding is the same as SQLite's migration 0003 makes.
--
-- ALTER COLUMN ... TYPE rewrites each table (and, on episodic_memory, every
-- partition, which inherit the change), under an exclusive lock: it runs once,
-- at start, before the server serves.

ALTER TABLE episodic_memory
    ALTER COLUMN importance TYPE double precision USING round(importance::double precision::numeric, 6)::double precision;

-- The default is set again in the same statement: an altered column keeps its
-- old default cast to the new type, which would be 0.7 rounded into `real`.
ALTER TABLE semantic_memory
    ALTER COLUMN importance TYPE double precision USING round(importance::double precision::numeric, 6)::double precision,
    ALTER COLUMN confidence TYPE double precision USING round(confidence::double precision::numeric, 6)::double precision,
    ALTER COLUMN confidence SET DEFAULT 0.7;

-- success_rate is generated from the counters, and a generated column's
-- expression cannot be changed before Postgres 17 (engram supports 15): it is
-- dropped and added again, dividing in double precision. Dropping it drops the
-- ranking index built on it; the index is dropped first to say so, and built
-- again once both of its columns have their new type. The column moves to the
-- end of the table, which no query depends on (every statement names its
-- columns).
DROP INDEX procedural_tenant_agent_rank;

ALTER TABLE procedural_memory
    DROP COLUMN success_rate,
    ALTER COLUMN importance TYPE double precision USING round(importance::double precision::numeric, 6)::double precision,
    ALTER COLUMN avg_reward TYPE double precision USING round(avg_reward::double precision::numeric, 6)::double precision,
    ALTER COLUMN avg_reward SET DEFAULT 0;

ALTER TABLE procedural_memory
    ADD COLUMN success_rate double precision GENERATED ALWAYS AS (
        CASE WHEN success_count + failure_count = 0 THEN 0.0
             ELSE success_count::double precision / (success_count + failure_count) END
    ) STORED;

-- "The most reliable skills of this agent", without a sort (as in 0001).
CREATE INDEX procedural_tenant_agent_rank ON procedural_memory (tenant_id, agent_id, success_rate DESC, avg_reward DESC);
