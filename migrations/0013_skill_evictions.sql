-- Skills whose cached copy must go. A write that changes or deletes a skill
-- adds a row in its own transaction; the writer evicts the cache entry after
-- the commit, and the outbox job evicts again every entry named here and
-- deletes the rows it evicted. So a crash after the commit, or a Redis that
-- was unreachable then and comes back with the old entry, leaves the stale
-- copy readable by any replica for at most one outbox interval, not for the
-- cache's time to live. Evicting twice costs a cache miss, nothing more.
CREATE TABLE skill_evictions (
    -- One row per write (several writes of one skill each add theirs), so
    -- deleting the rows a run evicted never deletes a later write's row.
    eviction_id  uuid        PRIMARY KEY,
    tenant_id    text        NOT NULL,
    id           uuid        NOT NULL,
    created_at   timestamptz NOT NULL
);
CREATE INDEX skill_evictions_created ON skill_evictions (created_at);
