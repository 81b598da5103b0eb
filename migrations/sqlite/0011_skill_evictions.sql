-- Skills whose cached copy must go (Postgres migration 0013 says why). The
-- embedded skill cache lives in the process, so its evictions cannot fail;
-- the rows are kept the same way on both backends all the same.
create table skill_evictions (
    eviction_id  blob    primary key,
    tenant_id    text    not null,
    id           blob    not null,
    created_at   integer not null
);
create index skill_evictions_created on skill_evictions (created_at);
