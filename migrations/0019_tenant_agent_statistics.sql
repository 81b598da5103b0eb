-- The planner's share of each (tenant, agent) in the memory tables.
--
-- The recall legs size the searched agent from the planner's statistics:
-- the vector leg walks the HNSW graph of a large agent's partition and
-- compares a small agent's vectors exactly, the text leg leaves out the
-- words too common in a large agent's rows. agent_id's own statistics count
-- one agent name over every tenant, so an agent called "support" that is
-- large in one tenant would look large in all of them. These statistics keep
-- the most common (tenant_id, agent_id) pairs; ANALYZE (and autovacuum's)
-- fills them, the first time here.

CREATE STATISTICS episodic_memory_tenant_agent (mcv) ON tenant_id, agent_id FROM episodic_memory;
CREATE STATISTICS semantic_memory_tenant_agent (mcv) ON tenant_id, agent_id FROM semantic_memory;
CREATE STATISTICS procedural_memory_tenant_agent (mcv) ON tenant_id, agent_id FROM procedural_memory;

ANALYZE episodic_memory, semantic_memory, procedural_memory;
