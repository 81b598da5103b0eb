-- The full-text leg searches one agent's memories, so its index is keyed by
-- tenant and agent as well as by the words.
--
-- A GIN index on `search_tsv` alone returns every row of every agent that
-- holds one of the query's words; the agent filter then runs on the heap
-- rows, so the leg's cost grew with the whole table, not with the agent
-- searched: a small agent among many large ones paid for all of them. With
-- `btree_gin` the tenant and agent are keys of the same GIN index and are
-- intersected with the words' posting lists inside it. `btree_gin` ships
-- with PostgreSQL (contrib) and is a trusted extension: a database owner can
-- create it without superuser rights.

CREATE EXTENSION IF NOT EXISTS btree_gin;

DROP INDEX IF EXISTS episodic_search_tsv;
CREATE INDEX episodic_search_tsv ON episodic_memory USING gin (tenant_id, agent_id, search_tsv);
DROP INDEX IF EXISTS semantic_search_tsv;
CREATE INDEX semantic_search_tsv ON semantic_memory USING gin (tenant_id, agent_id, search_tsv);
DROP INDEX IF EXISTS procedural_search_tsv;
CREATE INDEX procedural_search_tsv ON procedural_memory USING gin (tenant_id, agent_id, search_tsv);
