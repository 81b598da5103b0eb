//! The two recall legs straight in SQL, built exactly as
//! `src/store/postgres/search.rs` builds them (same text, same binds, same
//! column lists as `rows.rs`), for three measurements the API cannot give:
//! ANN recall against exact search, the legs' own latency without HTTP,
//! JSON and scoring, and their plans (EXPLAIN ANALYZE, BUFFERS).
//!
//! Keep the builders below in step with search.rs; they copy it on purpose
//! (the server's builders are private to the store). One difference: the
//! text leg here searches every word of the query; the server leaves out
//! those too common in the agent's rows (`store/postgres/text.rs`), which
//! needs the planner's statistics.

use std::collections::HashSet;
use std::time::Instant;

use chrono::{DateTime, Utc};
use engram::domain::Tier;
use sqlx::{PgPool, Postgres, QueryBuilder, Row};
use uuid::Uuid;

/// `rows.rs`: the columns every tier projects.
const COMMON: &str = "id, agent_id, user_id, session_id, content, importance, retention, metadata, private, \
    occurred_at, created_at, updated_at, expires_at, access_count::bigint AS access_count, last_accessed_at, \
    embedding_model";

fn columns(tier: Tier) -> String {
    match tier {
        Tier::Episodic => format!(
            "'episodic'::text AS tier, {COMMON}, event_type, outcome, NULL::text AS namespace, NULL::text AS subject, \
             NULL::text AS predicate, NULL::text AS object, NULL::float8 AS confidence, NULL::timestamptz AS valid_from, \
             NULL::timestamptz AS valid_until, NULL::uuid AS supersedes, NULL::uuid AS source_episode_id, \
             NULL::text AS skill_name, NULL::text AS trigger_pattern, NULL::jsonb AS policy, NULL::jsonb AS tool_sequence, \
             NULL::integer AS success_count, NULL::integer AS failure_count, NULL::float8 AS success_rate, \
             NULL::float8 AS avg_reward, NULL::integer AS version"
        ),
        Tier::Semantic => format!(
            "'semantic'::text AS tier, {COMMON}, NULL::text AS event_type, NULL::text AS outcome, namespace, subject, \
             predicate, object, confidence, valid_from, valid_until, supersedes, source_episode_id, \
             NULL::text AS skill_name, NULL::text AS trigger_pattern, NULL::jsonb AS policy, NULL::jsonb AS tool_sequence, \
             NULL::integer AS success_count, NULL::integer AS failure_count, NULL::float8 AS success_rate, \
             NULL::float8 AS avg_reward, NULL::integer AS version"
        ),
        Tier::Procedural => format!(
            "'procedural'::text AS tier, {COMMON}, NULL::text AS event_type, NULL::text AS outcome, NULL::text AS namespace, \
             NULL::text AS subject, NULL::text AS predicate, NULL::text AS object, NULL::float8 AS confidence, \
             NULL::timestamptz AS valid_from, NULL::timestamptz AS valid_until, NULL::uuid AS supersedes, \
             NULL::uuid AS source_episode_id, skill_name, trigger_pattern, policy, tool_sequence, success_count, \
             failure_count, success_rate, avg_reward, version"
        ),
        Tier::Working => unreachable!("working memory is not in Postgres"),
    }
}

fn table(tier: Tier) -> &'static str {
    match tier {
        Tier::Episodic => "episodic_memory",
        Tier::Semantic => "semantic_memory",
        Tier::Procedural => "procedural_memory",
        Tier::Working => unreachable!("working memory is not in Postgres"),
    }
}

const TIERS: [Tier; 3] = [Tier::Episodic, Tier::Semantic, Tier::Procedural];

/// One search's filters (search.rs `push_filters` with no user, time or
/// metadata filter).
#[derive(Clone)]
pub struct Scope {
    pub tenant: String,
    pub agent: String,
    pub now: DateTime<Utc>,
}

fn push_filters(qb: &mut QueryBuilder<Postgres>, tier: Tier, s: &Scope) {
    qb.push(" tenant_id = ").push_bind(s.tenant.clone());
    qb.push(" AND agent_id = ").push_bind(s.agent.clone());
    qb.push(" AND (expires_at IS NULL OR expires_at > ").push_bind(s.now).push(")");
    if tier == Tier::Semantic {
        qb.push(" AND valid_until IS NULL");
    }
}

/// search.rs `EXACT_BELOW`: an agent with fewer vectors in a tier has them
/// all compared there instead of a graph walk.
const EXACT_BELOW: i64 = 5_000;

fn vectors(tier: Tier) -> &'static str {
    match tier {
        Tier::Episodic => "episodic_vectors",
        Tier::Semantic => "semantic_vectors",
        Tier::Procedural => "procedural_vectors",
        Tier::Working => unreachable!("working memory is not in Postgres"),
    }
}

/// The vector leg (without the text rank the server adds on its rows);
/// `prefix` is "" or an EXPLAIN.
pub fn vector_leg(
    prefix: &str,
    model: &str,
    qvec: &pgvector::Vector,
    s: &Scope,
    per_leg: i64,
) -> QueryBuilder<Postgres> {
    let dims = qvec.as_slice().len();
    let model = format!("'{}'", model.replace('\'', "''"));
    let mut qb: QueryBuilder<Postgres> = QueryBuilder::new(format!("{prefix}WITH "));
    for (i, tier) in TIERS.iter().enumerate() {
        if i > 0 {
            qb.push(", ");
        }
        qb.push(format!(
            "g{i} AS (SELECT count(*) < {EXACT_BELOW} AS exact FROM (SELECT 1 FROM {} WHERE tenant_id = ",
            vectors(*tier)
        ));
        qb.push_bind(s.tenant.clone()).push(" AND agent_id = ").push_bind(s.agent.clone());
        qb.push(format!(" LIMIT {EXACT_BELOW}) AS c)"));
    }
    qb.push(" SELECT * FROM (");
    for (i, tier) in TIERS.iter().enumerate() {
        if i > 0 {
            qb.push(" UNION ALL ");
        }
        let vectors = vectors(*tier);
        let memory_row = |qb: &mut QueryBuilder<Postgres>, candidate: &str| {
            qb.push(format!(
                " CROSS JOIN LATERAL (SELECT {}, search_tsv FROM {} WHERE id = {candidate}.id AND",
                columns(*tier),
                table(*tier)
            ));
            push_filters(qb, *tier, s);
            qb.push(" LIMIT 1) AS m");
        };
        qb.push(format!("(SELECT m.*, v.embedding::vector({dims}) AS vec, 1 - (v.embedding::vector({dims}) <=> "));
        qb.push_bind(qvec.clone());
        qb.push(format!(") AS similarity FROM {vectors} AS v"));
        memory_row(&mut qb, "v");
        qb.push(format!(" WHERE v.embedding_model = {model} AND v.tenant_id = "));
        qb.push_bind(s.tenant.clone()).push(" AND v.agent_id = ").push_bind(s.agent.clone());
        qb.push(format!(" AND NOT (SELECT exact FROM g{i}) ORDER BY v.embedding::vector({dims}) <=> "));
        qb.push_bind(qvec.clone());
        qb.push(" LIMIT ").push_bind(per_leg);
        qb.push(format!(
            ") UNION ALL (SELECT m.*, c.vec, 1 - c.distance AS similarity FROM (SELECT id, \
             embedding::vector({dims}) AS vec, embedding <=> "
        ));
        qb.push_bind(qvec.clone());
        qb.push(format!(" AS distance FROM {vectors} WHERE embedding_model = {model} AND tenant_id = "));
        qb.push_bind(s.tenant.clone()).push(" AND agent_id = ").push_bind(s.agent.clone());
        qb.push(format!(" AND (SELECT exact FROM g{i}) ORDER BY distance OFFSET 0) AS c"));
        memory_row(&mut qb, "c");
        qb.push(" LIMIT ").push_bind(per_leg).push(")");
    }
    qb.push(") AS v");
    qb
}

/// The full-text leg's words: the query's lexemes (None: no words).
pub async fn lexemes(pool: &PgPool, text: &str) -> sqlx::Result<Option<Vec<String>>> {
    let l: Vec<String> =
        sqlx::query_scalar("SELECT tsvector_to_array(to_tsvector('english', $1))").bind(text).fetch_one(pool).await?;
    Ok(Some(l).filter(|l| !l.is_empty()))
}

/// Most full-text matches ranked per table (search.rs `MAX_TEXT_MATCHES`).
const MAX_TEXT_MATCHES: i64 = 2_000;

/// The server's text leg with every query word (the server may leave an
/// agent's commonest words out): matched on the agent's words (`k`,
/// migration 0015), ranked on `search_tsv` (`q`).
pub fn text_leg(prefix: &str, lexemes: &[String], s: &Scope, per_leg: i64) -> QueryBuilder<Postgres> {
    let mut qb: QueryBuilder<Postgres> = QueryBuilder::new(format!("{prefix}WITH l AS (SELECT unnest("));
    qb.push_bind(lexemes.to_vec());
    qb.push(
        "::text[]) AS l), q AS (SELECT (SELECT to_tsquery('simple', string_agg(quote_literal(l), ' | ')) FROM l) \
         AS q, (SELECT string_agg('''' || engram_agent_key(",
    );
    qb.push_bind(s.tenant.clone()).push(", ").push_bind(s.agent.clone());
    qb.push(") || l || '''', ' | ')::tsquery FROM l) AS k) SELECT * FROM (");
    for (i, tier) in TIERS.iter().enumerate() {
        if i > 0 {
            qb.push(" UNION ALL ");
        }
        qb.push(format!(
            "(SELECT m.*, ts_rank(m.search_tsv, q.q)::float8 AS text_rank FROM (SELECT {}, search_tsv FROM \
             (SELECT * FROM {t} WHERE engram_agent_words(tenant_id, agent_id, search_tsv) @@ (SELECT k FROM q) \
             OFFSET 0) AS {t} WHERE",
            columns(*tier),
            t = table(*tier)
        ));
        push_filters(&mut qb, *tier, s);
        qb.push(" LIMIT ").push_bind(MAX_TEXT_MATCHES);
        qb.push(") AS m, q ORDER BY text_rank DESC LIMIT ").push_bind(per_leg).push(")");
    }
    qb.push(") AS t");
    qb
}

/// (id, similarity) of the vector leg's rows, best first.
pub async fn vector_hits(
    pool: &PgPool,
    model: &str,
    qvec: &pgvector::Vector,
    s: &Scope,
    per_leg: i64,
) -> sqlx::Result<Vec<(Uuid, f64)>> {
    let rows = vector_leg("", model, qvec, s, per_leg).build().fetch_all(pool).await?;
    let mut hits = rows
        .iter()
        .map(|r| Ok((r.try_get::<Uuid, _>("id")?, r.try_get::<f64, _>("similarity")?)))
        .collect::<sqlx::Result<Vec<_>>>()?;
    hits.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok(hits)
}

/// Milliseconds of one vector-leg query, rows fetched and decoded.
pub async fn time_vector(
    pool: &PgPool,
    model: &str,
    qvec: &pgvector::Vector,
    s: &Scope,
    per_leg: i64,
) -> sqlx::Result<f64> {
    let t0 = Instant::now();
    let rows = vector_leg("", model, qvec, s, per_leg).build().fetch_all(pool).await?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    drop(rows);
    Ok(ms)
}

/// Milliseconds of one text-leg query (both statements, as the server runs them).
pub async fn time_text(pool: &PgPool, text: &str, s: &Scope, per_leg: i64) -> sqlx::Result<f64> {
    let t0 = Instant::now();
    if let Some(l) = lexemes(pool, text).await? {
        text_leg("", &l, s, per_leg).build().fetch_all(pool).await?;
    }
    Ok(t0.elapsed().as_secs_f64() * 1e3)
}

/// The plan lines of an EXPLAIN built by `vector_leg` or `text_leg`.
pub async fn explain(pool: &PgPool, mut qb: QueryBuilder<Postgres>) -> sqlx::Result<Vec<String>> {
    let rows = qb.build().fetch_all(pool).await?;
    rows.iter().map(|r| r.try_get::<String, _>(0)).collect()
}

/// The plan Postgres would cache for the vector leg as a prepared statement
/// (sqlx prepares every statement; after five runs the plan cache may
/// switch to this generic plan).
pub async fn generic_plan(
    pool: &PgPool,
    model: &str,
    dims: usize,
    s: &Scope,
    per_leg: i64,
) -> sqlx::Result<Vec<String>> {
    let probe = pgvector::Vector::from(vec![0.0f32; dims]);
    let sql = vector_leg("EXPLAIN (GENERIC_PLAN) ", model, &probe, s, per_leg).into_string();
    // The simple protocol: GENERIC_PLAN leaves the $n unbound.
    let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).fetch_all(pool).await?;
    rows.iter().map(|r| r.try_get::<String, _>(0)).collect()
}

/// Recall of one query: the share of the exact top-k that the ANN top-k
/// holds (by id, and counting ties at the k-th distance as found).
pub struct QueryRecall {
    pub ann_returned: usize,
    pub exact_returned: usize,
    pub by_id: f64,
    pub with_ties: f64,
}

pub fn recall_at(ann: &[(Uuid, f64)], exact: &[(Uuid, f64)], k: usize) -> QueryRecall {
    let ann_k = &ann[..ann.len().min(k)];
    let exact_k = &exact[..exact.len().min(k)];
    if exact_k.is_empty() {
        return QueryRecall { ann_returned: ann.len(), exact_returned: 0, by_id: 1.0, with_ties: 1.0 };
    }
    let truth: HashSet<Uuid> = exact_k.iter().map(|(id, _)| *id).collect();
    let found = ann_k.iter().filter(|(id, _)| truth.contains(id)).count();
    let kth = exact_k.last().map_or(0.0, |(_, s)| *s);
    let tied = ann_k.iter().filter(|(id, s)| truth.contains(id) || *s >= kth - 1e-6).count();
    QueryRecall {
        ann_returned: ann.len(),
        exact_returned: exact.len(),
        by_id: found as f64 / exact_k.len() as f64,
        with_ties: tied.min(exact_k.len()) as f64 / exact_k.len() as f64,
    }
}

/// (HNSW index scans, sequential scans) so far on the memory and vector
/// tables (the vector tables' partitions included), from
/// the cumulative statistics.
pub async fn scan_counts(pool: &PgPool) -> sqlx::Result<(i64, i64)> {
    sqlx::query_as(
        "SELECT (SELECT coalesce(sum(s.idx_scan), 0)::int8 FROM pg_stat_user_indexes s \
                 JOIN pg_class ic ON ic.oid = s.indexrelid JOIN pg_am am ON am.oid = ic.relam \
                 WHERE am.amname = 'hnsw'), \
                (SELECT coalesce(sum(seq_scan), 0)::int8 FROM pg_stat_user_tables \
                 WHERE relname ~ '^(episodic|semantic|procedural)_(memory|vectors)')",
    )
    .fetch_one(pool)
    .await
}
