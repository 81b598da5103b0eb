-- Sharing between agents of one tenant (src/domain/share.rs).
--
-- Grants say which agent may share with which agents, or with a team (its
-- members at the time of each share). A revoked grant stays as a record.
CREATE TABLE share_grants (
    id             uuid        PRIMARY KEY,
    tenant_id      text        NOT NULL,
    from_agent_id  text        NOT NULL,
    -- Exactly one of the two: the agents, or the team.
    to_agent_ids   text[],
    team           text,
    created_by     text        NOT NULL,
    created_at     timestamptz NOT NULL,
    revoked_by     text,
    revoked_at     timestamptz,
    CHECK ((to_agent_ids IS NULL) <> (team IS NULL))
);
CREATE INDEX share_grants_from ON share_grants (tenant_id, from_agent_id) WHERE revoked_at IS NULL;

CREATE TABLE share_teams (
    tenant_id  text NOT NULL,
    team       text NOT NULL,
    agent_id   text NOT NULL,
    PRIMARY KEY (tenant_id, team, agent_id)
);

-- A copy carries where it came from (`domain::share::Provenance`), shown
-- with it on every route. The copy is the record of the share: shares into
-- an agent are its rows with a provenance, shares out of one are found by
-- the source agent, erasure follows a memory to its copies by the source
-- memory id, and withdrawing a grant finds its copies by the grant id. A
-- share that deduplicated onto a memory the target already had leaves that
-- memory as it was: it is the target's own, not a copy.
ALTER TABLE episodic_memory ADD COLUMN provenance jsonb;
ALTER TABLE semantic_memory ADD COLUMN provenance jsonb;
ALTER TABLE procedural_memory ADD COLUMN provenance jsonb;
CREATE INDEX episodic_copies_of ON episodic_memory (tenant_id, (provenance->>'source_memory_id')) WHERE provenance IS NOT NULL;
CREATE INDEX semantic_copies_of ON semantic_memory (tenant_id, (provenance->>'source_memory_id')) WHERE provenance IS NOT NULL;
CREATE INDEX procedural_copies_of ON procedural_memory (tenant_id, (provenance->>'source_memory_id')) WHERE provenance IS NOT NULL;
CREATE INDEX episodic_copies_by_grant ON episodic_memory (tenant_id, (provenance->>'grant_id')) WHERE provenance IS NOT NULL;
CREATE INDEX semantic_copies_by_grant ON semantic_memory (tenant_id, (provenance->>'grant_id')) WHERE provenance IS NOT NULL;
CREATE INDEX procedural_copies_by_grant ON procedural_memory (tenant_id, (provenance->>'grant_id')) WHERE provenance IS NOT NULL;
CREATE INDEX episodic_copies_from ON episodic_memory (tenant_id, (provenance->>'source_agent_id')) WHERE provenance IS NOT NULL;
CREATE INDEX semantic_copies_from ON semantic_memory (tenant_id, (provenance->>'source_agent_id')) WHERE provenance IS NOT NULL;
CREATE INDEX procedural_copies_from ON procedural_memory (tenant_id, (provenance->>'source_agent_id')) WHERE provenance IS NOT NULL;
