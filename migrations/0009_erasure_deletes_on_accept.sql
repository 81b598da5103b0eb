-- Erasure on Postgres deletes the subject's rows in the transaction that
-- accepts it, instead of hiding them by moving `expires_at`.
--
-- Moving `expires_at` changed an indexed column, so every hidden row got a
-- new version entered into every index of its table, each HNSW graph
-- included: the slowest statement of an erasure, run while the client waited
-- for its 202. A DELETE only marks the rows dead, and reads stop seeing them
-- at commit, as before.
--
-- The verification after the purge searches each model's HNSW index with a
-- few of the erased rows' own vectors; with the rows deleted on acceptance
-- those vectors are kept here, at most a few per tier and erasure, until the
-- erasure is finished, then deleted and vacuumed away with the claims.
CREATE TABLE erasure_probes (
    tenant_id        text   NOT NULL,
    erasure_id       uuid   NOT NULL,
    tier             text   NOT NULL CHECK (tier IN ('episodic', 'semantic', 'procedural')),
    embedding_model  text   NOT NULL,
    embedding        vector NOT NULL
);
CREATE INDEX erasure_probes_erasure ON erasure_probes (erasure_id);

-- With the rows gone at acceptance, a claim keeps the user its row had, so
-- an unfinished erasure of a user's memories (by id) can still be found by
-- the user (a legal hold waits for it).
ALTER TABLE erasure_items ADD COLUMN user_id text;
