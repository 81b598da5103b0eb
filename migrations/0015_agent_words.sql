-- The full-text leg's index holds each agent's words apart from every other
-- agent's.
--
-- The index of 0012 keys the words, the tenant and the agent side by side in
-- one GIN index. Its tenant key and its agent key each list every row they
-- hold, so a search of a large agent intersected the words' posting lists
-- with all of that agent's rows, and the scan grew with the agent's size
-- however rare the words were (bench/RESULTS.md has the figures).
--
-- Here each lexeme is indexed prefixed by a short key of its row's tenant and
-- agent (`engram_agent_key`), so the posting list of a (agent, word) pair
-- holds just that agent's rows with that word and a search reads only those.
-- The key is 8 hex digits of an MD5: two agents may share one, which costs
-- them extra candidates, never a wrong answer, because the search filters by
-- tenant_id and agent_id on the rows as well. `search_tsv` stays as it was
-- (ranking still reads its positions); the index is on an expression of it,
-- so no row is rewritten.

CREATE FUNCTION engram_agent_key(tenant text, agent text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT left(md5(tenant || chr(31) || agent), 8) || '/' $$;

-- A row's lexemes, each prefixed by its agent's key. A lexeme may be up to
-- 2,047 bytes long and the prefix would push the longest past that limit, so
-- lexemes over 2,000 bytes (no word of any language) are left out of the
-- index. The cost is set high so that the planner reaches a row's agent
-- words through the index, never by computing them for every row of an
-- agent. The search path is fixed at creation because index maintenance
-- (ANALYZE, REINDEX) runs it with only pg_catalog on the path.
CREATE FUNCTION engram_agent_words(tenant text, agent text, words tsvector) RETURNS tsvector
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE COST 10000
    SET search_path FROM CURRENT
    AS $$
        SELECT array_to_tsvector(ARRAY(
            SELECT engram_agent_key(tenant, agent) || w
              FROM unnest(tsvector_to_array(words)) AS w
             WHERE octet_length(w) <= 2000))
    $$;

CREATE INDEX episodic_agent_words ON episodic_memory
    USING gin (engram_agent_words(tenant_id, agent_id, search_tsv));
CREATE INDEX semantic_agent_words ON semantic_memory
    USING gin (engram_agent_words(tenant_id, agent_id, search_tsv));
CREATE INDEX procedural_agent_words ON procedural_memory
    USING gin (engram_agent_words(tenant_id, agent_id, search_tsv));

DROP INDEX episodic_search_tsv;
DROP INDEX semantic_search_tsv;
DROP INDEX procedural_search_tsv;
