-- The rows whose vector is missing or of another model than the configured
-- one, found through an index.
--
-- The re-embedding job asks for them every minute, whether or not any
-- exist; without an index that was a scan of every memory row (about 1.2 s
-- of a core at a million memories, each minute). The job's statements ask
-- for NULL, lower or higher than the model's name, each a range of this
-- index; with every row on one model all three ranges are empty. Equal keys
-- are stored once per leaf page with their row pointers (B-tree
-- deduplication), so the index stays small.

CREATE INDEX episodic_embedding_model ON episodic_memory (embedding_model);
CREATE INDEX semantic_embedding_model ON semantic_memory (embedding_model);
CREATE INDEX procedural_embedding_model ON procedural_memory (embedding_model);
