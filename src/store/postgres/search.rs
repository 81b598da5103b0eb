//! The two recall legs on Postgres, each one statement over the three tables:
//!
//! - vector: per tier, the agent's partition of the tier's vector table
//!   (migration 0018), ordered by `embedding::vector(D) <=> q` on the
//!   model's partial HNSW index, or, for a small agent, every vector of the
//!   agent compared and sorted (which one: `stats::TableStats::vector_scan`);
//!   each candidate then joins its memory row, which the filters apply to,
//!   until `per_leg` pass. The model name and dimension are written
//!   into the SQL as literals so that the planner can match the partial index
//!   even with a generic (prepared) plan. Connections run with
//!   `hnsw.iterative_scan = relaxed_order`, so the walk goes on until the
//!   filters above it have passed enough rows (set in `connect_lazy`).
//! - full text: the query's words (English stemming, stop words dropped)
//!   joined with OR, less those too common in the agent's rows to tell its
//!   memories apart (`stats.rs`), matched through the GIN index of each
//!   agent's words (migration 0015: every lexeme prefixed by
//!   `engram_agent_key` of its row's tenant and agent, so that the scan reads
//!   only the searched agent's entries), ranked by `ts_rank` on `search_tsv`
//!   (`ts_rank_cd` costs three times as much). At most `MAX_TEXT_MATCHES` matches per table are ranked, which
//!   bounds the leg's cost when the statistics are missing or wrong.
//!
//! Each leg also scores its own candidates on the other leg's measure: the
//! vector leg ranks its rows' text against the query, the text leg computes
//! its rows' cosine to the query vector. A memory one leg found is then fused
//! from both scores, not from one score and a zero for not being in the other
//! leg's top k (which cost about 0.05 recall@10 on conversational recall).
//! Both extra scores are computed on the leg's final rows only.
//!
//! Both legs are planned for their own agent at every run: connections run
//! with `plan_cache_mode = force_custom_plan` (`connect_lazy`).
//!
//! The statements are built by `Legs`, public so that the recall benchmark
//! runs and explains exactly the server's statements.

use std::collections::HashMap;
use std::time::Instant;

use chrono::{DateTime, Utc};
use futures::try_join;
use sqlx::{AssertSqlSafe, Postgres, QueryBuilder, Row};

use super::rows::{self, MemoryRow};
use super::stats::{TableStats, VectorScan};
use super::{PgStore, observe, store_error};
use crate::domain::{Memory, Tier};
use crate::store::{Adjacent, Hit, SearchHits, SearchQuery, StoreResult};

/// Most full-text matches ranked per table and query.
pub const MAX_TEXT_MATCHES: i64 = 2_000;

fn push_filters(qb: &mut QueryBuilder<Postgres>, tenant: &str, tier: Tier, q: &SearchQuery, now: DateTime<Utc>) {
    qb.push(" tenant_id = ").push_bind(tenant.to_string());
    qb.push(" AND agent_id = ").push_bind(q.agent_id.clone());
    qb.push(" AND (expires_at IS NULL OR expires_at > ").push_bind(now).push(")");
    // The user scope (`domain::memory::in_user_scope`).
    if let Some(u) = &q.user_id {
        qb.push(" AND (user_id = ").push_bind(u.clone()).push(" OR user_id IS NULL)");
    }
    if let Some(t) = q.since {
        qb.push(" AND occurred_at >= ").push_bind(t);
    }
    if let Some(t) = q.until {
        qb.push(" AND occurred_at < ").push_bind(t);
    }
    for (k, v) in &q.metadata {
        qb.push(" AND metadata -> ").push_bind(k.clone()).push(" = ").push_bind(sqlx::types::Json(v.clone()));
    }
    if let Some(t) = q.as_of {
        qb.push(" AND created_at <= ").push_bind(t);
    }
    if tier == Tier::Semantic {
        if let Some(t) = q.valid_at {
            push_held_at(qb, t, q.as_of);
        } else if let Some(t) = q.as_of {
            qb.push(" AND (valid_until IS NULL OR valid_until > ").push_bind(t).push(") AND contested_by IS NULL");
        } else if q.include_candidates {
            qb.push(" AND (valid_until IS NULL OR contested_by IS NOT NULL)");
        } else {
            qb.push(" AND valid_until IS NULL");
        }
    }
}

/// `valid_at` (`store::SearchQuery::valid_at`) for a `semantic_memory` row
/// not aliased: the fact held at `t`, as known at `as_of`. The end of a
/// fact's validity is the valid_from of its successor (`supersedes` is
/// indexed), else when it was retired.
pub(super) fn push_held_at(qb: &mut QueryBuilder<Postgres>, t: DateTime<Utc>, as_of: Option<DateTime<Utc>>) {
    qb.push(" AND contested_by IS NULL AND valid_from <= ").push_bind(t);
    qb.push(
        " AND coalesce((SELECT min(n.valid_from) FROM semantic_memory n \
         WHERE n.tenant_id = semantic_memory.tenant_id AND n.supersedes = semantic_memory.id",
    );
    if let Some(a) = as_of {
        qb.push(" AND n.created_at <= ").push_bind(a);
    }
    qb.push("), CASE WHEN valid_until IS NULL");
    if let Some(a) = as_of {
        qb.push(" OR valid_until > ").push_bind(a);
    }
    qb.push(" THEN 'infinity'::timestamptz ELSE valid_until END) > ").push_bind(t);
}

/// The lexemes a tsquery is made of.
enum Words<'a> {
    /// These, already taken from the query (`search_legs`).
    These(&'a [String]),
    /// Those of this text: English stemming, stop words dropped, as
    /// `search_tsv` is made.
    Of(&'a str),
}

/// The OR of some lexemes as a tsquery expression (NULL when there are none).
fn push_tsquery(qb: &mut QueryBuilder<Postgres>, words: Words) {
    qb.push("(SELECT to_tsquery('simple', string_agg(quote_literal(l), ' | ')) FROM unnest(");
    match words {
        Words::These(lexemes) => {
            qb.push_bind(lexemes.to_vec()).push("::text[]");
        }
        Words::Of(text) => {
            qb.push("tsvector_to_array(to_tsvector('english', ").push_bind(text.to_string()).push("))");
        }
    }
    qb.push(") AS l)");
}

/// The OR of some lexemes as one agent's rows are indexed for the text leg
/// (migration 0015: each prefixed by `engram_agent_key`), as a tsquery (NULL
/// when there are none). They are quoted for the tsquery syntax (quotes and
/// backslashes doubled) and taken as they are, not parsed again: they were
/// stemmed already, and the prefix is no word.
fn push_agent_tsquery(qb: &mut QueryBuilder<Postgres>, tenant: &str, agent: &str, lexemes: &[String]) {
    qb.push("(SELECT string_agg('''' || replace(replace(engram_agent_key(");
    qb.push_bind(tenant.to_string()).push(", ").push_bind(agent.to_string());
    qb.push(r") || l, '\', '\\'), '''', '''''') || '''', ' | ')::tsquery FROM unnest(");
    qb.push_bind(lexemes.to_vec()).push("::text[]) AS l)");
}

fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

impl PgStore {
    pub(super) async fn search_legs(
        &self,
        tenant: &str,
        q: &SearchQuery,
        now: DateTime<Utc>,
    ) -> StoreResult<SearchHits> {
        let tiers: Vec<Tier> = q.tiers.iter().copied().filter(|t| *t != Tier::Working).collect();
        if tiers.is_empty() {
            return Ok(SearchHits::default());
        }
        // The query's lexemes (English stemming, stop words dropped); the legs
        // OR them: a question rarely contains every word of its answer.
        let lexemes: Vec<String> = sqlx::query_scalar("SELECT tsvector_to_array(to_tsvector('english', $1))")
            .bind(&q.text)
            .fetch_one(&self.pool)
            .await
            .map_err(store_error)?;
        let vector = async {
            let started = Instant::now();
            let hits = match &q.vector {
                Some(_) => Some(self.vector_leg(tenant, q, &lexemes, &tiers, now).await?),
                None => None,
            };
            observe("search_vector", started);
            Ok::<_, crate::store::StoreError>((hits, started.elapsed().as_secs_f64() * 1e3))
        };
        let text = async {
            let started = Instant::now();
            let hits = match lexemes.is_empty() {
                false => Some(self.text_leg(tenant, q, &lexemes, &tiers, now).await?),
                true => None,
            };
            observe("search_text", started);
            Ok::<_, crate::store::StoreError>((hits, started.elapsed().as_secs_f64() * 1e3))
        };
        let ((vector_hits, vector_ms), (text_hits, text_ms)) = try_join!(vector, text)?;
        let vector_leg = vector_hits.is_some();
        let text_leg = text_hits.is_some();
        let mut hits: Vec<Hit> = vector_hits.unwrap_or_default();
        for t in text_hits.unwrap_or_default() {
            if !hits.iter().any(|h| h.memory.id == t.memory.id) {
                hits.push(t);
            }
        }
        Ok(SearchHits { hits, vector_leg, text_leg, vector_ms, text_ms })
    }

    /// One search's statements, with the statistics as they stand.
    fn legs<'a>(
        &self,
        tenant: &'a str,
        q: &'a SearchQuery,
        lexemes: &'a [String],
        tiers: &'a [Tier],
        now: DateTime<Utc>,
        stats: &'a HashMap<Tier, TableStats>,
    ) -> Legs<'a> {
        Legs { tenant, query: q, lexemes, tiers, now, stats, exact_scan_below: self.exact_scan_below }
    }

    /// The nearest rows by cosine, each with its full-text rank too (0 when
    /// it matches no query word, or the query has none).
    async fn vector_leg(
        &self,
        tenant: &str,
        q: &SearchQuery,
        lexemes: &[String],
        tiers: &[Tier],
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<Hit>> {
        let stats = self.stats.get(&self.pool);
        let mut qb = QueryBuilder::new("");
        self.legs(tenant, q, lexemes, tiers, now, &stats).push_vector_leg(&mut qb);
        let rows = qb.build().fetch_all(&self.pool).await.map_err(store_error)?;
        rows.into_iter()
            .map(|row| {
                let similarity: f64 = row.try_get("similarity").map_err(store_error)?;
                let rank: f64 = row.try_get("text_rank").map_err(store_error)?;
                let vec: pgvector::Vector = row.try_get("vec").map_err(store_error)?;
                let memory: Memory =
                    <MemoryRow as sqlx::FromRow<_>>::from_row(&row).map_err(store_error)?.try_into()?;
                let text_rank = (!lexemes.is_empty()).then_some(rank);
                Ok(Hit { memory, similarity: Some(similarity), text_rank, vector: Some(vec.to_vec()) })
            })
            .collect()
    }

    /// The best full-text matches, each with its cosine to the query vector
    /// too when it has a vector of the query's model.
    async fn text_leg(
        &self,
        tenant: &str,
        q: &SearchQuery,
        lexemes: &[String],
        tiers: &[Tier],
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<Hit>> {
        let stats = self.stats.get(&self.pool);
        let mut qb = QueryBuilder::new("");
        self.legs(tenant, q, lexemes, tiers, now, &stats).push_text_leg(&mut qb);
        let rows = qb.build().fetch_all(&self.pool).await.map_err(store_error)?;
        rows.into_iter()
            .map(|row| {
                let rank: f64 = row.try_get("text_rank").map_err(store_error)?;
                let similarity: Option<f64> = row.try_get("similarity").map_err(store_error)?;
                let vec: Option<pgvector::Vector> = row.try_get("vec").map_err(store_error)?;
                let memory: Memory =
                    <MemoryRow as sqlx::FromRow<_>>::from_row(&row).map_err(store_error)?.try_into()?;
                Ok(Hit { memory, similarity, text_rank: Some(rank), vector: vec.map(|v| v.to_vec()) })
            })
            .collect()
    }

    /// The episodic rows written just before and after each anchor by the
    /// same agent, passing the query's filters; one statement, two index
    /// probes per anchor on `episodic_tenant_agent_created`.
    pub(super) async fn adjacent(
        &self,
        tenant: &str,
        q: &SearchQuery,
        anchors: &[uuid::Uuid],
        _known: &std::collections::HashSet<uuid::Uuid>,
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<Adjacent>> {
        if anchors.is_empty() {
            return Ok(Vec::new());
        }
        // The query's lexemes as the legs use them (NULL when it has none).
        let mut qb: QueryBuilder<Postgres> = QueryBuilder::new("WITH q AS (SELECT ");
        push_tsquery(&mut qb, Words::Of(&q.text));
        qb.push(
            " AS q), a AS (SELECT id AS anchor_id, created_at AS anchor_at FROM episodic_memory WHERE tenant_id = ",
        );
        qb.push_bind(tenant.to_string());
        qb.push(" AND id = ANY(").push_bind(anchors.to_vec()).push("))");
        let (similarity, vec) = match &q.vector {
            Some(e) => {
                let dims = e.vector.len();
                let model = literal(&e.model);
                (
                    format!("CASE WHEN n.embedding_model = {model} THEN 1 - (n.embedding::vector({dims}) <=> "),
                    format!("CASE WHEN n.embedding_model = {model} THEN n.embedding::vector({dims}) END"),
                )
            }
            None => (String::new(), "NULL::vector".to_string()),
        };
        qb.push(format!(" SELECT a.anchor_id AS anchor, {}, {vec} AS vec, ", rows::NAMES));
        match &q.vector {
            Some(e) => {
                qb.push(similarity).push_bind(pgvector::Vector::from(e.vector.clone())).push(") END");
            }
            None => {
                qb.push("NULL::float8");
            }
        }
        qb.push(" AS similarity, coalesce(ts_rank(n.search_tsv, q.q), 0)::float8 AS text_rank FROM a CROSS JOIN q");
        qb.push(" CROSS JOIN LATERAL (");
        // Each side walks the (tenant, agent, session, created_at) index from
        // the anchor outwards.
        for (i, (cmp, order)) in [("<", "DESC"), (">", "ASC")].into_iter().enumerate() {
            if i > 0 {
                qb.push(" UNION ALL ");
            }
            qb.push(format!(
                "(SELECT {}, search_tsv, embedding FROM episodic_memory WHERE",
                rows::columns(Tier::Episodic)
            ));
            push_filters(&mut qb, tenant, Tier::Episodic, q, now);
            qb.push(format!(
                " AND created_at {cmp}= a.anchor_at AND (created_at, id) {cmp} (a.anchor_at, a.anchor_id) \
                 ORDER BY created_at {order}, id {order} LIMIT 1)"
            ));
        }
        qb.push(") AS n");
        let rows = qb.build().fetch_all(&self.pool).await.map_err(store_error)?;
        rows.into_iter()
            .map(|row| {
                let anchor: uuid::Uuid = row.try_get("anchor").map_err(store_error)?;
                let rank: f64 = row.try_get("text_rank").map_err(store_error)?;
                let similarity: Option<f64> = row.try_get("similarity").map_err(store_error)?;
                let vec: Option<pgvector::Vector> = row.try_get("vec").map_err(store_error)?;
                let memory: Memory =
                    <MemoryRow as sqlx::FromRow<_>>::from_row(&row).map_err(store_error)?.try_into()?;
                let hit = Hit { memory, similarity, text_rank: Some(rank), vector: vec.map(|v| v.to_vec()) };
                Ok(Adjacent { anchor, id: hit.memory.id, hit: Some(hit) })
            })
            .collect()
    }

    pub(super) async fn bump_access(
        &self,
        tenant: &str,
        hits: &[(Tier, uuid::Uuid)],
        now: DateTime<Utc>,
        counted_after: DateTime<Utc>,
    ) -> StoreResult<()> {
        for tier in [Tier::Episodic, Tier::Semantic, Tier::Procedural] {
            let mut ids: Vec<uuid::Uuid> = hits.iter().filter(|(t, _)| *t == tier).map(|(_, id)| *id).collect();
            if ids.is_empty() {
                continue;
            }
            // Sorted: concurrent flushes of replicas lock rows in the same order.
            ids.sort_unstable();
            ids.dedup();
            let sql = format!(
                "UPDATE {} AS m SET access_count = m.access_count + 1, last_accessed_at = $3 \
                 FROM unnest($2::uuid[]) AS c(id) WHERE m.tenant_id = $1 AND m.id = c.id \
                 AND (m.last_accessed_at IS NULL OR m.last_accessed_at <= $4)",
                rows::table(tier)
            );
            sqlx::query(AssertSqlSafe(sql))
                .bind(tenant)
                .bind(&ids)
                .bind(now)
                .bind(counted_after)
                .execute(&self.pool)
                .await
                .map_err(store_error)?;
        }
        Ok(())
    }
}

/// One search as the two legs' statements see it.
pub struct Legs<'a> {
    pub tenant: &'a str,
    pub query: &'a SearchQuery,
    /// The query's lexemes (English stemming, stop words dropped).
    pub lexemes: &'a [String],
    /// The persistent tiers searched.
    pub tiers: &'a [Tier],
    /// Expiry is judged at this time.
    pub now: DateTime<Utc>,
    /// The planner's statistics of each memory table (`stats::read`); a
    /// tier without them has every query word searched and its vector scan
    /// chosen by a count.
    pub stats: &'a HashMap<Tier, TableStats>,
    /// `search.exact_scan_below`.
    pub exact_scan_below: u32,
}

impl Legs<'_> {
    /// How each searched tier's vectors of the agent are read.
    pub fn vector_scans(&self) -> Vec<(Tier, VectorScan)> {
        let agent = &self.query.agent_id;
        let below = self.exact_scan_below;
        self.tiers
            .iter()
            .map(|t| {
                let scan = match self.stats.get(t) {
                    Some(s) => s.vector_scan(self.tenant, agent, below),
                    None => TableStats::default().vector_scan(self.tenant, agent, below),
                };
                (*t, scan)
            })
            .collect()
    }

    /// Appends the vector leg's statement to `qb` (empty, or holding a
    /// prefix such as EXPLAIN): the nearest rows by cosine, each with its
    /// memory row's columns, `vec`, `similarity` and `text_rank`. The query
    /// must have a vector.
    pub fn push_vector_leg(&self, qb: &mut QueryBuilder<Postgres>) {
        let (tenant, q) = (self.tenant, self.query);
        let embedding = q.vector.as_ref().expect("vector leg needs a vector");
        let dims = embedding.vector.len();
        let model = literal(&embedding.model);
        let qvec = pgvector::Vector::from(embedding.vector.clone());
        let scans = self.vector_scans();
        qb.push("WITH q AS (SELECT ");
        push_tsquery(qb, Words::These(self.lexemes));
        qb.push(" AS q)");
        // A tier whose scan the statistics cannot choose: whether the agent
        // has fewer than `below` vectors there, counted on the primary key
        // of its one partition.
        for (i, (tier, scan)) in scans.iter().enumerate() {
            if let VectorScan::Counted(below) = scan {
                qb.push(format!(
                    ", g{i} AS (SELECT count(*) < {below} AS exact FROM (SELECT 1 FROM {} WHERE tenant_id = ",
                    rows::vectors(*tier)
                ));
                qb.push_bind(tenant.to_string()).push(" AND agent_id = ").push_bind(q.agent_id.clone());
                qb.push(format!(" LIMIT {below}) AS c)"));
            }
        }
        qb.push(" SELECT * FROM (");
        for (i, (tier, scan)) in scans.iter().enumerate() {
            if i > 0 {
                qb.push(" UNION ALL ");
            }
            // The text rank is computed above the LIMITs, on the leg's rows only.
            qb.push(format!(
                "(SELECT {}, vec, similarity, coalesce(ts_rank(n.search_tsv, q.q), 0)::float8 AS text_rank FROM (",
                rows::NAMES
            ));
            let vectors = rows::vectors(*tier);
            // Each candidate's memory row, if it passes the filters: a
            // subquery with a LIMIT, which the planner cannot merge, so the
            // candidates are joined one by one in their order and the scan
            // below stops once `per_leg` rows have passed.
            let memory_row = |qb: &mut QueryBuilder<Postgres>, candidate: &str| {
                qb.push(format!(
                    " CROSS JOIN LATERAL (SELECT {}, search_tsv FROM {} WHERE id = {candidate}.id AND",
                    rows::columns(*tier),
                    rows::table(*tier)
                ));
                push_filters(qb, tenant, *tier, q, self.now);
                qb.push(" LIMIT 1) AS m");
            };
            // The walk: the model's HNSW index (the cast expression it is
            // built on), ordered and limited at the join's level, so the
            // planner follows the graph and the iterative scan goes on
            // until enough rows pass.
            let walk = |qb: &mut QueryBuilder<Postgres>, gate: &str| {
                qb.push(format!(
                    "(SELECT m.*, v.embedding::vector({dims}) AS vec, 1 - (v.embedding::vector({dims}) <=> "
                ));
                qb.push_bind(qvec.clone());
                qb.push(format!(") AS similarity FROM {vectors} AS v"));
                memory_row(qb, "v");
                qb.push(format!(" WHERE v.embedding_model = {model} AND v.tenant_id = "));
                qb.push_bind(tenant.to_string()).push(" AND v.agent_id = ").push_bind(q.agent_id.clone());
                qb.push(format!("{gate} ORDER BY v.embedding::vector({dims}) <=> "));
                qb.push_bind(qvec.clone());
                qb.push(" LIMIT ").push_bind(q.per_leg as i64).push(")");
            };
            // The exact scan: every vector of the agent, sorted in a
            // subquery (on the bare column, which no index matches), then
            // joined in that order.
            let exact = |qb: &mut QueryBuilder<Postgres>, gate: &str| {
                qb.push(format!(
                    "(SELECT m.*, c.vec, 1 - c.distance AS similarity FROM (SELECT id, \
                     embedding::vector({dims}) AS vec, embedding <=> "
                ));
                qb.push_bind(qvec.clone());
                qb.push(format!(" AS distance FROM {vectors} WHERE embedding_model = {model} AND tenant_id = "));
                qb.push_bind(tenant.to_string()).push(" AND agent_id = ").push_bind(q.agent_id.clone());
                qb.push(format!("{gate} ORDER BY distance OFFSET 0) AS c"));
                memory_row(qb, "c");
                qb.push(" LIMIT ").push_bind(q.per_leg as i64).push(")");
            };
            match scan {
                VectorScan::Walk => walk(qb, ""),
                VectorScan::Exact => exact(qb, ""),
                // Both, one of which a one-time filter on g{i} skips.
                VectorScan::Counted(_) => {
                    walk(qb, &format!(" AND NOT (SELECT exact FROM g{i})"));
                    qb.push(" UNION ALL ");
                    exact(qb, &format!(" AND (SELECT exact FROM g{i})"));
                }
            }
            qb.push(") AS n, q)");
        }
        qb.push(") AS v");
    }

    /// Appends the text leg's statement to `qb` (empty, or holding a
    /// prefix): the best full-text matches, each with its memory row's
    /// columns, `text_rank`, and `vec` and `similarity` when its vector is
    /// of the query's model. Each table is searched for the query's words
    /// less those too common in the agent's rows there to tell its memories
    /// apart (`stats::TableStats::choose`). The query must have lexemes.
    pub fn push_text_leg(&self, qb: &mut QueryBuilder<Postgres>) {
        let (tenant, q, lexemes) = (self.tenant, self.query, self.lexemes);
        qb.push("WITH ");
        for (i, tier) in self.tiers.iter().enumerate() {
            let chosen: Vec<String> = match self.stats.get(tier) {
                Some(s) => s.choose(tenant, &q.agent_id, lexemes).into_iter().map(str::to_string).collect(),
                None => lexemes.to_vec(),
            };
            if i > 0 {
                qb.push(", ");
            }
            qb.push(format!("q{i} AS (SELECT "));
            push_tsquery(qb, Words::These(&chosen));
            qb.push(" AS q, ");
            push_agent_tsquery(qb, tenant, &q.agent_id, &chosen);
            qb.push(" AS k)");
        }
        qb.push(" SELECT * FROM (");
        // Cosine and vector of the ranked rows (outside the inner LIMITs), when
        // a row's vector is of the query's model; NULL otherwise.
        let (similarity, vec) = match &q.vector {
            Some(e) => {
                let dims = e.vector.len();
                let model = literal(&e.model);
                (
                    Some(format!("CASE WHEN r.embedding_model = {model} THEN 1 - (r.embedding::vector({dims}) <=> ")),
                    format!("CASE WHEN r.embedding_model = {model} THEN r.embedding::vector({dims}) END"),
                )
            }
            None => (None, "NULL::vector".to_string()),
        };
        for (i, tier) in self.tiers.iter().enumerate() {
            if i > 0 {
                qb.push(" UNION ALL ");
            }
            qb.push(format!("(SELECT {}, text_rank, {vec} AS vec, ", rows::NAMES));
            match (&similarity, &q.vector) {
                (Some(s), Some(e)) => {
                    qb.push(s);
                    qb.push_bind(pgvector::Vector::from(e.vector.clone()));
                    qb.push(") END");
                }
                _ => {
                    qb.push("NULL::float8");
                }
            }
            qb.push(" AS similarity FROM (");
            // The agent's words select the rows in a subquery that the
            // planner may not merge (OFFSET 0), the filters apply above it.
            // Merged, the planner takes the words and the agent for
            // independent conditions and ANDs the words' bitmap with every
            // row of the agent from a (tenant, agent, ...) B-tree, which
            // costs as much as the old index's agent key did; the agent's
            // words hold only the agent's rows already.
            let table = rows::table(*tier);
            qb.push(format!(
                "SELECT m.*, ts_rank(m.search_tsv, q.q)::float8 AS text_rank FROM (SELECT {}, search_tsv, \
                 embedding FROM (SELECT * FROM {table} WHERE engram_agent_words(tenant_id, agent_id, search_tsv) \
                 @@ (SELECT k FROM q{i}) OFFSET 0) AS {table} WHERE",
                rows::columns(*tier),
            ));
            push_filters(qb, tenant, *tier, q, self.now);
            qb.push(" LIMIT ").push_bind(MAX_TEXT_MATCHES);
            qb.push(format!(") AS m, q{i} AS q ORDER BY text_rank DESC LIMIT "))
                .push_bind(q.per_leg as i64)
                .push(") AS r)");
        }
        qb.push(") AS t");
    }
}
