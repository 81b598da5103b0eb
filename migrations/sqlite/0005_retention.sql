-- Retention sweeps: find expired rows without scanning the tables.
--
-- Partial: permanent memories (expires_at null) are most procedural rows and
-- never expire, so they stay out of the index. `tier` first because a sweep
-- deletes one tier per batch (and the text of a deleted memory leaves the
-- in-process indexes by tier-independent ids, so nothing else is needed).
create index memories_tier_expires on memories (tier, expires_at) where expires_at is not null;

-- Working memory's expires_at is a wall-clock deadline (see 0001); the sweep
-- deletes entries past it, oldest deadline first.
create index working_expires on working_memory (expires_at) where expires_at is not null;
