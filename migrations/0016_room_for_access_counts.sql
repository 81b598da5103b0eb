-- Room on every page of the memory tables for the updates that searches
-- cause.
--
-- A search counts an access to the memories it returns (`access_count`,
-- `last_accessed_at`: the frequency and decay of scoring). That update
-- changes no indexed column, so PostgreSQL can write the new row version on
-- the same page without touching any index (a HOT update), but only when the
-- page has room for it. Full pages (the default fill factor of 100) turn each
-- such update into a new row elsewhere and an entry in every index of the
-- table, the HNSW graph included, whose insertion is a graph search of its
-- own: an access count cost several times the search that caused it, in the
-- background but on the same cores.
--
-- New pages are filled to 85 % from now on. Pages already written keep
-- their rows until rewritten (VACUUM FULL or pg_repack at a quiet time; the
-- README, "With Postgres and Redis"); until then each of their rows takes the
-- slow path once and then lives on a page with room.

ALTER TABLE episodic_memory SET (fillfactor = 85);
ALTER TABLE semantic_memory SET (fillfactor = 85);
ALTER TABLE procedural_memory SET (fillfactor = 85);
