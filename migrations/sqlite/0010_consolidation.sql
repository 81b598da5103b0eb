-- Consolidation; the same design as the Postgres migration
-- 0011_consolidation.sql (read its comments).
alter table memories add column consolidated_at integer;
create index memories_unconsolidated on memories (tenant_id, agent_id, created_at)
    where tier = 'episodic' and consolidated_at is null;
create index memories_summaries on memories (tenant_id)
    where json_extract(metadata, '$.consolidation') is not null;

create table consolidation_jobs (
    id            blob    primary key check (length(id) = 16),
    tenant_id     text    not null,
    agent_id      text    not null,
    state         text    not null check (state in ('queued', 'running', 'completed', 'failed')),
    requested_by  text    not null,
    requested_at  integer not null,
    cutoff        integer not null,
    started_at    integer,
    finished_at   integer,
    report        text    not null default '{}' check (json_valid(report)),
    error         text
);
create index consolidation_jobs_open on consolidation_jobs (requested_at) where state in ('queued', 'running');
