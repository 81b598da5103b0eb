//! `MemoryStore` on Postgres: reads, listing and fact history. Writes,
//! patches and deletes go through `store::write` on the primitives of
//! `write.rs`.

use std::time::Instant;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{AssertSqlSafe, Postgres, QueryBuilder};
use uuid::Uuid;

use super::rows::{self, MemoryRow};
use super::{PgStore, observe, store_error};
use crate::domain::{Memory, Tier};
use crate::store::write::WriteTx;
use crate::store::{
    Adjacent, ListFilter, MemoryStore, PendingVector, SearchHits, SearchQuery, Staged, StagedEviction, StoreError,
    StoreResult, StoredResponse,
};

fn live(now_param: usize) -> String {
    format!("(expires_at IS NULL OR expires_at > ${now_param})")
}

impl PgStore {
    async fn list_rows(
        &self,
        tenant: &str,
        tiers: &[Tier],
        filter: &ListFilter,
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<MemoryRow>> {
        let mut qb = QueryBuilder::new("SELECT * FROM (");
        for (i, tier) in tiers.iter().enumerate() {
            if i > 0 {
                qb.push(" UNION ALL ");
            }
            push_list_branch(&mut qb, tenant, *tier, filter, now);
        }
        qb.push(") AS m ORDER BY created_at DESC, id DESC LIMIT ").push_bind((filter.limit + 1) as i64);
        qb.build_query_as().fetch_all(&self.pool).await.map_err(store_error)
    }

    async fn find(&self, tenant: &str, id: Uuid, now: DateTime<Utc>) -> StoreResult<Option<Memory>> {
        let sql = format!(
            "SELECT {e} FROM episodic_memory WHERE tenant_id = $1 AND id = $2 AND {live} \
             UNION ALL SELECT {s} FROM semantic_memory WHERE tenant_id = $1 AND id = $2 AND {live} \
             UNION ALL SELECT {p} FROM procedural_memory WHERE tenant_id = $1 AND id = $2 AND {live}",
            e = rows::episodic_columns(),
            s = rows::semantic_columns(),
            p = rows::procedural_columns(),
            live = live(3),
        );
        let row: Option<MemoryRow> = sqlx::query_as(AssertSqlSafe(sql))
            .bind(tenant)
            .bind(id)
            .bind(now)
            .fetch_optional(&self.pool)
            .await
            .map_err(store_error)?;
        row.map(Memory::try_from).transpose()
    }
}

fn push_list_branch(qb: &mut QueryBuilder<Postgres>, tenant: &str, tier: Tier, f: &ListFilter, now: DateTime<Utc>) {
    qb.push(format!("(SELECT {} FROM {} WHERE tenant_id = ", rows::columns(tier), rows::table(tier)));
    qb.push_bind(tenant.to_string());
    qb.push(" AND (expires_at IS NULL OR expires_at > ").push_bind(now).push(")");
    if let Some(a) = &f.agent_id {
        qb.push(" AND agent_id = ").push_bind(a.clone());
    }
    if let Some(u) = &f.user_id {
        qb.push(" AND user_id = ").push_bind(u.clone());
    }
    if let Some(s) = &f.session_id {
        qb.push(" AND session_id = ").push_bind(s.clone());
    }
    if let Some(t) = f.created_after {
        qb.push(" AND created_at >= ").push_bind(t);
    }
    if let Some(t) = f.created_before {
        qb.push(" AND created_at < ").push_bind(t);
    }
    if let Some(c) = f.after {
        qb.push(" AND (created_at, id) < (").push_bind(c.created_at).push(", ").push_bind(c.id).push(")");
    }
    for (k, v) in &f.metadata {
        qb.push(" AND metadata ->> ").push_bind(k.clone()).push(" = ").push_bind(v.clone());
    }
    if let Some(t) = f.valid_at {
        if let Some(a) = f.as_of {
            qb.push(" AND created_at <= ").push_bind(a);
        }
        if tier == Tier::Semantic {
            super::search::push_held_at(qb, t, f.as_of);
        }
    } else if let Some(t) = f.as_of {
        qb.push(" AND created_at <= ").push_bind(t);
        if tier == Tier::Semantic {
            qb.push(" AND (valid_until IS NULL OR valid_until > ").push_bind(t).push(") AND contested_by IS NULL");
        }
    } else if tier == Tier::Semantic && !f.include_superseded {
        qb.push(" AND valid_until IS NULL");
    }
    qb.push(" ORDER BY created_at DESC, id DESC LIMIT ").push_bind((f.limit + 1) as i64).push(")");
}

#[async_trait]
impl MemoryStore for PgStore {
    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await.map_err(store_error)?;
        Ok(())
    }

    async fn idempotent_response(
        &self,
        tenant: &str,
        key: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<StoredResponse>> {
        let row: Option<(String, i16, Value, DateTime<Utc>)> = sqlx::query_as(
            "SELECT request_hash, status, response, created_at FROM idempotency_keys WHERE tenant_id = $1 AND key = $2 \
             AND status <> 0",
        )
        .bind(tenant)
        .bind(key)
        .fetch_optional(&self.pool)
        .await
        .map_err(store_error)?;
        Ok(row
            .filter(|(_, _, _, created)| *created > now - self.idempotency_ttl)
            .map(|(request_hash, status, body, _)| StoredResponse { request_hash, status: status as u16, body }))
    }

    async fn staged_working(
        &self,
        key: Option<(&str, &str)>,
        staged_before: DateTime<Utc>,
        limit: usize,
    ) -> StoreResult<Vec<Staged>> {
        let rows: Vec<(String, String)> = match key {
            Some((tenant, key)) => sqlx::query_as(
                "SELECT tenant_id, entry FROM working_outbox WHERE tenant_id = $1 AND idempotency_key = $2 \
                 ORDER BY created_at, id LIMIT $3",
            )
            .bind(tenant)
            .bind(key)
            .bind(limit as i64),
            None => sqlx::query_as(
                "SELECT tenant_id, entry FROM working_outbox WHERE created_at <= $1 ORDER BY created_at, id LIMIT $2",
            )
            .bind(staged_before)
            .bind(limit as i64),
        }
        .fetch_all(&self.pool)
        .await
        .map_err(store_error)?;
        crate::store::parse_staged(rows)
    }

    async fn unstage_working(&self, tenant: &str, ids: &[Uuid]) -> StoreResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        sqlx::query("DELETE FROM working_outbox WHERE tenant_id = $1 AND id = ANY($2)")
            .bind(tenant)
            .bind(ids)
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn staged_evictions(&self, limit: usize) -> StoreResult<Vec<StagedEviction>> {
        sqlx::query_as(
            "SELECT eviction_id, tenant_id, id FROM skill_evictions ORDER BY created_at, eviction_id LIMIT $1",
        )
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(store_error)
    }

    async fn unstage_evictions(&self, eviction_ids: &[Uuid]) -> StoreResult<()> {
        if eviction_ids.is_empty() {
            return Ok(());
        }
        sqlx::query("DELETE FROM skill_evictions WHERE eviction_id = ANY($1)")
            .bind(eviction_ids)
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn begin(&self) -> StoreResult<Box<dyn WriteTx>> {
        Ok(Box::new(self.begin_write().await?))
    }

    async fn get(&self, tenant: &str, id: Uuid, now: DateTime<Utc>) -> StoreResult<Memory> {
        let started = Instant::now();
        // On the replica first. A miss there may be a memory written a
        // moment ago, and a skill read here is then cached by the service,
        // so both are read from the primary (replica.rs).
        let found = match self.reader(tenant).await {
            Some(replica) => match self.on_replica(replica.find(tenant, id, now)).await {
                Ok(Some(m)) if m.tier != Tier::Procedural => {
                    self.note_served();
                    Some(m)
                }
                Ok(_) => self.find(tenant, id, now).await?,
                Err(e) => {
                    self.note_failed(&e);
                    self.find(tenant, id, now).await?
                }
            },
            None => self.find(tenant, id, now).await?,
        };
        observe("get", started);
        found.ok_or(StoreError::NotFound)
    }

    async fn get_current(&self, tenant: &str, id: Uuid, now: DateTime<Utc>) -> StoreResult<Memory> {
        self.find(tenant, id, now).await?.ok_or(StoreError::NotFound)
    }

    async fn list(&self, tenant: &str, filter: &ListFilter, now: DateTime<Utc>) -> StoreResult<Vec<Memory>> {
        let started = Instant::now();
        let tiers: Vec<Tier> =
            [Tier::Episodic, Tier::Semantic, Tier::Procedural].into_iter().filter(|t| filter.wants(*t)).collect();
        if tiers.is_empty() {
            return Ok(Vec::new());
        }
        let tiers = &tiers;
        let rows = self.read(tenant, |store| async move { store.list_rows(tenant, tiers, filter, now).await }).await?;
        observe("list", started);
        rows.into_iter().map(Memory::try_from).collect()
    }

    async fn history(&self, tenant: &str, id: Uuid, now: DateTime<Utc>) -> StoreResult<Vec<Memory>> {
        let current = self.find(tenant, id, now).await?;
        let current = match current {
            Some(m) if m.tier == Tier::Semantic => m,
            Some(m) => return Ok(vec![m]),
            // A superseded fact is still found here (find() keeps them).
            None => return Err(StoreError::NotFound),
        };
        // A candidate's history is that of the fact it contests. Walk back
        // through `supersedes` and forward through the rows that supersede
        // this one; depth orders the chain oldest first, and each fact's
        // candidates follow it.
        let anchor = current.contested_by.unwrap_or(current.id);
        let sql = format!(
            "WITH RECURSIVE back(id, supersedes, depth) AS ( \
                 SELECT id, supersedes, 0 FROM semantic_memory WHERE tenant_id = $1 AND id = $2 \
                 UNION ALL SELECT s.id, s.supersedes, b.depth - 1 FROM semantic_memory s JOIN back b \
                     ON s.id = b.supersedes WHERE s.tenant_id = $1 AND b.depth > -10000), \
             fwd(id, depth) AS ( \
                 SELECT id, 0 FROM semantic_memory WHERE tenant_id = $1 AND id = $2 \
                 UNION ALL SELECT s.id, f.depth + 1 FROM semantic_memory s JOIN fwd f \
                     ON s.supersedes = f.id WHERE s.tenant_id = $1 AND f.depth < 10000), \
             chain AS (SELECT id, depth FROM back UNION SELECT id, depth FROM fwd), \
             everything AS (SELECT id, depth FROM chain UNION SELECT s.id, c.depth FROM semantic_memory s \
                 JOIN chain c ON s.contested_by = c.id WHERE s.tenant_id = $1) \
             SELECT {} FROM semantic_memory m JOIN everything c ON c.id = m.id \
             WHERE m.tenant_id = $1 AND (m.expires_at IS NULL OR m.expires_at > $3) \
             ORDER BY c.depth, m.created_at, m.id",
            rows::semantic_columns().replace("'semantic'::text AS tier, id,", "'semantic'::text AS tier, m.id,")
        );
        let rows: Vec<MemoryRow> = sqlx::query_as(AssertSqlSafe(sql))
            .bind(tenant)
            .bind(anchor)
            .bind(now)
            .fetch_all(&self.pool)
            .await
            .map_err(store_error)?;
        rows.into_iter().map(Memory::try_from).collect()
    }

    async fn search_embedding(
        &self,
        tenant: &str,
        query: &SearchQuery,
        vector: PendingVector,
        now: DateTime<Utc>,
    ) -> StoreResult<SearchHits> {
        // Both legs need the vector here: the text leg computes its rows'
        // cosine in the same statement. Whether the replica may serve the
        // search is asked while the query is embedded.
        let (vector, reader) = tokio::join!(vector, self.reader(tenant));
        let query = &SearchQuery { vector, ..query.clone() };
        self.read_on(reader, |store| async move { store.search_legs(tenant, query, now).await }).await
    }

    async fn neighbours(
        &self,
        tenant: &str,
        query: &SearchQuery,
        anchors: &[Uuid],
        known: &std::collections::HashSet<Uuid>,
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<Adjacent>> {
        self.read(tenant, |store| async move { store.adjacent(tenant, query, anchors, known, now).await }).await
    }

    async fn record_access(
        &self,
        tenant: &str,
        hits: &[(Tier, Uuid)],
        now: DateTime<Utc>,
        counted_after: DateTime<Utc>,
    ) -> StoreResult<()> {
        self.bump_access(tenant, hits, now, counted_after).await
    }
}
