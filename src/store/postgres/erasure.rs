//! Erasure's primitives on Postgres (`store::erasure`): the accepting
//! transaction on `PgTx`, the erasure records, the purge (VACUUM), the
//! verification queries and the audit log. The Redis half (working memory,
//! the skill cache) is put together with this in `store/storage.rs`.

use std::collections::{BTreeMap, HashSet};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::holds;
use super::retention::PERSISTENT;
use super::rows::{table, vectors};
use super::write::PgTx;
use super::{LOCK_ERASURE, PgStore, store_error};
use crate::domain::erasure::{
    AuditEntry, Counts, ErasureRecord, GENESIS_HASH, NewAuditEntry, Receipt, Subject, entry_hash,
};
use crate::domain::holds::Hold;
use crate::domain::{Memory, Tier};
use crate::store::erasure::{ErasureColumns, ErasureRow, ErasureTx, Linked, erasure_record, receipt_json};
use crate::store::write::WriteTx;
use crate::store::{Embedding, StoreError, StoreResult, SweepLease, corrupt};

/// Vectors of erased rows kept per tier for the verification.
const PROBES_PER_TIER: i64 = 4;

fn tier_of(s: &str) -> StoreResult<Tier> {
    Tier::parse(s).ok_or_else(|| corrupt("tier", s))
}

fn rows_of(rows: Vec<(String, Uuid, Option<String>)>) -> StoreResult<Vec<ErasureRow>> {
    rows.into_iter().map(|(tier, id, user_id)| Ok(ErasureRow { tier: tier_of(&tier)?, id, user_id })).collect()
}

/// The three tables as one projection of (tier, id, user_id), filtered by `filter`.
fn union_rows(filter: &str) -> String {
    PERSISTENT
        .iter()
        .map(|t| format!("SELECT '{}'::text AS tier, id, user_id FROM {} WHERE {filter}", t.as_str(), table(*t)))
        .collect::<Vec<_>>()
        .join(" UNION ALL ")
}

#[async_trait]
impl ErasureTx for PgTx {
    async fn user_rows(
        &mut self,
        tenant: &str,
        user_id: &str,
        agent_id: Option<&str>,
        before: DateTime<Utc>,
    ) -> StoreResult<Vec<ErasureRow>> {
        let sql =
            union_rows("tenant_id = $1 AND user_id = $2 AND ($3::text IS NULL OR agent_id = $3) AND created_at <= $4");
        let rows: Vec<(String, Uuid, Option<String>)> = sqlx::query_as(AssertSqlSafe(sql))
            .bind(tenant)
            .bind(user_id)
            .bind(agent_id)
            .bind(before)
            .fetch_all(&mut *self.tx)
            .await
            .map_err(store_error)?;
        rows_of(rows)
    }

    async fn rows_by_id(&mut self, tenant: &str, ids: &[Uuid]) -> StoreResult<Vec<ErasureRow>> {
        let rows: Vec<(String, Uuid, Option<String>)> =
            sqlx::query_as(AssertSqlSafe(union_rows("tenant_id = $1 AND id = ANY($2)")))
                .bind(tenant)
                .bind(ids)
                .fetch_all(&mut *self.tx)
                .await
                .map_err(store_error)?;
        rows_of(rows)
    }

    async fn lock_episodes(&mut self, tenant: &str, ids: &[Uuid]) -> StoreResult<()> {
        super::write::lock_episodes(&mut self.tx, tenant, ids).await
    }

    async fn linked_facts(&mut self, tenant: &str, ids: &[Uuid]) -> StoreResult<Vec<Linked>> {
        let rows: Vec<(Uuid, Option<String>, Uuid)> = sqlx::query_as(
            "SELECT id, user_id, source_episode_id FROM semantic_memory \
                 WHERE tenant_id = $1 AND source_episode_id = ANY($2) \
             UNION ALL \
             SELECT old.id, old.user_id, new.id FROM semantic_memory new \
                 JOIN semantic_memory old ON old.tenant_id = new.tenant_id AND old.id = new.supersedes \
                 WHERE new.tenant_id = $1 AND new.id = ANY($2)",
        )
        .bind(tenant)
        .bind(ids)
        .fetch_all(&mut *self.tx)
        .await
        .map_err(store_error)?;
        Ok(rows
            .into_iter()
            .map(|(id, user_id, to)| Linked { fact: ErasureRow { tier: Tier::Semantic, id, user_id }, to })
            .collect())
    }

    async fn copies(&mut self, tenant: &str, ids: &[Uuid]) -> StoreResult<Vec<Linked>> {
        let sources: Vec<String> = ids.iter().map(Uuid::to_string).collect();
        let sql = PERSISTENT
            .iter()
            .map(|t| {
                format!(
                    "SELECT '{}'::text AS tier, id, user_id, (provenance->>'source_memory_id')::uuid AS source \
                     FROM {} WHERE tenant_id = $1 AND provenance IS NOT NULL \
                     AND provenance->>'source_memory_id' = ANY($2)",
                    t.as_str(),
                    table(*t)
                )
            })
            .collect::<Vec<_>>()
            .join(" UNION ALL ");
        let rows: Vec<(String, Uuid, Option<String>, Uuid)> = sqlx::query_as(AssertSqlSafe(sql))
            .bind(tenant)
            .bind(&sources)
            .fetch_all(&mut *self.tx)
            .await
            .map_err(store_error)?;
        rows.into_iter()
            .map(|(tier, id, user_id, to)| Ok(Linked { fact: ErasureRow { tier: tier_of(&tier)?, id, user_id }, to }))
            .collect()
    }

    async fn summaries(&mut self, tenant: &str, ids: &[Uuid]) -> StoreResult<Vec<Linked>> {
        let sources: Vec<String> = ids.iter().map(Uuid::to_string).collect();
        let rows: Vec<(Uuid, Option<String>, String)> = sqlx::query_as(
            "SELECT m.id, m.user_id, s.source FROM episodic_memory m, \
                 jsonb_array_elements_text(m.metadata->'consolidation'->'source_episode_ids') AS s(source) \
             WHERE m.tenant_id = $1 AND m.metadata->'consolidation'->'source_episode_ids' ?| $2 \
             AND s.source = ANY($2)",
        )
        .bind(tenant)
        .bind(&sources)
        .fetch_all(&mut *self.tx)
        .await
        .map_err(store_error)?;
        rows.into_iter()
            .map(|(id, user_id, source)| {
                let to = source.parse().map_err(|_| corrupt("source episode id", &source))?;
                Ok(Linked { fact: ErasureRow { tier: Tier::Episodic, id, user_id }, to })
            })
            .collect()
    }

    async fn claim(
        &mut self,
        tenant: &str,
        erasure: Uuid,
        rows: &[ErasureRow],
        _at: DateTime<Utc>,
    ) -> StoreResult<Vec<ErasureRow>> {
        let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
        let tiers: Vec<&str> = rows.iter().map(|r| r.tier.as_str()).collect();
        let users: Vec<Option<&str>> = rows.iter().map(|r| r.user_id.as_deref()).collect();
        let claimed: Vec<Uuid> = sqlx::query_scalar(
            "INSERT INTO erasure_items (tenant_id, id, erasure_id, tier, user_id) \
             SELECT $1, u.id, $2, u.tier, u.user_id FROM unnest($3::uuid[], $4::text[], $5::text[]) \
                 AS u(id, tier, user_id) \
             ON CONFLICT DO NOTHING RETURNING id",
        )
        .bind(tenant)
        .bind(erasure)
        .bind(&ids)
        .bind(&tiers)
        .bind(&users)
        .fetch_all(&mut *self.tx)
        .await
        .map_err(store_error)?;
        let claimed: HashSet<Uuid> = claimed.into_iter().collect();
        let out: Vec<ErasureRow> = rows.iter().filter(|r| claimed.contains(&r.id)).cloned().collect();
        // Deleted outright, not hidden by expiry as on SQLite (migration 0009
        // says why). A few of their vectors stay in `erasure_probes` for the
        // verification's nearest-neighbour queries.
        for tier in PERSISTENT {
            let ids: Vec<Uuid> = out.iter().filter(|r| r.tier == tier).map(|r| r.id).collect();
            if ids.is_empty() {
                continue;
            }
            sqlx::query(AssertSqlSafe(format!(
                "WITH gone AS (DELETE FROM {} WHERE tenant_id = $1 AND id = ANY($2) \
                     RETURNING embedding_model, embedding) \
                 INSERT INTO erasure_probes (tenant_id, erasure_id, tier, embedding_model, embedding) \
                 SELECT $1, $3, $4, embedding_model, embedding FROM gone WHERE embedding IS NOT NULL LIMIT $5",
                table(tier)
            )))
            .bind(tenant)
            .bind(&ids)
            .bind(erasure)
            .bind(tier.as_str())
            .bind(PROBES_PER_TIER)
            .execute(&mut *self.tx)
            .await
            .map_err(store_error)?;
        }
        if !out.is_empty() {
            self.deleted_for = Some(tenant.to_string());
        }
        Ok(out)
    }

    async fn responses(&mut self, tenant: &str) -> StoreResult<Vec<(String, Value)>> {
        let rows: Vec<(String, sqlx::types::Json<Value>)> =
            sqlx::query_as("SELECT key, response FROM idempotency_keys WHERE tenant_id = $1")
                .bind(tenant)
                .fetch_all(&mut *self.tx)
                .await
                .map_err(store_error)?;
        Ok(rows.into_iter().map(|(k, v)| (k, v.0)).collect())
    }

    async fn forget_responses(&mut self, tenant: &str, keys: &[String]) -> StoreResult<()> {
        if keys.is_empty() {
            return Ok(());
        }
        sqlx::query("DELETE FROM idempotency_keys WHERE tenant_id = $1 AND key = ANY($2)")
            .bind(tenant)
            .bind(keys)
            .execute(&mut *self.tx)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn staged(&mut self, tenant: &str) -> StoreResult<Vec<Memory>> {
        let rows: Vec<String> = sqlx::query_scalar("SELECT entry FROM working_outbox WHERE tenant_id = $1")
            .bind(tenant)
            .fetch_all(&mut *self.tx)
            .await
            .map_err(store_error)?;
        rows.iter().map(|e| serde_json::from_str(e).map_err(|e| StoreError::Internal(e.into()))).collect()
    }

    async fn unstage(&mut self, tenant: &str, ids: &[Uuid]) -> StoreResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        sqlx::query("DELETE FROM working_outbox WHERE tenant_id = $1 AND id = ANY($2)")
            .bind(tenant)
            .bind(ids)
            .execute(&mut *self.tx)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn insert_erasure(&mut self, r: &ErasureRecord) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO erasures (id, tenant_id, selector, requested_by, state, attempts, last_error, receipt, \
             requested_at, completed_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(r.id)
        .bind(&r.tenant)
        .bind(r.subject.to_json())
        .bind(&r.requested_by)
        .bind(r.state.as_str())
        .bind(r.attempts)
        .bind(&r.last_error)
        .bind(receipt_json(&r.receipt)?)
        .bind(r.requested_at)
        .bind(r.completed_at)
        .bind(r.updated_at)
        .execute(&mut *self.tx)
        .await
        .map_err(store_error)?;
        Ok(())
    }

    async fn lock_users(&mut self, tenant: &str, users: &[String]) -> StoreResult<()> {
        holds::lock_users(&mut self.tx, tenant, users).await
    }

    async fn active_holds(&mut self, tenant: &str, users: &[String]) -> StoreResult<Vec<Hold>> {
        holds::active_holds(&mut self.tx, tenant, users).await
    }

    async fn erasures_of_user(&mut self, tenant: &str, user_id: &str) -> StoreResult<Vec<Uuid>> {
        holds::erasures_of_user(&mut self.tx, tenant, user_id).await
    }

    async fn insert_hold(&mut self, hold: &Hold) -> StoreResult<()> {
        holds::insert_hold(&mut self.tx, hold).await
    }

    async fn hold_for_update(&mut self, tenant: &str, id: Uuid) -> StoreResult<Option<Hold>> {
        holds::hold_for_update(&mut self.tx, tenant, id).await
    }

    async fn save_release(&mut self, hold: &Hold) -> StoreResult<()> {
        holds::save_release(&mut self.tx, hold).await
    }

    async fn append_audit(&mut self, entry: &NewAuditEntry) -> StoreResult<AuditEntry> {
        append_audit_on(&mut self.tx, entry).await
    }

    async fn commit(self: Box<Self>) -> StoreResult<()> {
        WriteTx::commit(self).await
    }
}

type ErasureTuple = (
    Uuid,
    String,
    String,
    String,
    String,
    i32,
    Option<String>,
    Option<String>,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    DateTime<Utc>,
);

const ERASURE_COLUMNS: &str = "id, tenant_id, selector, requested_by, state, attempts, last_error, receipt, \
    requested_at, completed_at, updated_at";

fn erasure_of(t: ErasureTuple) -> StoreResult<ErasureRecord> {
    let (
        id,
        tenant,
        selector,
        requested_by,
        state,
        attempts,
        last_error,
        receipt,
        requested_at,
        completed_at,
        updated_at,
    ) = t;
    erasure_record(ErasureColumns {
        id,
        tenant,
        selector,
        requested_by,
        state,
        attempts,
        last_error,
        receipt,
        requested_at,
        completed_at,
        updated_at,
    })
}

type AuditTuple = (i64, String, DateTime<Utc>, String, String, String, String, String, String);

fn audit_of((seq, tenant, at, actor, operation, target, counts, prev_hash, hash): AuditTuple) -> AuditEntry {
    AuditEntry { seq, tenant, at, actor, operation, target, counts, prev_hash, hash }
}

impl PgStore {
    pub async fn begin_erasure(&self) -> StoreResult<Box<dyn ErasureTx>> {
        Ok(Box::new(self.begin_write().await?))
    }

    pub async fn erasure(&self, tenant: &str, id: Uuid) -> StoreResult<Option<ErasureRecord>> {
        let row: Option<ErasureTuple> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {ERASURE_COLUMNS} FROM erasures WHERE tenant_id = $1 AND id = $2"
        )))
        .bind(tenant)
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(store_error)?;
        row.map(erasure_of).transpose()
    }

    pub async fn unfinished_erasures(&self, limit: usize) -> StoreResult<Vec<ErasureRecord>> {
        let rows: Vec<ErasureTuple> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {ERASURE_COLUMNS} FROM erasures WHERE state IN ('pending', 'running', 'retrying') \
             ORDER BY requested_at, id LIMIT $1"
        )))
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(store_error)?;
        rows.into_iter().map(erasure_of).collect()
    }

    pub async fn update_erasure(&self, r: &ErasureRecord) -> StoreResult<()> {
        sqlx::query(
            "UPDATE erasures SET state = $3, attempts = $4, last_error = $5, receipt = $6, completed_at = $7, \
             updated_at = $8 WHERE tenant_id = $1 AND id = $2",
        )
        .bind(&r.tenant)
        .bind(r.id)
        .bind(r.state.as_str())
        .bind(r.attempts)
        .bind(&r.last_error)
        .bind(receipt_json(&r.receipt)?)
        .bind(r.completed_at)
        .bind(r.updated_at)
        .execute(&self.pool)
        .await
        .map_err(store_error)?;
        Ok(())
    }

    pub async fn claimed(&self, tenant: &str, erasure: Uuid) -> StoreResult<Vec<(Tier, Uuid)>> {
        let rows: Vec<(String, Uuid)> =
            sqlx::query_as("SELECT tier, id FROM erasure_items WHERE tenant_id = $1 AND erasure_id = $2")
                .bind(tenant)
                .bind(erasure)
                .fetch_all(&self.pool)
                .await
                .map_err(store_error)?;
        rows.into_iter().map(|(t, id)| Ok((tier_of(&t)?, id))).collect()
    }

    pub async fn release(&self, tenant: &str, erasure: Uuid) -> StoreResult<()> {
        sqlx::query("DELETE FROM erasure_items WHERE tenant_id = $1 AND erasure_id = $2")
            .bind(tenant)
            .bind(erasure)
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        sqlx::query("DELETE FROM erasure_probes WHERE tenant_id = $1 AND erasure_id = $2")
            .bind(tenant)
            .bind(erasure)
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        // The probes were the subject's vectors: their dead tuples go too.
        sqlx::query("VACUUM erasure_probes").execute(&self.pool).await.map_err(store_error)?;
        Ok(())
    }

    /// The erasure worker's session-level advisory lock (as the sweep's).
    pub async fn try_lease_erasures(&self) -> StoreResult<Option<SweepLease>> {
        let mut conn = self.pool.acquire().await.map_err(store_error)?.detach();
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(LOCK_ERASURE)
            .fetch_one(&mut conn)
            .await
            .map_err(store_error)?;
        Ok(got.then(|| SweepLease::holding(conn)))
    }

    /// The vectors kept from the erasure's rows when they were deleted.
    pub async fn sample_vectors(&self, tenant: &str, erasure: Uuid) -> StoreResult<Vec<(Tier, Embedding)>> {
        let found: Vec<(String, String, pgvector::Vector)> = sqlx::query_as(
            "SELECT tier, embedding_model, embedding FROM erasure_probes WHERE tenant_id = $1 AND erasure_id = $2",
        )
        .bind(tenant)
        .bind(erasure)
        .fetch_all(&self.pool)
        .await
        .map_err(store_error)?;
        found
            .into_iter()
            .map(|(tier, model, v)| Ok((tier_of(&tier)?, Embedding { model, vector: v.to_vec() })))
            .collect()
    }

    /// VACUUM of every table an erasure deletes from: dead tuples (the
    /// deleted rows' old versions) are removed from the heap and from every
    /// index, the HNSW graphs included. VACUUM marks the space free; it does
    /// not overwrite it (VACUUM FULL would rewrite the tables, at the price
    /// of an exclusive lock). Then ANALYZE of the memory tables: the
    /// planner's statistics hold values sampled from their rows (contents
    /// in a column's histogram, common words, the most common (tenant,
    /// agent) pairs of migration 0019), which are drawn again from the rows
    /// that remain.
    pub async fn vacuum_for_erasure(&self) -> StoreResult<()> {
        // Two statements: VACUUM may not share a query string with another.
        sqlx::query(
            "VACUUM episodic_memory, semantic_memory, procedural_memory, episodic_vectors, semantic_vectors, \
             procedural_vectors, idempotency_keys, working_outbox, erasure_items",
        )
        .execute(&self.pool)
        .await
        .map_err(store_error)?;
        sqlx::query("ANALYZE episodic_memory, semantic_memory, procedural_memory")
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        // ANALYZE of a table with no rows left writes no statistics, so the
        // old ones stay; Postgres 18 can clear them (those of the table's
        // columns and of its indexes' expressions). Earlier versions keep
        // them until the table has rows again.
        let version: i32 = sqlx::query_scalar("SELECT current_setting('server_version_num')::int")
            .fetch_one(&self.pool)
            .await
            .map_err(store_error)?;
        if version >= 180_000 {
            for table in ["episodic_memory", "semantic_memory", "procedural_memory"] {
                let empty: bool =
                    sqlx::query_scalar(AssertSqlSafe(format!("SELECT NOT EXISTS (SELECT 1 FROM {table})")))
                        .fetch_one(&self.pool)
                        .await
                        .map_err(store_error)?;
                if empty {
                    sqlx::query(
                        "SELECT count(pg_clear_attribute_stats(s.schemaname::text, s.tablename::text, s.attname::text, \
                                s.inherited)) \
                         FROM pg_stats s WHERE s.schemaname = current_schema() AND (s.tablename = $1 OR s.tablename IN \
                           (SELECT i.indexrelid::regclass::text FROM pg_index i WHERE i.indrelid = $1::regclass))",
                    )
                    .bind(table)
                    .execute(&self.pool)
                    .await
                    .map_err(store_error)?;
                }
            }
        }
        Ok(())
    }

    /// The Postgres half of an erasure's verification: on the primary
    /// (`postgres`), then on the read replica if there is one
    /// (`postgres_replica`), once it has replayed the erasure's deletes.
    pub async fn verify_erasure(
        &self,
        r: &ErasureRecord,
        claimed: &[(Tier, Uuid)],
        samples: &[(Tier, Embedding)],
        found: &mut Counts,
    ) -> StoreResult<()> {
        self.verify_erasure_here("postgres", r, claimed, samples, found).await?;
        if let Some(replica) = self.caught_up_replica(&r.tenant).await? {
            replica.verify_erasure_here("postgres_replica", r, claimed, samples, found).await?;
        }
        Ok(())
    }

    async fn verify_erasure_here(
        &self,
        store: &str,
        r: &ErasureRecord,
        claimed: &[(Tier, Uuid)],
        samples: &[(Tier, Embedding)],
        found: &mut Counts,
    ) -> StoreResult<()> {
        let ids: Vec<Uuid> = claimed.iter().map(|(_, id)| *id).collect();
        let (user, agent, listed): (Option<&str>, Option<&str>, Vec<Uuid>) = match &r.subject {
            Subject::User { user_id, agent_id } => (Some(user_id), agent_id.as_deref(), Vec::new()),
            Subject::Memories { memory_ids } => (None, None, memory_ids.clone()),
        };
        for tier in PERSISTENT {
            let n: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT count(*) FROM {} WHERE tenant_id = $1 AND (id = ANY($2) OR id = ANY($3) \
                 OR ($4::text IS NOT NULL AND user_id = $4 AND ($5::text IS NULL OR agent_id = $5) \
                     AND created_at <= $6))",
                table(tier)
            )))
            .bind(&r.tenant)
            .bind(&ids)
            .bind(&listed)
            .bind(user)
            .bind(agent)
            .bind(r.requested_at)
            .fetch_one(&self.pool)
            .await
            .map_err(store_error)?;
            Receipt::add(found, store, tier.as_str(), n as u64);
        }
        let everything: HashSet<Uuid> = ids.iter().chain(&listed).copied().collect();
        let responses: Vec<sqlx::types::Json<Value>> =
            sqlx::query_scalar("SELECT response FROM idempotency_keys WHERE tenant_id = $1")
                .bind(&r.tenant)
                .fetch_all(&self.pool)
                .await
                .map_err(store_error)?;
        let n = responses.iter().filter(|b| r.subject.in_response(&b.0, &everything, r.requested_at)).count();
        Receipt::add(found, store, "idempotency_records", n as u64);
        let staged: Vec<String> = sqlx::query_scalar("SELECT entry FROM working_outbox WHERE tenant_id = $1")
            .bind(&r.tenant)
            .fetch_all(&self.pool)
            .await
            .map_err(store_error)?;
        let n = staged
            .iter()
            .filter_map(|e| serde_json::from_str::<Memory>(e).ok())
            .filter(|m| r.subject.covers(m, r.requested_at))
            .count();
        Receipt::add(found, store, "working_outbox", n as u64);
        // The nearest neighbours of the erased rows' own vectors, through
        // each model's HNSW index on the tier's vector table (every
        // partition: the tenant's, whatever the agent): none of the rows may
        // come back.
        let mut returned = 0u64;
        for (tier, e) in samples {
            let dims = e.vector.len();
            let literal = e.model.replace('\'', "''");
            let near: Vec<Uuid> = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT id FROM {} WHERE tenant_id = $1 AND embedding_model = '{literal}' \
                 ORDER BY embedding::vector({dims}) <=> $2::vector({dims}) LIMIT 10",
                vectors(*tier)
            )))
            .bind(&r.tenant)
            .bind(pgvector::Vector::from(e.vector.clone()))
            .fetch_all(&self.pool)
            .await
            .map_err(store_error)?;
            returned += near.iter().filter(|id| everything.contains(id)).count() as u64;
        }
        Receipt::add(found, store, "vector_index", returned);
        Ok(())
    }

    /// Appends to a tenant's chain in a transaction of its own.
    pub async fn append_audit(&self, e: &NewAuditEntry) -> StoreResult<AuditEntry> {
        let mut tx = self.pool.begin().await.map_err(store_error)?;
        let entry = append_audit_on(&mut tx, e).await?;
        tx.commit().await.map_err(store_error)?;
        Ok(entry)
    }

    pub async fn audit_page(&self, tenant: Option<&str>, after: i64, limit: usize) -> StoreResult<Vec<AuditEntry>> {
        let rows: Vec<AuditTuple> = sqlx::query_as(
            "SELECT seq, tenant_id, at, actor, operation, target, counts, prev_hash, hash FROM audit_log \
             WHERE ($1::text IS NULL OR tenant_id = $1) AND seq > $2 ORDER BY seq LIMIT $3",
        )
        .bind(tenant)
        .bind(after)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(store_error)?;
        Ok(rows.into_iter().map(audit_of).collect())
    }
}

/// Appends to a tenant's chain in the caller's transaction, under a
/// transaction-scoped advisory lock on the tenant, so two appends never take
/// the same previous hash.
async fn append_audit_on(conn: &mut sqlx::PgConnection, e: &NewAuditEntry) -> StoreResult<AuditEntry> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('audit' || $1, 0))")
        .bind(&e.tenant)
        .execute(&mut *conn)
        .await
        .map_err(store_error)?;
    let prev: Option<String> =
        sqlx::query_scalar("SELECT hash FROM audit_log WHERE tenant_id = $1 ORDER BY seq DESC LIMIT 1")
            .bind(&e.tenant)
            .fetch_optional(&mut *conn)
            .await
            .map_err(store_error)?;
    let prev = prev.unwrap_or_else(|| GENESIS_HASH.to_string());
    let (at, target, counts) = e.fields();
    let hash = entry_hash(&prev, &e.tenant, at, &e.actor, &e.operation, &target, &counts);
    let seq: i64 = sqlx::query_scalar(
        "INSERT INTO audit_log (tenant_id, at, actor, operation, target, counts, prev_hash, hash) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING seq",
    )
    .bind(&e.tenant)
    .bind(at)
    .bind(&e.actor)
    .bind(&e.operation)
    .bind(&target)
    .bind(&counts)
    .bind(&prev)
    .bind(&hash)
    .fetch_one(&mut *conn)
    .await
    .map_err(store_error)?;
    Ok(AuditEntry {
        seq,
        tenant: e.tenant.clone(),
        at,
        actor: e.actor.clone(),
        operation: e.operation.clone(),
        target,
        counts,
        prev_hash: prev,
        hash,
    })
}

/// Purge results, as the receipt states them.
pub(crate) fn vacuumed() -> BTreeMap<String, String> {
    BTreeMap::from([(
        "postgres".to_string(),
        "vacuumed (dead tuples and index entries removed), statistics re-sampled".to_string(),
    )])
}
