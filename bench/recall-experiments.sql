-- Index experiments behind the suggestions in RESULTS.md ("Recall latency"),
-- run by hand on the benchmark's own database after scripts/bench-recall.sh
-- (which leaves the queries and their vectors in bench_recall_query):
--
--   psql -X -h 127.0.0.1 -p 54329 -U engram -d engram_bench_recall -f bench/recall-experiments.sql
--
-- It copies agent rows into scratch tables (exp_*), builds the variants, and
-- times the same statement shapes as the server's legs with the server's
-- settings (ef_search 100, iterative relaxed_order, max_scan_tuples 20000),
-- server-side (no client, no decoding). The scratch tables are dropped at the
-- end; the engram tables are not touched. Takes about 15 minutes on 2 cores.

\set ON_ERROR_STOP on
\timing off
SET client_min_messages = warning;
SET hnsw.ef_search = 100;
SET hnsw.iterative_scan = relaxed_order;
SET hnsw.max_scan_tuples = 20000;
SET maintenance_work_mem = '1GB';
SET max_parallel_maintenance_workers = 1;
CREATE EXTENSION IF NOT EXISTS btree_gin;

-- Milliseconds (p50, p95, mean) of `stmt` over the first `n` queries of `agent`;
-- in `stmt`, $1 is the query vector, $2 the agent, $3 the claim's text.
CREATE FUNCTION pg_temp.timed(stmt text, agent text, n int)
RETURNS TABLE (p50 numeric, p95 numeric, mean numeric, rows_mean numeric) LANGUAGE plpgsql AS $$
DECLARE
    q record;
    t0 timestamptz;
    c bigint;
    ms float8[] := '{}';
    rs float8[] := '{}';
BEGIN
    FOR q IN SELECT embedding, claim FROM bench_recall_query WHERE agent_id = agent ORDER BY i LIMIT n LOOP
        t0 := clock_timestamp();
        EXECUTE 'SELECT count(*) FROM (' || stmt || ') s' INTO c USING q.embedding, agent, q.claim;
        ms := ms || (extract(epoch FROM clock_timestamp() - t0) * 1000)::float8;
        rs := rs || c::float8;
    END LOOP;
    RETURN QUERY SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY x)::numeric, 1),
                        round(percentile_cont(0.95) WITHIN GROUP (ORDER BY x)::numeric, 1),
                        round(avg(x)::numeric, 1),
                        (SELECT round(avg(y)::numeric, 1) FROM unnest(rs) y)
                 FROM unnest(ms) x;
END
$$;

-- Recall@20 of `stmt` (an ANN statement returning ids, best first, LIMIT 20)
-- against the same statement with index scans off, over `n` queries.
CREATE FUNCTION pg_temp.recall(stmt text, agent text, n int) RETURNS numeric LANGUAGE plpgsql AS $$
DECLARE
    q record;
    a uuid[];
    e uuid[];
    total float8 := 0;
    k int := 0;
BEGIN
    FOR q IN SELECT embedding, claim FROM bench_recall_query WHERE agent_id = agent ORDER BY i LIMIT n LOOP
        EXECUTE 'SELECT array_agg(id) FROM (' || stmt || ') s' INTO a USING q.embedding, agent, q.claim;
        PERFORM set_config('enable_indexscan', 'off', true);
        EXECUTE 'SELECT array_agg(id) FROM (' || stmt || ') s' INTO e USING q.embedding, agent, q.claim;
        PERFORM set_config('enable_indexscan', 'on', true);
        total := total + cardinality(ARRAY(SELECT unnest(a) INTERSECT SELECT unnest(e)))::float8
                         / greatest(cardinality(e), 1);
        k := k + 1;
    END LOOP;
    RETURN round((total / k)::numeric, 3);
END
$$;

\echo '== scratch copies of episodic_memory (one table, no partitions)'
-- IF NOT EXISTS: a run that stopped half-way is resumed without rebuilding.
CREATE TABLE IF NOT EXISTS exp_episodic_flat AS
    SELECT id, tenant_id, agent_id, expires_at, embedding_model, embedding, search_tsv FROM episodic_memory;
CREATE INDEX IF NOT EXISTS exp_flat_agent ON exp_episodic_flat (tenant_id, agent_id);
CREATE INDEX IF NOT EXISTS exp_flat_hnsw ON exp_episodic_flat USING hnsw ((embedding::vector(384)) vector_cosine_ops)
    WITH (m = 16, ef_construction = 200) WHERE embedding_model = 'lexical-hash-v1-384';
CREATE TABLE IF NOT EXISTS exp_episodic_half AS SELECT id, tenant_id, agent_id, expires_at, embedding_model, embedding FROM episodic_memory;
CREATE INDEX IF NOT EXISTS exp_half_agent ON exp_episodic_half (tenant_id, agent_id);
CREATE INDEX IF NOT EXISTS exp_half_hnsw ON exp_episodic_half USING hnsw ((embedding::halfvec(384)) halfvec_cosine_ops)
    WITH (m = 16, ef_construction = 200) WHERE embedding_model = 'lexical-hash-v1-384';
VACUUM ANALYZE exp_episodic_flat;
VACUUM ANALYZE exp_episodic_half;
SELECT relname, pg_size_pretty(pg_relation_size(oid)) FROM pg_class
WHERE relname IN ('exp_flat_hnsw', 'exp_half_hnsw') ORDER BY 1;

-- One variant of the episodic vector leg at one ef_search: latency for agent A
-- and the 10K agent (after a warm-up pass), and recall@20 for agent A.
CREATE FUNCTION pg_temp.vector_variant(label text, source text, distance text, ef int)
RETURNS TABLE (variant text, ef_search int, a_p50 numeric, a_p95 numeric, b01_p50 numeric, b01_p95 numeric,
               a_recall20 numeric) LANGUAGE plpgsql AS $$
DECLARE
    filters text := 'embedding_model = ''lexical-hash-v1-384'' AND tenant_id = ''bench-recall'' AND agent_id = $2 '
                    'AND (expires_at IS NULL OR expires_at > now())';
    stmt text := 'SELECT id FROM ' || source || ' WHERE ' || filters || ' ORDER BY ' || distance;
    a record;
    b record;
BEGIN
    PERFORM set_config('hnsw.ef_search', ef::text, false);
    PERFORM pg_temp.timed(stmt || ' LIMIT 40', 'agent-a', 50);
    SELECT * INTO a FROM pg_temp.timed(stmt || ' LIMIT 40', 'agent-a', 200);
    SELECT * INTO b FROM pg_temp.timed(stmt || ' LIMIT 40', 'agent-b01', 200);
    RETURN QUERY SELECT label, ef, a.p50, a.p95, b.p50, b.p95, pg_temp.recall(stmt || ' LIMIT 20', 'agent-a', 100);
    PERFORM set_config('hnsw.ef_search', '100', false);
END
$$;

\echo '== episodic vector leg, LIMIT 40: 7 monthly partitions (as today) vs one table vs one table with halfvec'
SELECT * FROM pg_temp.vector_variant('partitioned (today)', 'episodic_memory', 'embedding::vector(384) <=> $1', 100)
UNION ALL SELECT * FROM pg_temp.vector_variant('partitioned (today)', 'episodic_memory', 'embedding::vector(384) <=> $1', 40)
UNION ALL SELECT * FROM pg_temp.vector_variant('one table', 'exp_episodic_flat', 'embedding::vector(384) <=> $1', 100)
UNION ALL SELECT * FROM pg_temp.vector_variant('one table', 'exp_episodic_flat', 'embedding::vector(384) <=> $1', 200)
UNION ALL SELECT * FROM pg_temp.vector_variant('one table', 'exp_episodic_flat', 'embedding::vector(384) <=> $1', 400)
UNION ALL SELECT * FROM pg_temp.vector_variant('one table, halfvec', 'exp_episodic_half', 'embedding::halfvec(384) <=> $1::halfvec(384)', 100)
UNION ALL SELECT * FROM pg_temp.vector_variant('one table, halfvec', 'exp_episodic_half', 'embedding::halfvec(384) <=> $1::halfvec(384)', 200)
UNION ALL SELECT * FROM pg_temp.vector_variant('one table, halfvec', 'exp_episodic_half', 'embedding::halfvec(384) <=> $1::halfvec(384)', 400);

\echo '== the same, exact (index scans off; a bitmap scan of the agent''s rows and a sort)'
SET enable_indexscan = off;
SELECT a.agent, t.* FROM (VALUES ('agent-a'), ('agent-b01')) a(agent),
    pg_temp.timed('SELECT id FROM exp_episodic_flat WHERE embedding_model = ''lexical-hash-v1-384'' AND tenant_id = ''bench-recall'' AND agent_id = $2 AND (expires_at IS NULL OR expires_at > now()) ORDER BY embedding::vector(384) <=> $1 LIMIT 40', a.agent, 50) t;
RESET enable_indexscan;

\echo '== episodic text leg (OR of the lexemes, ts_rank, LIMIT 40 of at most N matches): GIN on search_tsv (as today) vs GIN on (tenant_id, agent_id, search_tsv); each after a warm-up pass'
\set tsq '(SELECT to_tsquery(''simple'', string_agg(quote_literal(lexeme), '' | '')) FROM unnest(to_tsvector(''english'', $3)))'
\set text_head 'SELECT id FROM (SELECT id, search_tsv FROM exp_episodic_flat WHERE tenant_id = ''bench-recall'' AND agent_id = $2 AND (expires_at IS NULL OR expires_at > now()) AND search_tsv @@ '
\set text_tail ') m ORDER BY ts_rank(search_tsv, ' :tsq ') DESC LIMIT 40'
DROP INDEX IF EXISTS exp_flat_agent_tsv;
CREATE INDEX IF NOT EXISTS exp_flat_tsv ON exp_episodic_flat USING gin (search_tsv);
ANALYZE exp_episodic_flat;
SELECT count(*) FROM pg_temp.timed(:'text_head' || :'tsq' || ' LIMIT 2000' || :'text_tail', 'agent-a', 50);
SELECT 'GIN (search_tsv), 2000 matches' AS variant, a.agent, t.* FROM (VALUES ('agent-a'), ('agent-b01')) a(agent),
    pg_temp.timed(:'text_head' || :'tsq' || ' LIMIT 2000' || :'text_tail', a.agent, 200) t
UNION ALL
SELECT 'GIN (search_tsv), 300 matches', a.agent, t.* FROM (VALUES ('agent-a'), ('agent-b01')) a(agent),
    pg_temp.timed(:'text_head' || :'tsq' || ' LIMIT 300' || :'text_tail', a.agent, 200) t;
DROP INDEX exp_flat_tsv;
CREATE INDEX IF NOT EXISTS exp_flat_agent_tsv ON exp_episodic_flat USING gin (tenant_id, agent_id, search_tsv);
ANALYZE exp_episodic_flat;
SELECT count(*) FROM pg_temp.timed(:'text_head' || :'tsq' || ' LIMIT 2000' || :'text_tail', 'agent-a', 50);
SELECT 'GIN (tenant_id, agent_id, search_tsv), 2000 matches' AS variant, a.agent, t.* FROM (VALUES ('agent-a'), ('agent-b01')) a(agent),
    pg_temp.timed(:'text_head' || :'tsq' || ' LIMIT 2000' || :'text_tail', a.agent, 200) t
UNION ALL
SELECT 'GIN (tenant_id, agent_id, search_tsv), 300 matches', a.agent, t.* FROM (VALUES ('agent-a'), ('agent-b01')) a(agent),
    pg_temp.timed(:'text_head' || :'tsq' || ' LIMIT 300' || :'text_tail', a.agent, 200) t;

\echo '== plans of one text query on each index (agent-a, 2000 matches)'
PREPARE text_q(text) AS SELECT id FROM (SELECT id, search_tsv FROM exp_episodic_flat WHERE tenant_id = 'bench-recall' AND agent_id = 'agent-a' AND (expires_at IS NULL OR expires_at > now()) AND search_tsv @@ (SELECT to_tsquery('simple', string_agg(quote_literal(lexeme), ' | ')) FROM unnest(to_tsvector('english', $1))) LIMIT 2000) m ORDER BY ts_rank(search_tsv, (SELECT to_tsquery('simple', string_agg(quote_literal(lexeme), ' | ')) FROM unnest(to_tsvector('english', $1)))) DESC LIMIT 40;
SELECT claim AS first_claim FROM bench_recall_query WHERE agent_id = 'agent-a' ORDER BY i LIMIT 1 \gset
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE text_q(:'first_claim');
DROP INDEX exp_flat_agent_tsv;
CREATE INDEX exp_flat_tsv ON exp_episodic_flat USING gin (search_tsv);
ANALYZE exp_episodic_flat;
DEALLOCATE text_q;
PREPARE text_q(text) AS SELECT id FROM (SELECT id, search_tsv FROM exp_episodic_flat WHERE tenant_id = 'bench-recall' AND agent_id = 'agent-a' AND (expires_at IS NULL OR expires_at > now()) AND search_tsv @@ (SELECT to_tsquery('simple', string_agg(quote_literal(lexeme), ' | ')) FROM unnest(to_tsvector('english', $1))) LIMIT 2000) m ORDER BY ts_rank(search_tsv, (SELECT to_tsquery('simple', string_agg(quote_literal(lexeme), ' | ')) FROM unnest(to_tsvector('english', $1)))) DESC LIMIT 40;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE text_q(:'first_claim');

DROP TABLE exp_episodic_flat, exp_episodic_half;
