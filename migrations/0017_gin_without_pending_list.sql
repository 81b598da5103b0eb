-- The agent-words indexes (0015) insert new entries in place.
--
-- GIN's fast update parks new entries in an unsorted pending list, up to
-- gin_pending_list_limit (4 MB) per index, until a vacuum or a full list
-- merges them into the tree. Every search reads that whole list, whatever
-- its words: with a few hundred pages pending, the text leg of an agent with
-- a handful of memories read them all on each request. Without it a write
-- updates the tree at once, which costs that write a little more.
--
-- Switching the option off does not empty the list already there; the
-- cleaning call after it does.

ALTER INDEX episodic_agent_words SET (fastupdate = off);
ALTER INDEX semantic_agent_words SET (fastupdate = off);
ALTER INDEX procedural_agent_words SET (fastupdate = off);

SELECT gin_clean_pending_list('episodic_agent_words'::regclass);
SELECT gin_clean_pending_list('semantic_agent_words'::regclass);
SELECT gin_clean_pending_list('procedural_agent_words'::regclass);
