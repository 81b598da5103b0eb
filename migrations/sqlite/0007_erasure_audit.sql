-- Erasure (the right to be forgotten) and the audit log; the same design as
-- the Postgres migration 0006 (read its comments): the request is stored
-- before it is acknowledged, its rows are claimed and hidden (expires_at set
-- to the request time) in the same transaction, and deleted right after.
create table erasures (
    id            blob    primary key check (length(id) = 16),
    tenant_id     text    not null,
    selector      text    not null check (json_valid(selector)),
    requested_by  text    not null,
    state         text    not null check (state in ('pending', 'running', 'retrying', 'completed', 'failed')),
    attempts      integer not null default 0,
    last_error    text,
    receipt       text    check (receipt is null or json_valid(receipt)),
    requested_at  integer not null,
    completed_at  integer,
    updated_at    integer not null
);
create index erasures_unfinished on erasures (requested_at) where state in ('pending', 'running', 'retrying');
create index erasures_tenant on erasures (tenant_id, requested_at);

create table erasure_items (
    tenant_id   text not null,
    id          blob not null check (length(id) = 16),
    erasure_id  blob not null,
    tier        text not null check (tier in ('episodic', 'semantic', 'procedural')),
    primary key (tenant_id, id)
);
create index erasure_items_erasure on erasure_items (erasure_id);

-- The facts derived from a subject's episodes (its rows are found through
-- memories_tenant_user, from 0001).
create index memories_tenant_source_episode on memories (tenant_id, source_episode_id)
    where source_episode_id is not null;

-- One hash chain per tenant (see the Postgres migration).
create table audit_log (
    seq        integer primary key autoincrement,
    tenant_id  text    not null,
    at         integer not null,
    actor      text    not null,
    operation  text    not null,
    target     text    not null,
    counts     text    not null,
    prev_hash  text    not null,
    hash       text    not null
);
create index audit_log_tenant on audit_log (tenant_id, seq);

create trigger audit_log_no_update before update on audit_log
begin
    select raise(abort, 'audit_log is append-only');
end;
create trigger audit_log_no_delete before delete on audit_log
begin
    select raise(abort, 'audit_log is append-only');
end;
