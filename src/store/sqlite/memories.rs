//! `MemoryStore` on SQLite: reads, listing and fact history, and the
//! in-process index changes every write applies after its commit. Writes,
//! patches and deletes go through `store::write` on the primitives of
//! `write.rs`; where Postgres leans on row and advisory locks, this backend
//! leans on the write gate, which runs one write transaction at a time.

use std::time::Instant;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{QueryBuilder, Sqlite};
use uuid::Uuid;

use super::rows::{COLUMNS, MemoryRow};
use super::vectors::Entry;
use super::write::IndexOp;
use super::{SqliteStore, micros, observe, store_error};
use crate::domain::{Memory, Tier};
use crate::store::write::WriteTx;
use crate::store::{
    Adjacent, ListFilter, MemoryStore, PendingVector, SearchHits, SearchQuery, Staged, StagedEviction, StoreError,
    StoreResult, StoredResponse,
};

/// `(expires_at is null or expires_at > ?)` for the row alias `m`.
fn push_live(qb: &mut QueryBuilder<Sqlite>, now: DateTime<Utc>) {
    qb.push(" and (m.expires_at is null or m.expires_at > ").push_bind(micros(now)).push(")");
}

impl SqliteStore {
    /// Applies index changes in order (called under the write gate).
    pub(super) fn apply(&self, tenant: &str, ops: Vec<IndexOp>) {
        if ops.is_empty() {
            return;
        }
        let mut vectors = self.inner.vectors.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut text = self.inner.text.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        for op in ops {
            match op {
                IndexOp::Put(m, e) => {
                    match e {
                        Some(e) => vectors.put(tenant, &m.agent_id, &e.model, &e.vector, Entry::of(&m)),
                        None => vectors.remove(tenant, m.id),
                    }
                    text.put(tenant, &m);
                }
                IndexOp::Refresh(m) => {
                    vectors.refresh(tenant, Entry::of(&m));
                    text.refresh(tenant, Entry::of(&m));
                }
                IndexOp::Retire(id) => {
                    vectors.retire(tenant, id);
                    text.retire(tenant, id);
                }
                IndexOp::Remove(id) => {
                    vectors.remove(tenant, id);
                    text.remove(tenant, id);
                }
            }
        }
    }

    /// A live memory by id, superseded facts included.
    pub(super) async fn find(&self, tenant: &str, id: Uuid, now: DateTime<Utc>) -> StoreResult<Option<Memory>> {
        let row: Option<MemoryRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "select {COLUMNS} from memories m where m.tenant_id = ? and m.id = ? \
             and (m.expires_at is null or m.expires_at > ?)"
        )))
        .bind(tenant)
        .bind(id)
        .bind(micros(now))
        .fetch_optional(&self.inner.pool)
        .await
        .map_err(store_error)?;
        row.map(Memory::try_from).transpose()
    }
}

/// `metadata.KEY` compared as text, as `ListFilter::matches` does: a string
/// by its value, JSON null or a missing key never, anything else by its
/// JSON text. `json_each` finds the key whatever characters it holds (a
/// JSON path would have to quote them).
fn push_metadata_text(qb: &mut QueryBuilder<Sqlite>, key: &str, value: &str) {
    qb.push(" and exists (select 1 from json_each(m.metadata) j where j.key = ").push_bind(key.to_string());
    qb.push(
        " and (case j.type when 'text' then j.value when 'null' then null when 'true' then 'true' \
         when 'false' then 'false' when 'integer' then cast(j.value as text) \
         when 'real' then cast(j.value as text) else j.value end) = ",
    );
    qb.push_bind(value.to_string()).push(")");
}

fn push_list_filters(qb: &mut QueryBuilder<Sqlite>, tenant: &str, tiers: &[Tier], f: &ListFilter, now: DateTime<Utc>) {
    qb.push(" where m.tenant_id = ").push_bind(tenant.to_string());
    push_live(qb, now);
    qb.push(" and m.tier in (");
    let mut sep = qb.separated(", ");
    for t in tiers {
        sep.push_bind(t.as_str());
    }
    qb.push(")");
    if let Some(a) = &f.agent_id {
        qb.push(" and m.agent_id = ").push_bind(a.clone());
    }
    if let Some(u) = &f.user_id {
        qb.push(" and m.user_id = ").push_bind(u.clone());
    }
    if let Some(s) = &f.session_id {
        qb.push(" and m.session_id = ").push_bind(s.clone());
    }
    if let Some(t) = f.created_after {
        qb.push(" and m.created_at >= ").push_bind(micros(t));
    }
    if let Some(t) = f.created_before {
        qb.push(" and m.created_at < ").push_bind(micros(t));
    }
    if let Some(c) = f.after {
        qb.push(" and (m.created_at, m.id) < (").push_bind(micros(c.created_at)).push(", ").push_bind(c.id).push(")");
    }
    for (k, v) in &f.metadata {
        push_metadata_text(qb, k, v);
    }
    if let Some(t) = f.valid_at {
        if let Some(a) = f.as_of {
            qb.push(" and m.created_at <= ").push_bind(micros(a));
        }
        super::search::push_held_at(qb, t, f.as_of);
    } else if let Some(t) = f.as_of {
        qb.push(" and m.created_at <= ").push_bind(micros(t));
        qb.push(" and (m.tier <> 'semantic' or ((m.valid_until is null or m.valid_until > ")
            .push_bind(micros(t))
            .push(") and m.contested_by is null))");
    } else if !f.include_superseded {
        qb.push(" and (m.tier <> 'semantic' or m.valid_until is null)");
    }
}

#[async_trait]
impl MemoryStore for SqliteStore {
    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("select 1").execute(&self.inner.pool).await.map_err(store_error)?;
        Ok(())
    }

    async fn idempotent_response(
        &self,
        tenant: &str,
        key: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<StoredResponse>> {
        let row: Option<(String, i64, String)> = sqlx::query_as(
            "select request_hash, status, response from idempotency_keys where tenant_id = ? and key = ? \
             and status <> 0 and created_at > ?",
        )
        .bind(tenant)
        .bind(key)
        .bind(micros(now - self.inner.idempotency_ttl))
        .fetch_optional(&self.inner.pool)
        .await
        .map_err(store_error)?;
        row.map(|(request_hash, status, body)| {
            let body = serde_json::from_str(&body).map_err(|e| StoreError::Internal(e.into()))?;
            Ok(StoredResponse { request_hash, status: status as u16, body })
        })
        .transpose()
    }

    async fn staged_working(
        &self,
        key: Option<(&str, &str)>,
        staged_before: DateTime<Utc>,
        limit: usize,
    ) -> StoreResult<Vec<Staged>> {
        let rows: Vec<(String, String)> = match key {
            Some((tenant, key)) => sqlx::query_as(
                "select tenant_id, entry from working_outbox where tenant_id = ? and idempotency_key = ? \
                 order by created_at, id limit ?",
            )
            .bind(tenant)
            .bind(key)
            .bind(limit as i64),
            None => sqlx::query_as(
                "select tenant_id, entry from working_outbox where created_at <= ? order by created_at, id limit ?",
            )
            .bind(micros(staged_before))
            .bind(limit as i64),
        }
        .fetch_all(&self.inner.pool)
        .await
        .map_err(store_error)?;
        crate::store::parse_staged(rows)
    }

    async fn unstage_working(&self, tenant: &str, ids: &[Uuid]) -> StoreResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let _gate = self.inner.write_gate.lock().await;
        let mut tx = self.inner.pool.begin().await.map_err(store_error)?;
        for id in ids {
            sqlx::query("delete from working_outbox where tenant_id = ? and id = ?")
                .bind(tenant)
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(store_error)?;
        }
        tx.commit().await.map_err(store_error)?;
        Ok(())
    }

    async fn staged_evictions(&self, limit: usize) -> StoreResult<Vec<StagedEviction>> {
        sqlx::query_as(
            "select eviction_id, tenant_id, id from skill_evictions order by created_at, eviction_id limit ?",
        )
        .bind(limit as i64)
        .fetch_all(&self.inner.pool)
        .await
        .map_err(store_error)
    }

    async fn unstage_evictions(&self, eviction_ids: &[Uuid]) -> StoreResult<()> {
        if eviction_ids.is_empty() {
            return Ok(());
        }
        let _gate = self.inner.write_gate.lock().await;
        let mut tx = self.inner.pool.begin().await.map_err(store_error)?;
        for id in eviction_ids {
            sqlx::query("delete from skill_evictions where eviction_id = ?")
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(store_error)?;
        }
        tx.commit().await.map_err(store_error)?;
        Ok(())
    }

    async fn begin(&self) -> StoreResult<Box<dyn WriteTx>> {
        Ok(Box::new(self.begin_write().await?))
    }

    async fn get(&self, tenant: &str, id: Uuid, now: DateTime<Utc>) -> StoreResult<Memory> {
        let started = Instant::now();
        let found = self.find(tenant, id, now).await?;
        observe("get", started);
        found.ok_or(StoreError::NotFound)
    }

    async fn list(&self, tenant: &str, filter: &ListFilter, now: DateTime<Utc>) -> StoreResult<Vec<Memory>> {
        let started = Instant::now();
        let tiers: Vec<Tier> =
            [Tier::Episodic, Tier::Semantic, Tier::Procedural].into_iter().filter(|t| filter.wants(*t)).collect();
        if tiers.is_empty() {
            return Ok(Vec::new());
        }
        let mut qb = QueryBuilder::new(format!("select {COLUMNS} from memories m"));
        push_list_filters(&mut qb, tenant, &tiers, filter, now);
        qb.push(" order by m.created_at desc, m.id desc limit ").push_bind((filter.limit + 1) as i64);
        let rows: Vec<MemoryRow> = qb.build_query_as().fetch_all(&self.inner.pool).await.map_err(store_error)?;
        observe("list", started);
        rows.into_iter().map(Memory::try_from).collect()
    }

    async fn history(&self, tenant: &str, id: Uuid, now: DateTime<Utc>) -> StoreResult<Vec<Memory>> {
        let current = match self.find(tenant, id, now).await? {
            Some(m) if m.tier == Tier::Semantic => m,
            Some(m) => return Ok(vec![m]),
            None => return Err(StoreError::NotFound),
        };
        // A candidate's history is that of the fact it contests. Walk back
        // through `supersedes` and forward through the rows that supersede
        // this one; depth orders the chain oldest first, and each fact's
        // candidates follow it.
        let anchor = current.contested_by.unwrap_or(current.id);
        let rows: Vec<MemoryRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "with recursive back(id, supersedes, depth) as ( \
                 select id, supersedes, 0 from memories where tenant_id = ?1 and id = ?2 \
                 union all select s.id, s.supersedes, b.depth - 1 from memories s join back b \
                     on s.id = b.supersedes where s.tenant_id = ?1 and s.tier = 'semantic' and b.depth > -10000), \
             fwd(id, depth) as ( \
                 select id, 0 from memories where tenant_id = ?1 and id = ?2 \
                 union all select s.id, f.depth + 1 from memories s join fwd f \
                     on s.supersedes = f.id where s.tenant_id = ?1 and s.tier = 'semantic' and f.depth < 10000), \
             chain(id, depth) as (select id, depth from back union select id, depth from fwd), \
             everything(id, depth) as (select id, depth from chain union select s.id, c.depth from memories s \
                 join chain c on s.contested_by = c.id where s.tenant_id = ?1 and s.tier = 'semantic') \
             select {COLUMNS} from memories m join everything c on c.id = m.id \
             where m.tenant_id = ?1 and (m.expires_at is null or m.expires_at > ?3) \
             order by c.depth, m.created_at, m.id"
        )))
        .bind(tenant)
        .bind(anchor)
        .bind(micros(now))
        .fetch_all(&self.inner.pool)
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
        self.search_legs(tenant, query, vector, now).await
    }

    async fn neighbours(
        &self,
        tenant: &str,
        query: &SearchQuery,
        anchors: &[Uuid],
        known: &std::collections::HashSet<Uuid>,
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<Adjacent>> {
        self.adjacent(tenant, query, anchors, known, now).await
    }

    /// Counts one access of each `(tier, id)` at `now`, unless its last
    /// counted access is later than `counted_after` (then nothing changes,
    /// the stamp included, as in the Postgres backend).
    async fn record_access(
        &self,
        tenant: &str,
        hits: &[(Tier, Uuid)],
        now: DateTime<Utc>,
        counted_after: DateTime<Utc>,
    ) -> StoreResult<()> {
        let mut ids: Vec<(Tier, Uuid)> = hits.iter().filter(|(t, _)| *t != Tier::Working).copied().collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() {
            return Ok(());
        }
        let _gate = self.inner.write_gate.lock().await;
        let mut tx = self.inner.pool.begin().await.map_err(store_error)?;
        for (tier, id) in ids {
            sqlx::query(
                "update memories set access_count = access_count + 1, last_accessed_at = ? \
                 where tenant_id = ? and id = ? and tier = ? and (last_accessed_at is null or last_accessed_at <= ?)",
            )
            .bind(micros(now))
            .bind(tenant)
            .bind(id)
            .bind(tier.as_str())
            .bind(micros(counted_after))
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
        }
        tx.commit().await.map_err(store_error)?;
        Ok(())
    }
}
