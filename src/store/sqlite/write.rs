//! `WriteTx` on SQLite: the primitives of `store::write`, each one statement
//! in a transaction that holds the write gate from BEGIN until its changes
//! reached the in-process indexes. Every primitive records what the vector
//! and text indexes must do once the transaction commits (`IndexOp`).
//!
//! The commit and the index changes after it run in a task of their own, so
//! a request dropped mid-commit (a timeout, a client that went away) cannot
//! leave a committed row that searches never find.

use std::time::Instant;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{QueryBuilder, Sqlite, Transaction};
use uuid::Uuid;

use super::rows::{self, COLUMNS, MemoryRow, encode_vector, to_json_text};
use super::{SqliteStore, micros, observe, store_error, transfer};
use crate::domain::rows::SkillState;
use crate::domain::{Memory, Tier};
use crate::store::write::{Slot, VectorChange, WriteTx};
use crate::store::{Embedding, IdempotencyKey, StoreError, StoreResult, StoredMemory, StoredResponse};

/// A change to the in-process indexes (vectors and full text), applied once
/// its transaction committed.
pub(super) enum IndexOp {
    /// The memory as written (inserted, upserted, rewritten or
    /// re-embedded), with its vector if it has one.
    Put(Memory, Option<Embedding>),
    /// The memory keeps its text and vector; its filter fields may have changed.
    Refresh(Memory),
    /// A fact was superseded.
    Retire(Uuid),
    /// The memory is gone.
    Remove(Uuid),
}

pub(super) struct SqliteTx {
    store: SqliteStore,
    /// Held until the index changes are applied (dropped with the task).
    gate: tokio::sync::OwnedMutexGuard<()>,
    pub(super) tx: Transaction<'static, Sqlite>,
    /// The tenant the index changes belong to (one per transaction).
    tenant: Option<String>,
    ops: Vec<IndexOp>,
    started: Instant,
}

impl SqliteStore {
    pub(super) async fn begin_write(&self) -> StoreResult<SqliteTx> {
        let started = Instant::now();
        let gate = self.inner.write_gate.clone().lock_owned().await;
        let tx = self.inner.pool.begin().await.map_err(store_error)?;
        Ok(SqliteTx { store: self.clone(), gate, tx, tenant: None, ops: Vec::new(), started })
    }
}

impl SqliteTx {
    pub(super) fn record(&mut self, tenant: &str, op: IndexOp) {
        if self.tenant.is_none() {
            self.tenant = Some(tenant.to_string());
        }
        debug_assert_eq!(self.tenant.as_deref(), Some(tenant), "one tenant per write transaction");
        self.ops.push(op);
    }

    async fn fetch_rows(&mut self, mut qb: QueryBuilder<Sqlite>) -> StoreResult<Vec<Memory>> {
        let rows: Vec<MemoryRow> = qb.build_query_as().fetch_all(&mut *self.tx).await.map_err(store_error)?;
        rows.into_iter().map(Memory::try_from).collect()
    }
}

#[derive(sqlx::FromRow)]
struct CountedRow {
    #[sqlx(flatten)]
    row: MemoryRow,
    counted: i32,
}

#[async_trait]
impl WriteTx for SqliteTx {
    /// The write gate already runs one write transaction at a time.
    async fn lock(&mut self, _keys: &[String]) -> StoreResult<()> {
        Ok(())
    }

    async fn claim_key(
        &mut self,
        tenant: &str,
        key: &IdempotencyKey,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<StoredResponse>> {
        let ttl = self.store.inner.idempotency_ttl;
        let claimed: Option<i64> = sqlx::query_scalar(
            "insert into idempotency_keys (tenant_id, key, request_hash, status, response, created_at, updated_at) \
             values (?1, ?2, ?3, 0, 'null', ?4, ?4) \
             on conflict (tenant_id, key) do update set request_hash = excluded.request_hash, status = 0, \
                 response = 'null', created_at = excluded.created_at, updated_at = excluded.updated_at \
             where idempotency_keys.created_at <= ?5 \
             returning 1",
        )
        .bind(tenant)
        .bind(&key.key)
        .bind(&key.request_hash)
        .bind(micros(now))
        .bind(micros(now - ttl))
        .fetch_optional(&mut *self.tx)
        .await
        .map_err(store_error)?;
        if claimed.is_some() {
            return Ok(None);
        }
        let (request_hash, status, body): (String, i64, String) = sqlx::query_as(
            "select request_hash, status, response from idempotency_keys where tenant_id = ? and key = ?",
        )
        .bind(tenant)
        .bind(&key.key)
        .fetch_one(&mut *self.tx)
        .await
        .map_err(store_error)?;
        let body = serde_json::from_str(&body).map_err(|e| StoreError::Internal(e.into()))?;
        Ok(Some(StoredResponse { request_hash, status: status as u16, body }))
    }

    async fn save_response(
        &mut self,
        tenant: &str,
        key: &str,
        status: u16,
        body: &Value,
        now: DateTime<Utc>,
    ) -> StoreResult<()> {
        sqlx::query(
            "update idempotency_keys set status = ?, response = ?, updated_at = ? where tenant_id = ? and key = ?",
        )
        .bind(i64::from(status))
        .bind(to_json_text(body)?)
        .bind(micros(now))
        .bind(tenant)
        .bind(key)
        .execute(&mut *self.tx)
        .await
        .map_err(store_error)?;
        Ok(())
    }

    async fn facts_by_hash(
        &mut self,
        tenant: &str,
        agent_id: &str,
        namespace: &str,
        content_hash: &str,
    ) -> StoreResult<Vec<Memory>> {
        let mut qb = QueryBuilder::new(format!("select {COLUMNS} from memories m where m.tenant_id = "));
        qb.push_bind(tenant.to_string()).push(" and m.tier = 'semantic' and m.agent_id = ");
        qb.push_bind(agent_id.to_string()).push(" and m.namespace = ").push_bind(namespace.to_string());
        qb.push(" and m.content_hash = ").push_bind(content_hash.to_string());
        qb.push(" and (m.valid_until is null or m.contested_by is not null) order by m.created_at desc, m.id desc");
        self.fetch_rows(qb).await
    }

    async fn slot_facts(
        &mut self,
        tenant: &str,
        slot: &Slot<'_>,
        object: Option<Option<&str>>,
    ) -> StoreResult<Vec<Memory>> {
        let mut qb = QueryBuilder::new(format!("select {COLUMNS} from memories m where m.tenant_id = "));
        qb.push_bind(tenant.to_string()).push(" and m.tier = 'semantic' and m.agent_id = ");
        qb.push_bind(slot.agent_id.to_string()).push(" and m.namespace = ").push_bind(slot.namespace.to_string());
        qb.push(" and m.subject = ").push_bind(slot.subject.to_string());
        qb.push(" and m.predicate = ").push_bind(slot.predicate.to_string());
        qb.push(" and m.valid_until is null");
        if let Some(object) = object {
            // `is`: equality that holds between two nulls.
            qb.push(" and m.object is ").push_bind(object.map(str::to_string));
        }
        self.fetch_rows(qb).await
    }

    async fn retire_facts(&mut self, tenant: &str, ids: &[Uuid], at: DateTime<Utc>) -> StoreResult<()> {
        for id in ids {
            sqlx::query("update memories set valid_until = ?1, updated_at = ?1 where tenant_id = ?2 and id = ?3")
                .bind(micros(at))
                .bind(tenant)
                .bind(id)
                .execute(&mut *self.tx)
                .await
                .map_err(store_error)?;
            self.record(tenant, IndexOp::Retire(*id));
        }
        Ok(())
    }

    async fn skill(&mut self, tenant: &str, agent_id: &str, skill_name: &str) -> StoreResult<Option<SkillState>> {
        let row: Option<CountedRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "select {COLUMNS}, m.reward_count as counted from memories m where m.tenant_id = ? \
             and m.tier = 'procedural' and m.agent_id = ? and m.skill_name = ?"
        )))
        .bind(tenant)
        .bind(agent_id)
        .bind(skill_name)
        .fetch_optional(&mut *self.tx)
        .await
        .map_err(store_error)?;
        row.map(|r| Ok(SkillState { skill: r.row.try_into()?, reward_count: r.counted })).transpose()
    }

    async fn row(&mut self, tenant: &str, id: Uuid) -> StoreResult<Option<(Memory, i32)>> {
        let row: Option<CountedRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "select {COLUMNS}, coalesce(m.reward_count, 0) as counted from memories m \
             where m.tenant_id = ? and m.id = ?"
        )))
        .bind(tenant)
        .bind(id)
        .fetch_optional(&mut *self.tx)
        .await
        .map_err(store_error)?;
        row.map(|r| Ok((r.row.try_into()?, r.counted))).transpose()
    }

    async fn insert(&mut self, tenant: &str, row: &StoredMemory) -> StoreResult<Memory> {
        let mut qb = transfer::insert(tenant, row).map_err(StoreError::Internal)?;
        qb.push(format!(" returning {}", rows::returning()));
        let stored: MemoryRow = qb.build_query_as().fetch_one(&mut *self.tx).await.map_err(store_error)?;
        let memory: Memory = stored.try_into()?;
        self.record(tenant, IndexOp::Put(memory.clone(), row.embedding.clone()));
        Ok(memory)
    }

    async fn update(&mut self, tenant: &str, row: &StoredMemory, vector: VectorChange<'_>) -> StoreResult<Memory> {
        let m = &row.memory;
        let mut qb = QueryBuilder::new("update memories set ");
        let mut set = qb.separated(", ");
        set.push("user_id = ").push_bind_unseparated(m.user_id.clone());
        set.push("session_id = ").push_bind_unseparated(m.session_id.clone());
        set.push("content = ").push_bind_unseparated(m.content.clone());
        set.push("content_hash = ").push_bind_unseparated(row.content_hash.clone());
        set.push("importance = ").push_bind_unseparated(m.importance);
        set.push("retention = ").push_bind_unseparated(m.retention.as_str());
        set.push("private = ").push_bind_unseparated(m.private);
        set.push("metadata = ").push_bind_unseparated(to_json_text(&m.metadata)?);
        set.push("occurred_at = ").push_bind_unseparated(micros(m.occurred_at));
        set.push("updated_at = ").push_bind_unseparated(micros(m.updated_at));
        set.push("expires_at = ").push_bind_unseparated(m.expires_at.map(micros));
        if let VectorChange::Set(e) = vector {
            set.push("embedding = ").push_bind_unseparated(e.map(|e| encode_vector(&e.vector)));
            set.push("embedding_model = ").push_bind_unseparated(e.map(|e| e.model.clone()));
        }
        if m.tier == Tier::Procedural {
            set.push("trigger_pattern = ").push_bind_unseparated(m.trigger_pattern.clone());
            set.push("policy = ").push_bind_unseparated(m.policy.as_ref().map(to_json_text).transpose()?);
            set.push("tool_sequence = ").push_bind_unseparated(m.tool_sequence.as_ref().map(to_json_text).transpose()?);
            set.push("success_count = ").push_bind_unseparated(m.success_count.unwrap_or(0));
            set.push("failure_count = ").push_bind_unseparated(m.failure_count.unwrap_or(0));
            set.push("reward_count = ").push_bind_unseparated(row.reward_count.unwrap_or(0));
            set.push("avg_reward = ").push_bind_unseparated(m.avg_reward.unwrap_or(0.0));
            set.push("version = ").push_bind_unseparated(m.version.unwrap_or(1));
        }
        qb.push(" where tenant_id = ").push_bind(tenant.to_string()).push(" and id = ").push_bind(m.id);
        qb.push(format!(" returning {}", rows::returning()));
        let stored: MemoryRow = qb.build_query_as().fetch_one(&mut *self.tx).await.map_err(store_error)?;
        let memory: Memory = stored.try_into()?;
        let op = match vector {
            VectorChange::Set(e) => IndexOp::Put(memory.clone(), e.cloned()),
            VectorChange::Keep => IndexOp::Refresh(memory.clone()),
        };
        self.record(tenant, op);
        Ok(memory)
    }

    async fn delete(&mut self, tenant: &str, id: Uuid) -> StoreResult<Option<Tier>> {
        let tier: Option<String> =
            sqlx::query_scalar("delete from memories where tenant_id = ? and id = ? returning tier")
                .bind(tenant)
                .bind(id)
                .fetch_optional(&mut *self.tx)
                .await
                .map_err(store_error)?;
        if tier.is_some() {
            self.record(tenant, IndexOp::Remove(id));
        }
        Ok(tier.as_deref().and_then(Tier::parse))
    }

    async fn stage_working(
        &mut self,
        tenant: &str,
        key: Option<&str>,
        entries: &[Memory],
        now: DateTime<Utc>,
    ) -> StoreResult<()> {
        for m in entries {
            sqlx::query(
                "insert into working_outbox (tenant_id, id, idempotency_key, entry, created_at, updated_at) \
                 values (?1, ?2, ?3, ?4, ?5, ?5)",
            )
            .bind(tenant)
            .bind(m.id)
            .bind(key)
            .bind(to_json_text(m)?)
            .bind(micros(now))
            .execute(&mut *self.tx)
            .await
            .map_err(store_error)?;
        }
        Ok(())
    }

    async fn stage_eviction(&mut self, tenant: &str, id: Uuid, now: DateTime<Utc>) -> StoreResult<()> {
        sqlx::query("insert into skill_evictions (eviction_id, tenant_id, id, created_at) values (?1, ?2, ?3, ?4)")
            .bind(Uuid::now_v7())
            .bind(tenant)
            .bind(id)
            .bind(micros(now))
            .execute(&mut *self.tx)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn mark_consolidated(
        &mut self,
        tenant: &str,
        _users: &[String],
        ids: &[Uuid],
        at: DateTime<Utc>,
    ) -> StoreResult<u64> {
        // The write gate keeps erasures (and every other writer) out until
        // this transaction ends; no user lock is needed.
        let mut marked = 0;
        for chunk in ids.chunks(500) {
            let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new("update memories set consolidated_at = ");
            qb.push_bind(micros(at));
            qb.push(" where tier = 'episodic' and consolidated_at is null and (expires_at is null or expires_at > ");
            qb.push_bind(micros(at));
            qb.push(") and tenant_id = ");
            qb.push_bind(tenant.to_string());
            qb.push(" and id in (");
            let mut list = qb.separated(", ");
            for id in chunk {
                list.push_bind(*id);
            }
            list.push_unseparated(")");
            marked += qb.build().execute(&mut *self.tx).await.map_err(store_error)?.rows_affected();
        }
        Ok(marked)
    }

    async fn commit(self: Box<Self>) -> StoreResult<()> {
        let SqliteTx { store, gate, tx, tenant, ops, started } = *self;
        // The commit and the index changes run in their own task: dropping
        // the caller from here on (a timeout, a client that went away) no
        // longer stops them halfway. The gate goes with them.
        let task = tokio::spawn(async move {
            let _gate = gate;
            tx.commit().await.map_err(store_error)?;
            if let Some(tenant) = tenant {
                store.apply(&tenant, ops);
            }
            observe("write", started);
            Ok(())
        });
        task.await.map_err(|e| StoreError::Internal(anyhow::Error::new(e).context("the commit task")))?
    }
}
