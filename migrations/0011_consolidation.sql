-- Consolidation (src/domain/consolidate.rs): episodes summarised and read
-- for facts in the background.
--
-- An episode is consolidated once: `consolidated_at` is set in the same
-- transaction that writes what was made from it, so a crash leaves either
-- both or neither. The partial index holds only the waiting episodes, which
-- is what the scheduler counts and a run reads.
ALTER TABLE episodic_memory ADD COLUMN consolidated_at timestamptz;
CREATE INDEX episodic_unconsolidated ON episodic_memory (tenant_id, agent_id, created_at)
    WHERE consolidated_at IS NULL;

-- A summary names its episodes in metadata.consolidation.source_episode_ids;
-- erasure follows an episode to its summaries through this index.
CREATE INDEX episodic_summaries_of ON episodic_memory
    USING gin ((metadata->'consolidation'->'source_episode_ids'));

-- Runs asked for through the API and by the schedule; any replica may take a
-- queued one, and one left running by a process that died is taken again.
CREATE TABLE consolidation_jobs (
    id            uuid        PRIMARY KEY,
    tenant_id     text        NOT NULL,
    agent_id      text        NOT NULL,
    state         text        NOT NULL CHECK (state IN ('queued', 'running', 'completed', 'failed')),
    requested_by  text        NOT NULL,
    requested_at  timestamptz NOT NULL,
    cutoff        timestamptz NOT NULL,
    started_at    timestamptz,
    finished_at   timestamptz,
    report        jsonb       NOT NULL DEFAULT '{}',
    error         text
);
CREATE INDEX consolidation_jobs_open ON consolidation_jobs (requested_at) WHERE state IN ('queued', 'running');
