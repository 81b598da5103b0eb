//! The two recall legs on Postgres, each one statement over the three tables:
//!
//! - vector: per table, `ORDER BY embedding::vector(D) <=> q LIMIT k` on the
//!   model's partial HNSW index. The model name and dimension are written into
//!   the SQL as literals so that the planner can match the partial index even
//!   with a generic (prepared) plan. Connections run with
//!   `hnsw.iterative_scan = relaxed_order`, so filtering by tenant and agent
//!   after the graph walk still fills the limit (set in `connect_lazy`).
//! - full text: the query's words (English stemming, stop words dropped)
//!   joined with OR, matched through the GIN index, ranked by `ts_rank`
//!   (`ts_rank_cd` costs three times as much). At most `MAX_TEXT_MATCHES`
//!   matches per table are ranked, which bounds the leg's cost when a query
//!   word is common.

use std::time::Instant;

use chrono::{DateTime, Utc};
use futures::try_join;
use sqlx::{AssertSqlSafe, Postgres, QueryBuilder, Row};

use super::rows::{self, MemoryRow};
use super::{PgStore, observe, store_error};
use crate::domain::{Memory, Tier};
use crate::store::{Hit, SearchHits, SearchQuery, StoreResult};

/// Most full-text matches ranked per table and query.
pub const MAX_TEXT_MATCHES: i64 = 2_000;

fn push_filters(qb: &mut QueryBuilder<Postgres>, tenant: &str, tier: Tier, q: &SearchQuery, now: DateTime<Utc>) {
    qb.push(" tenant_id = ").push_bind(tenant.to_string());
    qb.push(" AND agent_id = ").push_bind(q.agent_id.clone());
    qb.push(" AND (expires_at IS NULL OR expires_at > ").push_bind(now).push(")");
    if let Some(u) = &q.user_id {
        qb.push(" AND user_id = ").push_bind(u.clone());
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
    if tier == Tier::Semantic {
        qb.push(" AND valid_until IS NULL");
    }
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
        let vector = async {
            let started = Instant::now();
            let hits = match &q.vector {
                Some(_) => Some(self.vector_leg(tenant, q, &tiers, now).await?),
                None => None,
            };
            observe("search_vector", started);
            Ok::<_, crate::store::StoreError>((hits, started.elapsed().as_secs_f64() * 1e3))
        };
        let text = async {
            let started = Instant::now();
            let hits = self.text_leg(tenant, q, &tiers, now).await?;
            observe("search_text", started);
            Ok::<_, crate::store::StoreError>((hits, started.elapsed().as_secs_f64() * 1e3))
        };
        let ((vector_hits, vector_ms), (text_hits, text_ms)) = try_join!(vector, text)?;
        let vector_leg = vector_hits.is_some();
        let text_leg = text_hits.is_some();
        let mut hits: Vec<Hit> = vector_hits.unwrap_or_default();
        for t in text_hits.unwrap_or_default() {
            match hits.iter_mut().find(|h| h.memory.id == t.memory.id) {
                Some(h) => h.text_rank = t.text_rank,
                None => hits.push(t),
            }
        }
        Ok(SearchHits { hits, vector_leg, text_leg, vector_ms, text_ms })
    }

    async fn vector_leg(
        &self,
        tenant: &str,
        q: &SearchQuery,
        tiers: &[Tier],
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<Hit>> {
        let embedding = q.vector.as_ref().expect("vector leg needs a vector");
        let dims = embedding.vector.len();
        let model = literal(&embedding.model);
        let qvec = pgvector::Vector::from(embedding.vector.clone());
        let mut qb: QueryBuilder<Postgres> = QueryBuilder::new("SELECT * FROM (");
        for (i, tier) in tiers.iter().enumerate() {
            if i > 0 {
                qb.push(" UNION ALL ");
            }
            let distance = format!("(embedding::vector({dims}) <=> ");
            qb.push(format!("(SELECT {}, embedding::vector({dims}) AS vec, 1 - {distance}", rows::columns(*tier)));
            qb.push_bind(qvec.clone());
            qb.push(format!(") AS similarity FROM {} WHERE embedding_model = {model} AND", rows::table(*tier)));
            push_filters(&mut qb, tenant, *tier, q, now);
            qb.push(format!(" ORDER BY {distance}"));
            qb.push_bind(qvec.clone());
            qb.push(") LIMIT ").push_bind(q.per_leg as i64).push(")");
        }
        qb.push(") AS v");
        let rows = qb.build().fetch_all(&self.pool).await.map_err(store_error)?;
        rows.into_iter()
            .map(|row| {
                let similarity: f64 = row.try_get("similarity").map_err(store_error)?;
                let vec: pgvector::Vector = row.try_get("vec").map_err(store_error)?;
                let memory: Memory =
                    <MemoryRow as sqlx::FromRow<_>>::from_row(&row).map_err(store_error)?.try_into()?;
                Ok(Hit { memory, similarity: Some(similarity), text_rank: None, vector: Some(vec.to_vec()) })
            })
            .collect()
    }

    /// None when the query has no searchable words.
    async fn text_leg(
        &self,
        tenant: &str,
        q: &SearchQuery,
        tiers: &[Tier],
        now: DateTime<Utc>,
    ) -> StoreResult<Option<Vec<Hit>>> {
        // The query's lexemes, OR-ed: a question rarely contains every word of its answer.
        let tsquery: Option<String> = sqlx::query_scalar(
            "SELECT string_agg(quote_literal(lexeme), ' | ') FROM unnest(to_tsvector('english', $1))",
        )
        .bind(&q.text)
        .fetch_one(&self.pool)
        .await
        .map_err(store_error)?;
        let Some(tsquery) = tsquery.filter(|s| !s.is_empty()) else { return Ok(None) };
        let mut qb: QueryBuilder<Postgres> = QueryBuilder::new("WITH q AS (SELECT to_tsquery('simple', ");
        qb.push_bind(tsquery);
        qb.push(") AS q) SELECT * FROM (");
        for (i, tier) in tiers.iter().enumerate() {
            if i > 0 {
                qb.push(" UNION ALL ");
            }
            qb.push(format!(
                "(SELECT m.*, ts_rank(m.search_tsv, q.q)::float8 AS text_rank FROM (SELECT {}, search_tsv FROM {} WHERE",
                rows::columns(*tier),
                rows::table(*tier)
            ));
            push_filters(&mut qb, tenant, *tier, q, now);
            qb.push(" AND search_tsv @@ (SELECT q FROM q) LIMIT ").push_bind(MAX_TEXT_MATCHES);
            qb.push(") AS m, q ORDER BY text_rank DESC LIMIT ").push_bind(q.per_leg as i64).push(")");
        }
        qb.push(") AS t");
        let rows = qb.build().fetch_all(&self.pool).await.map_err(store_error)?;
        rows.into_iter()
            .map(|row| {
                let rank: f64 = row.try_get("text_rank").map_err(store_error)?;
                let memory: Memory =
                    <MemoryRow as sqlx::FromRow<_>>::from_row(&row).map_err(store_error)?.try_into()?;
                Ok(Hit { memory, similarity: None, text_rank: Some(rank), vector: None })
            })
            .collect::<StoreResult<Vec<_>>>()
            .map(Some)
    }

    pub(super) async fn bump_access(
        &self,
        tenant: &str,
        hits: &[(Tier, uuid::Uuid, i32)],
        now: DateTime<Utc>,
    ) -> StoreResult<()> {
        for tier in [Tier::Episodic, Tier::Semantic, Tier::Procedural] {
            let (ids, counts): (Vec<uuid::Uuid>, Vec<i32>) =
                hits.iter().filter(|(t, _, _)| *t == tier).map(|(_, id, n)| (*id, *n)).unzip();
            if ids.is_empty() {
                continue;
            }
            let sql = format!(
                "UPDATE {} AS m SET access_count = m.access_count + c.n, last_accessed_at = $4 \
                 FROM unnest($2::uuid[], $3::int4[]) AS c(id, n) WHERE m.tenant_id = $1 AND m.id = c.id",
                rows::table(tier)
            );
            sqlx::query(AssertSqlSafe(sql))
                .bind(tenant)
                .bind(&ids)
                .bind(&counts)
                .bind(now)
                .execute(&self.pool)
                .await
                .map_err(store_error)?;
        }
        Ok(())
    }
}
