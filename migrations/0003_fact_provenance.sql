-- Where a fact came from, and facts kept as candidates.
--
-- The contradiction rule (src/domain/facts.rs) weighs the source of a fact
-- before its confidence: a user's statement outranks the agent's, which
-- outranks a tool's, a shared memory's and a consolidated one's. The server
-- sets `source` from the route and key that wrote the fact; rows written
-- before this column existed came through the memory routes, so 'agent'.
--
-- A new fact that loses its slot to the current one is stored as a
-- candidate: `contested_by` names the fact it lost to, and its validity
-- interval is empty (valid_until = valid_from), so every path that reads
-- valid facts only (recall, listing, dedup, the contradiction lookup) leaves
-- it out without a change. History shows it beside the fact it contests.
ALTER TABLE semantic_memory
    ADD COLUMN source text NOT NULL DEFAULT 'agent'
        CHECK (source IN ('user', 'agent', 'tool', 'shared', 'consolidated')),
    ADD COLUMN contested_by uuid;

-- History: the candidates contesting a fact.
CREATE INDEX semantic_tenant_contested ON semantic_memory (tenant_id, contested_by)
    WHERE contested_by IS NOT NULL;
-- Dedup of a candidate said again: the write path looks candidates up by
-- content hash beside the valid facts (semantic_dedup covers those).
CREATE INDEX semantic_candidate_hash ON semantic_memory (tenant_id, agent_id, namespace, content_hash)
    WHERE contested_by IS NOT NULL;
