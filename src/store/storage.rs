//! The configured storage: one handle per capability, each implemented once
//! per backend, so a caller never asks which backend it has and a new
//! operation is written once per backend instead of dispatched by hand.
//!
//! Must not: hold rules. A capability here is a primitive a backend performs;
//! what to do with it (which rows to forget, in what order) is decided in
//! `domain` and in the jobs.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::erasure::{ErasureTx, Erasures};
use super::postgres::PgStore;
use super::redis::RedisStore;
use super::sqlite::{LocalSkillCache, SqliteStore};
use super::{
    Cursor, Doomed, Maintenance, MemoryStore, SkillCache, StoreResult, Sweep, SweepCursor, SweepLease, Transfer,
    TransferRow, WorkingMemory,
};
use crate::domain::erasure::{AuditEntry, Counts, ErasureRecord, NewAuditEntry};
use crate::domain::holds::Hold;
use crate::domain::retention::{DecayCandidate, DecayRule};
use crate::domain::{Memory, Tier};

/// Every capability of the active backend. Cheap to clone: handles only.
#[derive(Clone)]
pub struct Storage {
    /// `postgres` or `embedded`, for logs and tests.
    pub name: &'static str,
    /// The persistent tiers.
    pub memories: Arc<dyn MemoryStore>,
    pub working: Arc<dyn WorkingMemory>,
    pub skills: Arc<dyn SkillCache>,
    /// Upkeep: model indexes, re-embedding, idempotency keys, closing.
    pub maintenance: Arc<dyn Maintenance>,
    /// Export and import.
    pub transfer: Arc<dyn Transfer>,
    /// Deleting expired and decayed memories.
    pub sweep: Arc<dyn Sweep>,
    /// Erasing a data subject's memories, and the audit log.
    pub erasure: Arc<dyn Erasures>,
    /// Sharing grants, teams and shared copies.
    pub sharing: Arc<dyn super::share::Sharing>,
    /// Waiting episodes, per-agent locks and jobs of consolidation.
    pub consolidation: Arc<dyn super::consolidate::Consolidations>,
    /// The connection pool, for the pool gauges.
    pub pool: DbPool,
    /// The backend's own handle, for tests that look at its tables directly
    /// and nothing else: operations go through the capabilities above.
    raw: Raw,
}

#[derive(Clone)]
enum Raw {
    Postgres(PgStore),
    Embedded(SqliteStore),
}

/// The connection pool of the active backend.
#[derive(Clone)]
pub enum DbPool {
    Postgres(sqlx::PgPool),
    Sqlite(sqlx::SqlitePool),
}

impl DbPool {
    /// (open connections, idle connections).
    pub fn connections(&self) -> (u32, usize) {
        match self {
            DbPool::Postgres(p) => (p.size(), p.num_idle()),
            DbPool::Sqlite(p) => (p.size(), p.num_idle()),
        }
    }
}

impl Storage {
    /// Postgres for the persistent tiers; Redis for working memory and the skill cache.
    pub fn postgres(pg: PgStore, redis: RedisStore) -> Storage {
        let both = Arc::new(PostgresRedis { pg: pg.clone(), redis: redis.clone() });
        let redis = Arc::new(redis);
        Storage {
            name: "postgres",
            memories: Arc::new(pg.clone()),
            working: redis.clone(),
            skills: redis,
            maintenance: both.clone(),
            transfer: both.clone(),
            sweep: both.clone(),
            erasure: both,
            sharing: Arc::new(pg.clone()),
            consolidation: Arc::new(pg.clone()),
            pool: DbPool::Postgres(pg.pool().clone()),
            raw: Raw::Postgres(pg),
        }
    }

    /// One SQLite database for everything; skills cached in the process for
    /// `skill_ttl`, at most `skill_entries` of them.
    pub fn embedded(store: SqliteStore, skill_ttl: Duration, skill_entries: usize) -> Storage {
        let handle = Arc::new(store.clone());
        Storage {
            name: "embedded",
            memories: handle.clone(),
            working: Arc::new(store.working_memory()),
            skills: Arc::new(LocalSkillCache::new(skill_ttl, skill_entries)),
            maintenance: handle.clone(),
            transfer: handle.clone(),
            sweep: handle.clone(),
            erasure: handle.clone(),
            sharing: handle.clone(),
            consolidation: handle,
            pool: DbPool::Sqlite(store.pool().clone()),
            raw: Raw::Embedded(store),
        }
    }

    /// The Postgres store when that is the backend (for tests that read its tables).
    pub fn pg(&self) -> Option<&PgStore> {
        match &self.raw {
            Raw::Postgres(pg) => Some(pg),
            Raw::Embedded(_) => None,
        }
    }

    /// The SQLite store when that is the backend (for tests that read its
    /// tables and in-process indexes).
    pub fn sqlite(&self) -> Option<&SqliteStore> {
        match &self.raw {
            Raw::Postgres(_) => None,
            Raw::Embedded(s) => Some(s),
        }
    }
}

/// The Postgres backend's capabilities that span both of its stores.
struct PostgresRedis {
    pg: PgStore,
    redis: RedisStore,
}

#[async_trait]
impl Maintenance for PostgresRedis {
    async fn prepare_model(&self, model: &str, dimensions: usize) -> anyhow::Result<()> {
        self.pg.ensure_model(model, dimensions).await
    }

    async fn reembed_pending(&self, model: &str) -> StoreResult<i64> {
        self.pg.reembed_pending(model).await
    }

    async fn reembed_batch(
        &self,
        tier: Tier,
        embedder: &dyn crate::embed::Embedder,
        batch: usize,
        now: DateTime<Utc>,
    ) -> anyhow::Result<usize> {
        self.pg.reembed_batch(tier, embedder, batch, now).await
    }

    async fn forget_idempotency_keys(&self, now: DateTime<Utc>) -> anyhow::Result<u64> {
        self.pg.forget_idempotency_keys(now).await
    }

    async fn move_working_layout(&self, now: DateTime<Utc>) -> anyhow::Result<u64> {
        Ok(self.redis.move_old_layout(now).await?)
    }

    async fn close(&self) {
        self.redis.shutdown().await;
        self.pg.pool().close().await;
        self.pg.close_replica().await;
    }
}

#[async_trait]
impl Transfer for PostgresRedis {
    async fn export_page(
        &self,
        tenant: &str,
        tier: Tier,
        after: Option<Cursor>,
        limit: usize,
        vectors: bool,
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<TransferRow>> {
        self.pg.export_page(tenant, tier, after, limit, vectors, now).await
    }

    async fn import_batch(&self, tenant: &str, rows: &[TransferRow]) -> anyhow::Result<Vec<bool>> {
        self.pg.import_batch(tenant, rows).await
    }

    async fn export_count(&self, tenant: &str, tier: Tier, now: DateTime<Utc>) -> StoreResult<u64> {
        self.pg.export_count(tenant, tier, now).await
    }

    async fn working_entries(&self, tenant: &str) -> StoreResult<Vec<Memory>> {
        self.redis.entries(tenant).await
    }
}

#[async_trait]
impl Sweep for PostgresRedis {
    async fn try_begin(&self) -> StoreResult<Option<SweepLease>> {
        self.pg.try_begin_sweep().await
    }

    async fn delete_expired(&self, tier: Tier, now: DateTime<Utc>, limit: usize) -> StoreResult<Vec<Doomed>> {
        match tier {
            Tier::Working => self.redis.sweep_expired(now, limit).await,
            _ => self.pg.delete_expired(tier, now, limit).await,
        }
    }

    async fn expired(
        &self,
        tenant: &str,
        tier: Tier,
        now: DateTime<Utc>,
        limit: usize,
    ) -> StoreResult<(u64, Vec<uuid::Uuid>)> {
        match tier {
            Tier::Working => self.redis.expired_of(tenant, now, limit).await,
            _ => self.pg.expired(tenant, tier, now, limit).await,
        }
    }

    async fn expired_backlog(&self, now: DateTime<Utc>) -> StoreResult<Vec<(Tier, u64)>> {
        // Working memory is left out: counting it means reading every entry.
        self.pg.expired_backlog(now).await
    }

    async fn decay_candidates(
        &self,
        tier: Tier,
        tenant: Option<&str>,
        rule: &DecayRule,
        after: Option<&SweepCursor>,
        limit: usize,
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<DecayCandidate>> {
        match tier {
            Tier::Working => Ok(Vec::new()),
            _ => self.pg.decay_candidates(tier, tenant, rule, after, limit, now).await,
        }
    }

    async fn delete(&self, tier: Tier, rows: &[Doomed]) -> StoreResult<Vec<Doomed>> {
        match tier {
            Tier::Working => Ok(Vec::new()),
            _ => self.pg.delete_rows(tier, rows).await,
        }
    }

    fn index_sizes(&self) -> Vec<(&'static str, usize)> {
        Vec::new()
    }
}

#[async_trait]
impl Maintenance for SqliteStore {
    async fn prepare_model(&self, _model: &str, _dimensions: usize) -> anyhow::Result<()> {
        // The in-process vector index groups rows by model as they come.
        Ok(())
    }

    async fn reembed_pending(&self, model: &str) -> StoreResult<i64> {
        SqliteStore::reembed_pending(self, model).await
    }

    async fn reembed_batch(
        &self,
        tier: Tier,
        embedder: &dyn crate::embed::Embedder,
        batch: usize,
        now: DateTime<Utc>,
    ) -> anyhow::Result<usize> {
        SqliteStore::reembed_batch(self, tier, embedder, batch, now).await
    }

    async fn forget_idempotency_keys(&self, now: DateTime<Utc>) -> anyhow::Result<u64> {
        SqliteStore::forget_idempotency_keys(self, now).await
    }

    async fn move_working_layout(&self, _now: DateTime<Utc>) -> anyhow::Result<u64> {
        Ok(0)
    }

    async fn close(&self) {
        SqliteStore::close(self).await
    }
}

#[async_trait]
impl Transfer for SqliteStore {
    async fn export_page(
        &self,
        tenant: &str,
        tier: Tier,
        after: Option<Cursor>,
        limit: usize,
        vectors: bool,
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<TransferRow>> {
        SqliteStore::export_page(self, tenant, tier, after, limit, vectors, now).await
    }

    async fn import_batch(&self, tenant: &str, rows: &[TransferRow]) -> anyhow::Result<Vec<bool>> {
        SqliteStore::import_batch(self, tenant, rows).await
    }

    async fn export_count(&self, tenant: &str, tier: Tier, now: DateTime<Utc>) -> StoreResult<u64> {
        SqliteStore::export_count(self, tenant, tier, now).await
    }

    async fn working_entries(&self, tenant: &str) -> StoreResult<Vec<Memory>> {
        self.working_memory().entries(tenant).await
    }
}

#[async_trait]
impl Erasures for PostgresRedis {
    async fn begin_erasure(&self) -> StoreResult<Box<dyn ErasureTx>> {
        self.pg.begin_erasure().await
    }

    async fn erasure(&self, tenant: &str, id: uuid::Uuid) -> StoreResult<Option<ErasureRecord>> {
        self.pg.erasure(tenant, id).await
    }

    async fn unfinished(&self, limit: usize) -> StoreResult<Vec<ErasureRecord>> {
        self.pg.unfinished_erasures(limit).await
    }

    async fn update_erasure(&self, record: &ErasureRecord) -> StoreResult<()> {
        self.pg.update_erasure(record).await
    }

    async fn claimed(&self, tenant: &str, erasure: uuid::Uuid) -> StoreResult<Vec<(Tier, uuid::Uuid)>> {
        self.pg.claimed(tenant, erasure).await
    }

    async fn release(&self, tenant: &str, erasure: uuid::Uuid) -> StoreResult<()> {
        self.pg.release(tenant, erasure).await
    }

    async fn try_lease(&self) -> StoreResult<Option<SweepLease>> {
        self.pg.try_lease_erasures().await
    }

    async fn sample_vectors(&self, tenant: &str, erasure: uuid::Uuid) -> StoreResult<Vec<(Tier, super::Embedding)>> {
        self.pg.sample_vectors(tenant, erasure).await
    }

    async fn purge(&self) -> StoreResult<std::collections::BTreeMap<String, String>> {
        self.pg.vacuum_for_erasure().await?;
        Ok(super::postgres::vacuumed())
    }

    async fn verify(
        &self,
        record: &ErasureRecord,
        claimed: &[(Tier, uuid::Uuid)],
        samples: &[(Tier, super::Embedding)],
    ) -> StoreResult<Counts> {
        let mut found = Counts::new();
        self.pg.verify_erasure(record, claimed, samples, &mut found).await?;
        let working = self
            .redis
            .entries(&record.tenant)
            .await?
            .iter()
            .filter(|m| record.subject.covers(m, record.requested_at))
            .count();
        crate::domain::erasure::Receipt::add(&mut found, "redis", "working", working as u64);
        let skills: Vec<uuid::Uuid> =
            claimed.iter().filter(|(t, _)| *t == Tier::Procedural).map(|(_, id)| *id).collect();
        let cached = self.redis.cached_skills(&record.tenant, &skills).await?;
        crate::domain::erasure::Receipt::add(&mut found, "redis", "skill_cache", cached);
        Ok(found)
    }

    async fn append_audit(&self, entry: &NewAuditEntry) -> StoreResult<AuditEntry> {
        self.pg.append_audit(entry).await
    }

    async fn audit_page(&self, tenant: Option<&str>, after: i64, limit: usize) -> StoreResult<Vec<AuditEntry>> {
        self.pg.audit_page(tenant, after, limit).await
    }

    async fn hold(&self, tenant: &str, id: uuid::Uuid) -> StoreResult<Option<Hold>> {
        self.pg.hold(tenant, id).await
    }

    async fn active_holds(&self, tenant: &str, user_id: Option<&str>) -> StoreResult<Vec<Hold>> {
        self.pg.tenant_holds(tenant, user_id).await
    }
}

#[async_trait]
impl Erasures for SqliteStore {
    async fn begin_erasure(&self) -> StoreResult<Box<dyn ErasureTx>> {
        SqliteStore::begin_erasure(self).await
    }

    async fn erasure(&self, tenant: &str, id: uuid::Uuid) -> StoreResult<Option<ErasureRecord>> {
        SqliteStore::erasure(self, tenant, id).await
    }

    async fn unfinished(&self, limit: usize) -> StoreResult<Vec<ErasureRecord>> {
        self.unfinished_erasures(limit).await
    }

    async fn update_erasure(&self, record: &ErasureRecord) -> StoreResult<()> {
        SqliteStore::update_erasure(self, record).await
    }

    async fn claimed(&self, tenant: &str, erasure: uuid::Uuid) -> StoreResult<Vec<(Tier, uuid::Uuid)>> {
        SqliteStore::claimed(self, tenant, erasure).await
    }

    async fn release(&self, tenant: &str, erasure: uuid::Uuid) -> StoreResult<()> {
        SqliteStore::release(self, tenant, erasure).await
    }

    async fn try_lease(&self) -> StoreResult<Option<SweepLease>> {
        self.try_lease_erasures().await
    }

    async fn sample_vectors(&self, _tenant: &str, _erasure: uuid::Uuid) -> StoreResult<Vec<(Tier, super::Embedding)>> {
        Ok(self.sample_vectors_none())
    }

    async fn purge(&self) -> StoreResult<std::collections::BTreeMap<String, String>> {
        self.checkpoint_for_erasure().await
    }

    async fn verify(
        &self,
        record: &ErasureRecord,
        claimed: &[(Tier, uuid::Uuid)],
        _samples: &[(Tier, super::Embedding)],
    ) -> StoreResult<Counts> {
        self.verify_erasure(record, claimed).await
    }

    async fn append_audit(&self, entry: &NewAuditEntry) -> StoreResult<AuditEntry> {
        SqliteStore::append_audit(self, entry).await
    }

    async fn audit_page(&self, tenant: Option<&str>, after: i64, limit: usize) -> StoreResult<Vec<AuditEntry>> {
        SqliteStore::audit_page(self, tenant, after, limit).await
    }

    async fn hold(&self, tenant: &str, id: uuid::Uuid) -> StoreResult<Option<Hold>> {
        SqliteStore::hold(self, tenant, id).await
    }

    async fn active_holds(&self, tenant: &str, user_id: Option<&str>) -> StoreResult<Vec<Hold>> {
        self.tenant_holds(tenant, user_id).await
    }
}
