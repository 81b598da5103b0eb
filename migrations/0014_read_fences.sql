-- Deletions a read replica must hold before it may serve a tenant's reads.
-- A deleting transaction (an erasure's acceptance, a memory deleted by id)
-- raises its tenant's generation in the same transaction as the deletes. A
-- replica that shows the same generation as the primary has replayed every
-- such deletion, since the row and the deletes commit together; one that
-- shows less has not, and the read goes to the primary instead. One row per
-- tenant that ever deleted; reading it is a primary-key lookup on each side.
CREATE TABLE read_fences (
    tenant_id   text   PRIMARY KEY,
    generation  bigint NOT NULL
);
