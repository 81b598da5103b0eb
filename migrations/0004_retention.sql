-- Retention sweeps: find expired rows without scanning the tables.
--
-- Partial indexes: permanent rows (expires_at NULL) never expire and stay
-- out. On the partitioned episodic table the index is created on every
-- partition, present and future. Migrations run in a transaction, so these
-- are built without CONCURRENTLY: on a large existing table the build blocks
-- writes to that table until it finishes.
CREATE INDEX episodic_expires ON episodic_memory (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX semantic_expires ON semantic_memory (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX procedural_expires ON procedural_memory (expires_at) WHERE expires_at IS NOT NULL;
