//! `WriteTx` on Postgres: the primitives of `store::write`, each one
//! statement in the request's transaction. Writers deciding about the same
//! fact slot or skill take turns on transaction-scoped advisory locks;
//! rows read for update are locked with FOR UPDATE.

use std::time::Instant;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{AssertSqlSafe, Postgres, QueryBuilder, Transaction};
use uuid::Uuid;

use super::rows::{self, MemoryRow};
use super::{PgStore, observe, store_error, transfer};
use crate::domain::rows::SkillState;
use crate::domain::{Memory, Tier};
use crate::store::write::{Slot, VectorChange, WriteTx};
use crate::store::{IdempotencyKey, StoreResult, StoredMemory, StoredResponse};

pub(super) struct PgTx {
    pub(super) tx: Transaction<'static, Postgres>,
    idempotency_ttl: chrono::Duration,
    started: Instant,
    /// The tenant whose rows this transaction deleted: its read fence is
    /// raised just before the commit (`replica.rs`), the last lock taken,
    /// so two transactions deleting rows of one tenant cannot deadlock on it.
    pub(super) deleted_for: Option<String>,
}

impl PgStore {
    pub(super) async fn begin_write(&self) -> StoreResult<PgTx> {
        Ok(PgTx {
            tx: self.pool.begin().await.map_err(store_error)?,
            idempotency_ttl: self.idempotency_ttl,
            started: Instant::now(),
            deleted_for: None,
        })
    }
}

/// The row of an id in whichever table holds it, locked for update (FOR
/// UPDATE is not allowed beside UNION, so each table is a CTE of its own).
fn row_for_update_sql() -> String {
    format!(
        "WITH e AS (SELECT {e}, 0 AS reward_count FROM episodic_memory WHERE tenant_id = $1 AND id = $2 FOR UPDATE), \
              s AS (SELECT {s}, 0 AS reward_count FROM semantic_memory WHERE tenant_id = $1 AND id = $2 FOR UPDATE), \
              p AS (SELECT {p}, reward_count FROM procedural_memory WHERE tenant_id = $1 AND id = $2 FOR UPDATE) \
         SELECT * FROM e UNION ALL SELECT * FROM s UNION ALL SELECT * FROM p",
        e = rows::episodic_columns(),
        s = rows::semantic_columns(),
        p = rows::procedural_columns(),
    )
}

#[derive(sqlx::FromRow)]
struct CountedRow {
    #[sqlx(flatten)]
    row: MemoryRow,
    reward_count: i32,
}

#[async_trait]
impl WriteTx for PgTx {
    async fn lock(&mut self, keys: &[String]) -> StoreResult<()> {
        if keys.is_empty() {
            return Ok(());
        }
        // One statement, taking the locks in the order of their hashes: any
        // two transactions take the locks they share in the same order, so
        // they cannot deadlock on them.
        sqlx::query(
            "SELECT count(pg_advisory_xact_lock(h)) FROM \
             (SELECT DISTINCT hashtextextended(k, 0) AS h FROM unnest($1::text[]) AS k ORDER BY h) AS l",
        )
        .bind(keys)
        .execute(&mut *self.tx)
        .await
        .map_err(store_error)?;
        Ok(())
    }

    async fn claim_key(
        &mut self,
        tenant: &str,
        key: &IdempotencyKey,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<StoredResponse>> {
        // Takes the key unless a fresh one exists. A concurrent request with
        // the same key blocks here until the first one commits or aborts.
        let claimed: Option<bool> = sqlx::query_scalar(
            "INSERT INTO idempotency_keys (tenant_id, key, request_hash, status, response, created_at, updated_at) \
             VALUES ($1, $2, $3, 0, 'null', $4, $4) \
             ON CONFLICT (tenant_id, key) DO UPDATE SET request_hash = EXCLUDED.request_hash, status = 0, \
                 response = 'null', created_at = EXCLUDED.created_at, updated_at = EXCLUDED.updated_at \
             WHERE idempotency_keys.created_at <= $5 \
             RETURNING true",
        )
        .bind(tenant)
        .bind(&key.key)
        .bind(&key.request_hash)
        .bind(now)
        .bind(now - self.idempotency_ttl)
        .fetch_optional(&mut *self.tx)
        .await
        .map_err(store_error)?;
        if claimed.is_some() {
            return Ok(None);
        }
        let (request_hash, status, body): (String, i16, Value) = sqlx::query_as(
            "SELECT request_hash, status, response FROM idempotency_keys WHERE tenant_id = $1 AND key = $2",
        )
        .bind(tenant)
        .bind(&key.key)
        .fetch_one(&mut *self.tx)
        .await
        .map_err(store_error)?;
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
            "UPDATE idempotency_keys SET status = $3, response = $4, updated_at = $5 WHERE tenant_id = $1 AND key = $2",
        )
        .bind(tenant)
        .bind(key)
        .bind(status as i16)
        .bind(body)
        .bind(now)
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
        let rows: Vec<MemoryRow> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {} FROM semantic_memory WHERE tenant_id = $1 AND agent_id = $2 AND namespace = $3 \
             AND content_hash = $4 AND (valid_until IS NULL OR contested_by IS NOT NULL) \
             ORDER BY created_at DESC, id DESC",
            rows::semantic_columns()
        )))
        .bind(tenant)
        .bind(agent_id)
        .bind(namespace)
        .bind(content_hash)
        .fetch_all(&mut *self.tx)
        .await
        .map_err(store_error)?;
        rows.into_iter().map(Memory::try_from).collect()
    }

    async fn slot_facts(
        &mut self,
        tenant: &str,
        slot: &Slot<'_>,
        object: Option<Option<&str>>,
    ) -> StoreResult<Vec<Memory>> {
        let rows: Vec<MemoryRow> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {} FROM semantic_memory WHERE tenant_id = $1 AND agent_id = $2 AND namespace = $3 \
             AND subject = $4 AND predicate = $5 AND valid_until IS NULL \
             AND (NOT $6 OR object IS NOT DISTINCT FROM $7) FOR UPDATE",
            rows::semantic_columns()
        )))
        .bind(tenant)
        .bind(slot.agent_id)
        .bind(slot.namespace)
        .bind(slot.subject)
        .bind(slot.predicate)
        .bind(object.is_some())
        .bind(object.flatten())
        .fetch_all(&mut *self.tx)
        .await
        .map_err(store_error)?;
        rows.into_iter().map(Memory::try_from).collect()
    }

    async fn retire_facts(&mut self, tenant: &str, ids: &[Uuid], at: DateTime<Utc>) -> StoreResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        sqlx::query(
            "UPDATE semantic_memory SET valid_until = $3, updated_at = $3 WHERE tenant_id = $1 AND id = ANY($2)",
        )
        .bind(tenant)
        .bind(ids)
        .bind(at)
        .execute(&mut *self.tx)
        .await
        .map_err(store_error)?;
        Ok(())
    }

    async fn skill(&mut self, tenant: &str, agent_id: &str, skill_name: &str) -> StoreResult<Option<SkillState>> {
        let row: Option<CountedRow> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {}, reward_count FROM procedural_memory WHERE tenant_id = $1 AND agent_id = $2 \
             AND skill_name = $3 FOR UPDATE",
            rows::procedural_columns()
        )))
        .bind(tenant)
        .bind(agent_id)
        .bind(skill_name)
        .fetch_optional(&mut *self.tx)
        .await
        .map_err(store_error)?;
        row.map(|r| Ok(SkillState { skill: r.row.try_into()?, reward_count: r.reward_count })).transpose()
    }

    async fn row(&mut self, tenant: &str, id: Uuid) -> StoreResult<Option<(Memory, i32)>> {
        let row: Option<CountedRow> = sqlx::query_as(AssertSqlSafe(row_for_update_sql()))
            .bind(tenant)
            .bind(id)
            .fetch_optional(&mut *self.tx)
            .await
            .map_err(store_error)?;
        row.map(|r| Ok((r.row.try_into()?, r.reward_count))).transpose()
    }

    async fn insert(&mut self, tenant: &str, row: &StoredMemory) -> StoreResult<Memory> {
        let mut qb = transfer::insert(tenant, row).map_err(crate::store::StoreError::Internal)?;
        qb.push(format!(" RETURNING {}", rows::columns(row.memory.tier)));
        let stored: MemoryRow = qb.build_query_as().fetch_one(&mut *self.tx).await.map_err(store_error)?;
        stored.try_into()
    }

    async fn update(&mut self, tenant: &str, row: &StoredMemory, vector: VectorChange<'_>) -> StoreResult<Memory> {
        let m = &row.memory;
        let mut qb = QueryBuilder::new(format!("UPDATE {} SET ", rows::table(m.tier)));
        let mut set = qb.separated(", ");
        set.push("user_id = ").push_bind_unseparated(&m.user_id);
        set.push("session_id = ").push_bind_unseparated(&m.session_id);
        set.push("content = ").push_bind_unseparated(&m.content);
        set.push("content_hash = ").push_bind_unseparated(&row.content_hash);
        set.push("importance = ").push_bind_unseparated(m.importance);
        set.push("retention = ").push_bind_unseparated(m.retention.as_str());
        set.push("private = ").push_bind_unseparated(m.private);
        set.push("metadata = ").push_bind_unseparated(sqlx::types::Json(&m.metadata));
        set.push("occurred_at = ").push_bind_unseparated(m.occurred_at);
        set.push("updated_at = ").push_bind_unseparated(m.updated_at);
        set.push("expires_at = ").push_bind_unseparated(m.expires_at);
        if let VectorChange::Set(e) = vector {
            set.push("embedding = ").push_bind_unseparated(e.map(|e| pgvector::Vector::from(e.vector.clone())));
            set.push("embedding_model = ").push_bind_unseparated(e.map(|e| e.model.clone()));
        }
        if m.tier == Tier::Procedural {
            set.push("trigger_pattern = ").push_bind_unseparated(&m.trigger_pattern);
            set.push("policy = ").push_bind_unseparated(&m.policy);
            set.push("tool_sequence = ").push_bind_unseparated(&m.tool_sequence);
            set.push("success_count = ").push_bind_unseparated(m.success_count.unwrap_or(0));
            set.push("failure_count = ").push_bind_unseparated(m.failure_count.unwrap_or(0));
            set.push("reward_count = ").push_bind_unseparated(row.reward_count.unwrap_or(0));
            set.push("avg_reward = ").push_bind_unseparated(m.avg_reward.unwrap_or(0.0));
            set.push("version = ").push_bind_unseparated(m.version.unwrap_or(1));
        }
        qb.push(" WHERE tenant_id = ").push_bind(tenant).push(" AND id = ").push_bind(m.id);
        qb.push(format!(" RETURNING {}", rows::columns(m.tier)));
        let stored: MemoryRow = qb.build_query_as().fetch_one(&mut *self.tx).await.map_err(store_error)?;
        stored.try_into()
    }

    async fn delete(&mut self, tenant: &str, id: Uuid) -> StoreResult<Option<Tier>> {
        let tier: Option<String> = sqlx::query_scalar(
            "WITH e AS (DELETE FROM episodic_memory WHERE tenant_id = $1 AND id = $2 RETURNING 'episodic'::text AS tier), \
                  s AS (DELETE FROM semantic_memory WHERE tenant_id = $1 AND id = $2 RETURNING 'semantic'::text AS tier), \
                  p AS (DELETE FROM procedural_memory WHERE tenant_id = $1 AND id = $2 RETURNING 'procedural'::text AS tier) \
             SELECT tier FROM e UNION ALL SELECT tier FROM s UNION ALL SELECT tier FROM p",
        )
        .bind(tenant)
        .bind(id)
        .fetch_optional(&mut *self.tx)
        .await
        .map_err(store_error)?;
        if tier.is_some() {
            self.deleted_for = Some(tenant.to_string());
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
            let entry = serde_json::to_string(m).map_err(|e| crate::store::StoreError::Internal(e.into()))?;
            sqlx::query(
                "INSERT INTO working_outbox (tenant_id, id, idempotency_key, entry, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $5)",
            )
            .bind(tenant)
            .bind(m.id)
            .bind(key)
            .bind(entry)
            .bind(now)
            .execute(&mut *self.tx)
            .await
            .map_err(store_error)?;
        }
        Ok(())
    }

    async fn stage_eviction(&mut self, tenant: &str, id: Uuid, now: DateTime<Utc>) -> StoreResult<()> {
        sqlx::query("INSERT INTO skill_evictions (eviction_id, tenant_id, id, created_at) VALUES ($1, $2, $3, $4)")
            .bind(Uuid::now_v7())
            .bind(tenant)
            .bind(id)
            .bind(now)
            .execute(&mut *self.tx)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn mark_consolidated(
        &mut self,
        tenant: &str,
        users: &[String],
        ids: &[Uuid],
        at: DateTime<Utc>,
    ) -> StoreResult<u64> {
        super::holds::lock_users(&mut self.tx, tenant, users).await?;
        // The rows in id order before the update, which would lock them in
        // the order it finds them: an erasure by ids locks the same rows in
        // id order (`ErasureTx::lock_episodes`), so the two cannot deadlock.
        lock_episodes(&mut self.tx, tenant, ids).await?;
        let done = sqlx::query(
            "UPDATE episodic_memory SET consolidated_at = $3 WHERE tenant_id = $1 AND id = ANY($2) \
             AND consolidated_at IS NULL AND (expires_at IS NULL OR expires_at > $3)",
        )
        .bind(tenant)
        .bind(ids)
        .bind(at)
        .execute(&mut *self.tx)
        .await
        .map_err(store_error)?;
        Ok(done.rows_affected())
    }

    async fn commit(self: Box<Self>) -> StoreResult<()> {
        let PgTx { mut tx, started, deleted_for, .. } = *self;
        if let Some(tenant) = deleted_for {
            super::replica::raise_fence(&mut tx, &tenant).await?;
        }
        tx.commit().await.map_err(store_error)?;
        observe("write", started);
        Ok(())
    }
}

/// Locks episodes' rows until the transaction ends, in id order.
pub(super) async fn lock_episodes(conn: &mut sqlx::PgConnection, tenant: &str, ids: &[Uuid]) -> StoreResult<()> {
    sqlx::query("SELECT id FROM episodic_memory WHERE tenant_id = $1 AND id = ANY($2) ORDER BY id FOR UPDATE")
        .bind(tenant)
        .bind(ids)
        .fetch_all(conn)
        .await
        .map_err(store_error)?;
    Ok(())
}
