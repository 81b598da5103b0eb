-- Sharing between agents; the same design as the Postgres migration
-- 0010_sharing.sql (read its comments).
create table share_grants (
    id             blob    primary key check (length(id) = 16),
    tenant_id      text    not null,
    from_agent_id  text    not null,
    -- A JSON array of agent ids, or null when the grant names a team.
    to_agent_ids   text    check (to_agent_ids is null or json_valid(to_agent_ids)),
    team           text,
    created_by     text    not null,
    created_at     integer not null,
    revoked_by     text,
    revoked_at     integer,
    check ((to_agent_ids is null) <> (team is null))
);
create index share_grants_from on share_grants (tenant_id, from_agent_id) where revoked_at is null;

create table share_teams (
    tenant_id  text not null,
    team       text not null,
    agent_id   text not null,
    primary key (tenant_id, team, agent_id)
);

alter table memories add column provenance text check (provenance is null or json_valid(provenance));
create index memories_copies_of on memories (tenant_id, json_extract(provenance, '$.source_memory_id'))
    where provenance is not null;
create index memories_copies_by_grant on memories (tenant_id, json_extract(provenance, '$.grant_id'))
    where provenance is not null;
create index memories_copies_from on memories (tenant_id, json_extract(provenance, '$.source_agent_id'))
    where provenance is not null;
