-- Where a fact came from, and facts kept as candidates: the same columns as
-- Postgres's migrations/0003_fact_provenance.sql, with its reasons.
-- `source` is set on facts only (NULL on the other tiers); facts stored
-- before it existed came through the memory routes, so 'agent'.
alter table memories add column source text
    check (source is null or source in ('user', 'agent', 'tool', 'shared', 'consolidated'));
alter table memories add column contested_by blob;
update memories set source = 'agent' where tier = 'semantic';

create index memories_semantic_contested on memories (tenant_id, contested_by) where contested_by is not null;
create index memories_semantic_candidate_hash on memories (tenant_id, agent_id, namespace, content_hash)
    where contested_by is not null;
