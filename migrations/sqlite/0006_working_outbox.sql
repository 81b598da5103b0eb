-- The working-memory entries of committed batches that the working_memory
-- table may not have yet (Postgres migration 0005 says why). Working memory
-- is a table here too, but it is written after the batch's transaction, as
-- on Postgres and Redis, so both backends complete a batch the same way.
create table working_outbox (
    tenant_id        text    not null,
    id               blob    not null,
    idempotency_key  text,
    entry            text    not null,
    created_at       integer not null,
    updated_at       integer not null,
    primary key (tenant_id, id)
);
create index working_outbox_key on working_outbox (tenant_id, idempotency_key);
create index working_outbox_created on working_outbox (created_at);
