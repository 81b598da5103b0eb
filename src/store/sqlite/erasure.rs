//! Erasure's primitives on the embedded backend (`store::erasure`): the
//! accepting transaction on `SqliteTx` (claimed rows also leave the
//! in-process indexes when it commits), the erasure records, the purge (a
//! truncating WAL checkpoint; freed pages are zeroed by `secure_delete`),
//! the verification queries and the audit log.

use std::collections::{BTreeMap, HashSet};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{QueryBuilder, Sqlite};
use uuid::Uuid;

use super::holds;
use super::write::{IndexOp, SqliteTx};
use super::{SqliteStore, from_micros, micros, store_error};
use crate::domain::erasure::{
    AuditEntry, Counts, ErasureRecord, GENESIS_HASH, NewAuditEntry, Receipt, Subject, entry_hash,
};
use crate::domain::holds::Hold;
use crate::domain::{Memory, Tier};
use crate::store::erasure::{ErasureColumns, ErasureRow, ErasureTx, Linked, erasure_record, receipt_json};
use crate::store::write::WriteTx;
use crate::store::{Embedding, StoreError, StoreResult, SweepLease, corrupt};

/// Ids per statement in `in (...)` lists.
const CHUNK: usize = 500;

fn push_ids(qb: &mut QueryBuilder<Sqlite>, ids: &[Uuid]) {
    qb.push("(");
    let mut list = qb.separated(", ");
    for id in ids {
        list.push_bind(*id);
    }
    list.push_unseparated(")");
}

fn rows_of(rows: Vec<(String, Uuid, Option<String>)>) -> StoreResult<Vec<ErasureRow>> {
    rows.into_iter()
        .map(|(tier, id, user_id)| {
            Ok(ErasureRow { tier: Tier::parse(&tier).ok_or_else(|| corrupt("tier", &tier))?, id, user_id })
        })
        .collect()
}

#[async_trait]
impl ErasureTx for SqliteTx {
    async fn user_rows(
        &mut self,
        tenant: &str,
        user_id: &str,
        agent_id: Option<&str>,
        before: DateTime<Utc>,
    ) -> StoreResult<Vec<ErasureRow>> {
        let rows: Vec<(String, Uuid, Option<String>)> = sqlx::query_as(
            "select tier, id, user_id from memories where tenant_id = ?1 and user_id = ?2 \
             and (?3 is null or agent_id = ?3) and created_at <= ?4",
        )
        .bind(tenant)
        .bind(user_id)
        .bind(agent_id)
        .bind(micros(before))
        .fetch_all(&mut *self.tx)
        .await
        .map_err(store_error)?;
        rows_of(rows)
    }

    async fn rows_by_id(&mut self, tenant: &str, ids: &[Uuid]) -> StoreResult<Vec<ErasureRow>> {
        let mut out = Vec::new();
        for chunk in ids.chunks(CHUNK) {
            let mut qb = QueryBuilder::new("select tier, id, user_id from memories where tenant_id = ");
            qb.push_bind(tenant.to_string()).push(" and id in ");
            push_ids(&mut qb, chunk);
            let rows = qb.build_query_as().fetch_all(&mut *self.tx).await.map_err(store_error)?;
            out.extend(rows_of(rows)?);
        }
        Ok(out)
    }

    /// Nothing to lock: the transaction holds the write gate, so no
    /// consolidation commits while it runs.
    async fn lock_episodes(&mut self, _tenant: &str, _ids: &[Uuid]) -> StoreResult<()> {
        Ok(())
    }

    async fn linked_facts(&mut self, tenant: &str, ids: &[Uuid]) -> StoreResult<Vec<Linked>> {
        let mut out = Vec::new();
        for chunk in ids.chunks(CHUNK) {
            let mut qb = QueryBuilder::new(
                "select id, user_id, source_episode_id from memories where tier = 'semantic' and tenant_id = ",
            );
            qb.push_bind(tenant.to_string()).push(" and source_episode_id in ");
            push_ids(&mut qb, chunk);
            qb.push(
                " union all select old.id, old.user_id, new.id from memories new join memories old \
                 on old.tenant_id = new.tenant_id and old.id = new.supersedes \
                 where new.tier = 'semantic' and new.tenant_id = ",
            );
            qb.push_bind(tenant.to_string()).push(" and new.id in ");
            push_ids(&mut qb, chunk);
            let rows: Vec<(Uuid, Option<String>, Uuid)> =
                qb.build_query_as().fetch_all(&mut *self.tx).await.map_err(store_error)?;
            out.extend(
                rows.into_iter()
                    .map(|(id, user_id, to)| Linked { fact: ErasureRow { tier: Tier::Semantic, id, user_id }, to }),
            );
        }
        Ok(out)
    }

    async fn copies(&mut self, tenant: &str, ids: &[Uuid]) -> StoreResult<Vec<Linked>> {
        let mut out = Vec::new();
        for chunk in ids.chunks(CHUNK) {
            let mut qb = QueryBuilder::new(
                "select tier, id, user_id, json_extract(provenance, '$.source_memory_id') from memories \
                 where provenance is not null and tenant_id = ",
            );
            qb.push_bind(tenant.to_string()).push(" and json_extract(provenance, '$.source_memory_id') in (");
            let mut list = qb.separated(", ");
            for id in chunk {
                list.push_bind(id.to_string());
            }
            list.push_unseparated(")");
            let rows: Vec<(String, Uuid, Option<String>, String)> =
                qb.build_query_as().fetch_all(&mut *self.tx).await.map_err(store_error)?;
            for (tier, id, user_id, to) in rows {
                let tier = Tier::parse(&tier).ok_or_else(|| corrupt("tier", &tier))?;
                let to = to.parse().map_err(|_| corrupt("provenance", &to))?;
                out.push(Linked { fact: ErasureRow { tier, id, user_id }, to });
            }
        }
        Ok(out)
    }

    async fn summaries(&mut self, tenant: &str, ids: &[Uuid]) -> StoreResult<Vec<Linked>> {
        let mut out = Vec::new();
        for chunk in ids.chunks(CHUNK) {
            let mut qb = QueryBuilder::new(
                "select m.id, m.user_id, j.value from memories m, \
                 json_each(m.metadata, '$.consolidation.source_episode_ids') j \
                 where json_extract(m.metadata, '$.consolidation') is not null and m.tier = 'episodic' \
                 and m.tenant_id = ",
            );
            qb.push_bind(tenant.to_string()).push(" and j.value in (");
            let mut list = qb.separated(", ");
            for id in chunk {
                list.push_bind(id.to_string());
            }
            list.push_unseparated(")");
            let rows: Vec<(Uuid, Option<String>, String)> =
                qb.build_query_as().fetch_all(&mut *self.tx).await.map_err(store_error)?;
            for (id, user_id, to) in rows {
                let to = to.parse().map_err(|_| corrupt("source episode id", &to))?;
                out.push(Linked { fact: ErasureRow { tier: Tier::Episodic, id, user_id }, to });
            }
        }
        Ok(out)
    }

    async fn claim(
        &mut self,
        tenant: &str,
        erasure: Uuid,
        rows: &[ErasureRow],
        at: DateTime<Utc>,
    ) -> StoreResult<Vec<ErasureRow>> {
        // Two statements per `CHUNK` rows, not two per row: the transaction
        // holds the embedded write queue while it runs.
        let mut claimed: HashSet<Uuid> = HashSet::with_capacity(rows.len());
        for chunk in rows.chunks(CHUNK) {
            let mut qb: QueryBuilder<Sqlite> =
                QueryBuilder::new("insert into erasure_items (tenant_id, id, erasure_id, tier) ");
            qb.push_values(chunk, |mut b, r| {
                b.push_bind(tenant).push_bind(r.id).push_bind(erasure).push_bind(r.tier.as_str());
            });
            qb.push(" on conflict do nothing returning id");
            let ids: Vec<Uuid> = qb.build_query_scalar().fetch_all(&mut *self.tx).await.map_err(store_error)?;
            if ids.is_empty() {
                continue;
            }
            // Hidden from every read from now on: reads leave out rows past
            // expires_at, and the rows leave the in-process indexes at commit.
            let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new("update memories set expires_at = ");
            qb.push_bind(micros(at)).push(" where tenant_id = ").push_bind(tenant);
            qb.push(" and (expires_at is null or expires_at > ").push_bind(micros(at)).push(") and id in ");
            push_ids(&mut qb, &ids);
            qb.build().execute(&mut *self.tx).await.map_err(store_error)?;
            claimed.extend(ids);
        }
        let out: Vec<ErasureRow> = rows.iter().filter(|r| claimed.contains(&r.id)).cloned().collect();
        for r in &out {
            self.record(tenant, IndexOp::Remove(r.id));
        }
        Ok(out)
    }

    async fn responses(&mut self, tenant: &str) -> StoreResult<Vec<(String, Value)>> {
        let rows: Vec<(String, String)> =
            sqlx::query_as("select key, response from idempotency_keys where tenant_id = ?")
                .bind(tenant)
                .fetch_all(&mut *self.tx)
                .await
                .map_err(store_error)?;
        rows.into_iter()
            .map(|(k, body)| Ok((k, serde_json::from_str(&body).map_err(|e| StoreError::Internal(e.into()))?)))
            .collect()
    }

    async fn forget_responses(&mut self, tenant: &str, keys: &[String]) -> StoreResult<()> {
        for key in keys {
            sqlx::query("delete from idempotency_keys where tenant_id = ? and key = ?")
                .bind(tenant)
                .bind(key)
                .execute(&mut *self.tx)
                .await
                .map_err(store_error)?;
        }
        Ok(())
    }

    async fn staged(&mut self, tenant: &str) -> StoreResult<Vec<Memory>> {
        let rows: Vec<String> = sqlx::query_scalar("select entry from working_outbox where tenant_id = ?")
            .bind(tenant)
            .fetch_all(&mut *self.tx)
            .await
            .map_err(store_error)?;
        rows.iter().map(|e| serde_json::from_str(e).map_err(|e| StoreError::Internal(e.into()))).collect()
    }

    async fn unstage(&mut self, tenant: &str, ids: &[Uuid]) -> StoreResult<()> {
        for id in ids {
            sqlx::query("delete from working_outbox where tenant_id = ? and id = ?")
                .bind(tenant)
                .bind(*id)
                .execute(&mut *self.tx)
                .await
                .map_err(store_error)?;
        }
        Ok(())
    }

    async fn insert_erasure(&mut self, r: &ErasureRecord) -> StoreResult<()> {
        sqlx::query(
            "insert into erasures (id, tenant_id, selector, requested_by, state, attempts, last_error, receipt, \
             requested_at, completed_at, updated_at) values (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        )
        .bind(r.id)
        .bind(&r.tenant)
        .bind(r.subject.to_json())
        .bind(&r.requested_by)
        .bind(r.state.as_str())
        .bind(r.attempts)
        .bind(&r.last_error)
        .bind(receipt_json(&r.receipt)?)
        .bind(micros(r.requested_at))
        .bind(r.completed_at.map(micros))
        .bind(micros(r.updated_at))
        .execute(&mut *self.tx)
        .await
        .map_err(store_error)?;
        Ok(())
    }

    async fn lock_users(&mut self, _tenant: &str, _users: &[String]) -> StoreResult<()> {
        // The write gate, held by this transaction since it began, already
        // keeps every other write transaction out.
        Ok(())
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
        holds::hold_in(&mut self.tx, tenant, id).await
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

type ErasureTuple = (Uuid, String, String, String, String, i32, Option<String>, Option<String>, i64, Option<i64>, i64);

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
        requested_at: from_micros(requested_at)?,
        completed_at: completed_at.map(from_micros).transpose()?,
        updated_at: from_micros(updated_at)?,
    })
}

type AuditTuple = (i64, String, i64, String, String, String, String, String, String);

fn audit_of(
    (seq, tenant, at, actor, operation, target, counts, prev_hash, hash): AuditTuple,
) -> StoreResult<AuditEntry> {
    Ok(AuditEntry { seq, tenant, at: from_micros(at)?, actor, operation, target, counts, prev_hash, hash })
}

impl SqliteStore {
    pub async fn begin_erasure(&self) -> StoreResult<Box<dyn ErasureTx>> {
        Ok(Box::new(self.begin_write().await?))
    }

    pub async fn erasure(&self, tenant: &str, id: Uuid) -> StoreResult<Option<ErasureRecord>> {
        let row: Option<ErasureTuple> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "select {ERASURE_COLUMNS} from erasures where tenant_id = ? and id = ?"
        )))
        .bind(tenant)
        .bind(id)
        .fetch_optional(&self.inner.pool)
        .await
        .map_err(store_error)?;
        row.map(erasure_of).transpose()
    }

    pub async fn unfinished_erasures(&self, limit: usize) -> StoreResult<Vec<ErasureRecord>> {
        let rows: Vec<ErasureTuple> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "select {ERASURE_COLUMNS} from erasures where state in ('pending', 'running', 'retrying') \
             order by requested_at, id limit ?"
        )))
        .bind(limit as i64)
        .fetch_all(&self.inner.pool)
        .await
        .map_err(store_error)?;
        rows.into_iter().map(erasure_of).collect()
    }

    pub async fn update_erasure(&self, r: &ErasureRecord) -> StoreResult<()> {
        let _gate = self.inner.write_gate.lock().await;
        sqlx::query(
            "update erasures set state = ?3, attempts = ?4, last_error = ?5, receipt = ?6, completed_at = ?7, \
             updated_at = ?8 where tenant_id = ?1 and id = ?2",
        )
        .bind(&r.tenant)
        .bind(r.id)
        .bind(r.state.as_str())
        .bind(r.attempts)
        .bind(&r.last_error)
        .bind(receipt_json(&r.receipt)?)
        .bind(r.completed_at.map(micros))
        .bind(micros(r.updated_at))
        .execute(&self.inner.pool)
        .await
        .map_err(store_error)?;
        Ok(())
    }

    pub async fn claimed(&self, tenant: &str, erasure: Uuid) -> StoreResult<Vec<(Tier, Uuid)>> {
        let rows: Vec<(String, Uuid)> =
            sqlx::query_as("select tier, id from erasure_items where tenant_id = ? and erasure_id = ?")
                .bind(tenant)
                .bind(erasure)
                .fetch_all(&self.inner.pool)
                .await
                .map_err(store_error)?;
        rows.into_iter().map(|(t, id)| Ok((Tier::parse(&t).ok_or_else(|| corrupt("tier", &t))?, id))).collect()
    }

    pub async fn release(&self, tenant: &str, erasure: Uuid) -> StoreResult<()> {
        let _gate = self.inner.write_gate.lock().await;
        sqlx::query("delete from erasure_items where tenant_id = ? and erasure_id = ?")
            .bind(tenant)
            .bind(erasure)
            .execute(&self.inner.pool)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    pub async fn try_lease_erasures(&self) -> StoreResult<Option<SweepLease>> {
        Ok(self.inner.erasure_gate.clone().try_lock_owned().ok().map(SweepLease::holding))
    }

    /// Checkpoints the WAL into the database file and truncates it to zero
    /// bytes, so old page images (which may hold deleted content) leave the
    /// WAL. Waits (the busy timeout) for readers of older snapshots; tries a
    /// few times while one still holds the WAL.
    pub async fn checkpoint_for_erasure(&self) -> StoreResult<BTreeMap<String, String>> {
        for attempt in 0..10 {
            let (busy, _log, _done): (i64, i64, i64) = {
                let _gate = self.inner.write_gate.lock().await;
                sqlx::query_as("pragma wal_checkpoint(truncate)")
                    .fetch_one(&self.inner.pool)
                    .await
                    .map_err(store_error)?
            };
            if busy == 0 {
                return Ok(BTreeMap::from([(
                    "sqlite".to_string(),
                    "WAL checkpointed and truncated; deleted rows zeroed in the file (secure_delete)".to_string(),
                )]));
            }
            tokio::time::sleep(std::time::Duration::from_millis(100 * (attempt + 1))).await;
        }
        Err(StoreError::Unavailable {
            what: "the embedded database's WAL checkpoint",
            retry_after_secs: 1,
            source: anyhow::anyhow!("readers kept the WAL busy"),
        })
    }

    /// Looks for the subject in every table and both in-process indexes.
    pub async fn verify_erasure(&self, r: &ErasureRecord, claimed: &[(Tier, Uuid)]) -> StoreResult<Counts> {
        let mut found = Counts::new();
        let ids: HashSet<Uuid> = claimed.iter().map(|(_, id)| *id).collect();
        let listed: Vec<Uuid> = match &r.subject {
            Subject::Memories { memory_ids } => memory_ids.clone(),
            Subject::User { .. } => Vec::new(),
        };
        let everything: HashSet<Uuid> = ids.iter().chain(&listed).copied().collect();
        let pool = &self.inner.pool;
        // Rows: by id, and (a user) by user.
        let mut by_tier: BTreeMap<Tier, HashSet<Uuid>> = BTreeMap::new();
        let all: Vec<Uuid> = everything.iter().copied().collect();
        for chunk in all.chunks(CHUNK) {
            let mut qb = QueryBuilder::new("select tier, id from memories where tenant_id = ");
            qb.push_bind(r.tenant.clone()).push(" and id in ");
            push_ids(&mut qb, chunk);
            let rows: Vec<(String, Uuid)> = qb.build_query_as().fetch_all(pool).await.map_err(store_error)?;
            for (t, id) in rows {
                by_tier.entry(Tier::parse(&t).ok_or_else(|| corrupt("tier", &t))?).or_default().insert(id);
            }
        }
        if let Subject::User { user_id, agent_id } = &r.subject {
            let rows: Vec<(String, Uuid)> = sqlx::query_as(
                "select tier, id from memories where tenant_id = ?1 and user_id = ?2 \
                 and (?3 is null or agent_id = ?3) and created_at <= ?4",
            )
            .bind(&r.tenant)
            .bind(user_id)
            .bind(agent_id)
            .bind(micros(r.requested_at))
            .fetch_all(pool)
            .await
            .map_err(store_error)?;
            for (t, id) in rows {
                by_tier.entry(Tier::parse(&t).ok_or_else(|| corrupt("tier", &t))?).or_default().insert(id);
            }
        }
        for tier in [Tier::Episodic, Tier::Semantic, Tier::Procedural] {
            let n = by_tier.get(&tier).map_or(0, HashSet::len);
            Receipt::add(&mut found, "sqlite", tier.as_str(), n as u64);
        }
        let entries: Vec<String> = sqlx::query_scalar("select entry from working_memory where tenant_id = ?")
            .bind(&r.tenant)
            .fetch_all(pool)
            .await
            .map_err(store_error)?;
        let n = covered(&entries, r);
        Receipt::add(&mut found, "sqlite", "working", n);
        let staged: Vec<String> = sqlx::query_scalar("select entry from working_outbox where tenant_id = ?")
            .bind(&r.tenant)
            .fetch_all(pool)
            .await
            .map_err(store_error)?;
        Receipt::add(&mut found, "sqlite", "working_outbox", covered(&staged, r));
        let responses: Vec<String> = sqlx::query_scalar("select response from idempotency_keys where tenant_id = ?")
            .bind(&r.tenant)
            .fetch_all(pool)
            .await
            .map_err(store_error)?;
        let n = responses
            .iter()
            .filter_map(|b| serde_json::from_str::<Value>(b).ok())
            .filter(|b| r.subject.in_response(b, &everything, r.requested_at))
            .count();
        Receipt::add(&mut found, "sqlite", "idempotency_records", n as u64);
        let (vectors, text) = {
            let v = self.inner.vectors.read().unwrap_or_else(|p| p.into_inner());
            let t = self.inner.text.read().unwrap_or_else(|p| p.into_inner());
            (
                everything.iter().filter(|id| v.contains(&r.tenant, **id)).count(),
                everything.iter().filter(|id| t.contains(&r.tenant, **id)).count(),
            )
        };
        Receipt::add(&mut found, "process", "vector_index", vectors as u64);
        Receipt::add(&mut found, "process", "text_index", text as u64);
        Ok(found)
    }

    /// Appends to a tenant's chain in a transaction of its own, behind the
    /// write gate (so two appends never take the same previous hash).
    pub async fn append_audit(&self, e: &NewAuditEntry) -> StoreResult<AuditEntry> {
        let _gate = self.inner.write_gate.lock().await;
        let mut tx = self.inner.pool.begin().await.map_err(store_error)?;
        let entry = append_audit_on(&mut tx, e).await?;
        tx.commit().await.map_err(store_error)?;
        Ok(entry)
    }

    pub async fn audit_page(&self, tenant: Option<&str>, after: i64, limit: usize) -> StoreResult<Vec<AuditEntry>> {
        let rows: Vec<AuditTuple> = sqlx::query_as(
            "select seq, tenant_id, at, actor, operation, target, counts, prev_hash, hash from audit_log \
             where (?1 is null or tenant_id = ?1) and seq > ?2 order by seq limit ?3",
        )
        .bind(tenant)
        .bind(after)
        .bind(limit as i64)
        .fetch_all(&self.inner.pool)
        .await
        .map_err(store_error)?;
        rows.into_iter().map(audit_of).collect()
    }

    /// No samples: the verification asks the in-process vector index for
    /// the ids themselves.
    pub fn sample_vectors_none(&self) -> Vec<(Tier, Embedding)> {
        Vec::new()
    }
}

/// How many working-memory entries (JSON) the erasure covers.
fn covered(entries: &[String], r: &ErasureRecord) -> u64 {
    entries
        .iter()
        .filter_map(|e| serde_json::from_str::<Memory>(e).ok())
        .filter(|m| r.subject.covers(m, r.requested_at))
        .count() as u64
}

/// Appends to a tenant's chain in the caller's transaction, which holds the
/// write gate.
async fn append_audit_on(conn: &mut sqlx::SqliteConnection, e: &NewAuditEntry) -> StoreResult<AuditEntry> {
    let prev: Option<String> =
        sqlx::query_scalar("select hash from audit_log where tenant_id = ? order by seq desc limit 1")
            .bind(&e.tenant)
            .fetch_optional(&mut *conn)
            .await
            .map_err(store_error)?;
    let prev = prev.unwrap_or_else(|| GENESIS_HASH.to_string());
    let (at, target, counts) = e.fields();
    let hash = entry_hash(&prev, &e.tenant, at, &e.actor, &e.operation, &target, &counts);
    let seq: i64 = sqlx::query_scalar(
        "insert into audit_log (tenant_id, at, actor, operation, target, counts, prev_hash, hash) \
         values (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) returning seq",
    )
    .bind(&e.tenant)
    .bind(micros(at))
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
