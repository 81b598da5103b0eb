//! The two recall legs straight in SQL: the server's own statements
//! (`engram::store::postgres::search::Legs`, with the planner statistics
//! the server reads), for three measurements the API cannot give: ANN
//! recall against exact search, the legs' own latency without HTTP, JSON
//! and scoring, and their plans (EXPLAIN ANALYZE, BUFFERS).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};
use engram::config::SearchConfig;
use engram::domain::Tier;
use engram::store::postgres::search::Legs;
use engram::store::postgres::stats::TableStats;
use engram::store::{Embedding, SearchQuery};
use sqlx::{PgPool, Postgres, QueryBuilder, Row};
use uuid::Uuid;

const TIERS: [Tier; 3] = [Tier::Episodic, Tier::Semantic, Tier::Procedural];

/// One search's scope (no user, time or metadata filter), and the planner
/// statistics the server would search it with.
#[derive(Clone)]
pub struct Scope {
    pub tenant: String,
    pub agent: String,
    pub now: DateTime<Utc>,
    pub stats: Arc<HashMap<Tier, TableStats>>,
}

/// One query: its model and vector, and its lexemes (empty: no words).
pub struct Probe<'a> {
    pub model: &'a str,
    pub vector: &'a pgvector::Vector,
    pub lexemes: &'a [String],
}

/// The server's statement of one leg, after `prefix` ("" or an EXPLAIN).
fn leg(prefix: &str, p: &Probe, s: &Scope, per_leg: i64, vector: bool) -> QueryBuilder<Postgres> {
    let query = SearchQuery {
        agent_id: s.agent.clone(),
        user_id: None,
        tiers: TIERS.to_vec(),
        text: String::new(),
        vector: Some(Embedding { model: p.model.to_string(), vector: p.vector.to_vec() }),
        metadata: Vec::new(),
        since: None,
        until: None,
        per_leg: per_leg as usize,
        include_candidates: false,
        as_of: None,
        valid_at: None,
    };
    let legs = Legs {
        tenant: &s.tenant,
        query: &query,
        lexemes: p.lexemes,
        tiers: &TIERS,
        now: s.now,
        stats: &s.stats,
        exact_scan_below: SearchConfig::default().exact_scan_below,
    };
    let mut qb = QueryBuilder::new(prefix.to_string());
    if vector {
        legs.push_vector_leg(&mut qb);
    } else {
        legs.push_text_leg(&mut qb);
    }
    qb
}

/// The vector leg.
pub fn vector_leg(prefix: &str, p: &Probe, s: &Scope, per_leg: i64) -> QueryBuilder<Postgres> {
    leg(prefix, p, s, per_leg, true)
}

/// The text leg; `p` must have lexemes.
pub fn text_leg(prefix: &str, p: &Probe, s: &Scope, per_leg: i64) -> QueryBuilder<Postgres> {
    leg(prefix, p, s, per_leg, false)
}

/// The query's lexemes as the server takes them (English stemming, stop
/// words dropped).
pub async fn lexemes(pool: &PgPool, text: &str) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar("SELECT tsvector_to_array(to_tsvector('english', $1))").bind(text).fetch_one(pool).await
}

/// (id, similarity) of the vector leg's rows, best first.
pub async fn vector_hits(pool: &PgPool, p: &Probe<'_>, s: &Scope, per_leg: i64) -> sqlx::Result<Vec<(Uuid, f64)>> {
    let rows = vector_leg("", p, s, per_leg).build().fetch_all(pool).await?;
    let mut hits = rows
        .iter()
        .map(|r| Ok((r.try_get::<Uuid, _>("id")?, r.try_get::<f64, _>("similarity")?)))
        .collect::<sqlx::Result<Vec<_>>>()?;
    hits.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok(hits)
}

/// Milliseconds of one vector-leg statement, rows fetched and decoded.
pub async fn time_vector(pool: &PgPool, p: &Probe<'_>, s: &Scope, per_leg: i64) -> sqlx::Result<f64> {
    let t0 = Instant::now();
    let rows = vector_leg("", p, s, per_leg).build().fetch_all(pool).await?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    drop(rows);
    Ok(ms)
}

/// Milliseconds of one text-leg statement (0 for a query without words,
/// which the server does not run).
pub async fn time_text(pool: &PgPool, p: &Probe<'_>, s: &Scope, per_leg: i64) -> sqlx::Result<f64> {
    if p.lexemes.is_empty() {
        return Ok(0.0);
    }
    let t0 = Instant::now();
    text_leg("", p, s, per_leg).build().fetch_all(pool).await?;
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
pub async fn generic_plan(pool: &PgPool, p: &Probe<'_>, s: &Scope, per_leg: i64) -> sqlx::Result<Vec<String>> {
    let sql = vector_leg("EXPLAIN (GENERIC_PLAN) ", p, s, per_leg).into_string();
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
