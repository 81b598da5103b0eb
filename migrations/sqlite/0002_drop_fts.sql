-- The full-text leg moved into the process (an inverted index rebuilt from
-- `memories` at open, ranked with bm25 like the FTS5 table was): the FTS5
-- table and the triggers that kept it in step are no longer read, and would
-- only cost every write.
drop trigger if exists memories_fts_insert;
drop trigger if exists memories_fts_delete;
drop trigger if exists memories_fts_update;
drop table if exists memory_fts;
