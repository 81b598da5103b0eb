-- Legal holds; the same design as the Postgres migration 0008 (read its
-- comments). The embedded backend has one writer at a time, so placing a
-- hold and accepting an erasure are serialised without a lock of their own.
create table legal_holds (
    id           blob    primary key check (length(id) = 16),
    tenant_id    text    not null,
    user_id      text    not null,
    reason       text    check (reason is null or length(reason) <= 1000),
    placed_by    text    not null,
    placed_at    integer not null,
    released_by  text,
    released_at  integer,
    created_at   integer not null,
    updated_at   integer not null,
    check ((released_at is null) = (released_by is null))
);
create index legal_holds_active on legal_holds (tenant_id, user_id) where released_at is null;
create index legal_holds_tenant on legal_holds (tenant_id, placed_at);
