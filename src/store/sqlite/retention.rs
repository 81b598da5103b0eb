//! Retention's primitives on the embedded backend (`Sweep`): deleting expired
//! and decayed memories from the database and, after each commit, from the
//! in-process vector and full-text indexes (the delete path's `IndexOp::Remove`),
//! and expired working-memory entries with the tenant's cached sessions.
//!
//! Every batch takes the write gate for its own transaction only, so writes
//! queue behind one batch at most, never behind a whole sweep; searches wait
//! only while a batch's removals are applied to the in-process indexes.
//! Working memory's `expires_at` is a wall-clock deadline (see `working.rs`),
//! compared here with the sweep's clock: the two agree outside tests, and a
//! test clock moved forward only makes more entries due.
//!
//! Rows of a user under an active legal hold are left out of every query
//! on `memories` (`holds::NOT_HELD`): neither listed, counted nor deleted.
//! Sweep batches and hold placements both run behind the write gate, so a
//! batch sees every hold placed before it. Working memory is outside holds.
//!
//! Must not: decide what decays (`domain::retention` does).

use std::collections::BTreeMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{QueryBuilder, Sqlite};
use uuid::Uuid;

use super::holds::NOT_HELD;
use super::write::IndexOp;
use super::{SqliteStore, from_micros, micros, store_error};
use crate::domain::retention::{DecayCandidate, DecayRule};
use crate::domain::{Retention, Tier};
use crate::store::{Doomed, StoreResult, Sweep, SweepCursor, SweepLease, corrupt};

#[async_trait]
impl Sweep for SqliteStore {
    async fn try_begin(&self) -> StoreResult<Option<SweepLease>> {
        // One process owns the data directory; this keeps two sweeps of
        // that process (the job and an operator's) from running together.
        Ok(self.inner.sweep_gate.clone().try_lock_owned().ok().map(SweepLease::holding))
    }

    async fn delete_expired(&self, tier: Tier, now: DateTime<Utc>, limit: usize) -> StoreResult<Vec<Doomed>> {
        // Spawned: once begun, a batch's commit and its index removals
        // happen together even if the caller stops waiting.
        let store = self.clone();
        finish(tokio::spawn(async move { store.delete_expired_batch(tier, now, limit).await })).await
    }

    async fn expired(
        &self,
        tenant: &str,
        tier: Tier,
        now: DateTime<Utc>,
        limit: usize,
    ) -> StoreResult<(u64, Vec<Uuid>)> {
        let (table, tier_filter) = match tier {
            Tier::Working => ("working_memory", String::new()),
            _ => ("memories", format!(" and tier = ?3 and {NOT_HELD}")),
        };
        let filter = format!("from {table} where tenant_id = ?1 and expires_at <= ?2{tier_filter}");
        let count: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("select count(*) {filter}")))
            .bind(tenant)
            .bind(micros(now))
            .bind(tier.as_str())
            .fetch_one(&self.inner.pool)
            .await
            .map_err(store_error)?;
        let ids: Vec<Uuid> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("select id {filter} order by expires_at, id limit ?4")))
                .bind(tenant)
                .bind(micros(now))
                .bind(tier.as_str())
                .bind(limit as i64)
                .fetch_all(&self.inner.pool)
                .await
                .map_err(store_error)?;
        Ok((count as u64, ids))
    }

    async fn expired_backlog(&self, now: DateTime<Utc>) -> StoreResult<Vec<(Tier, u64)>> {
        let rows: Vec<(String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "select tier, count(*) from memories where expires_at is not null and expires_at <= ?1 and {NOT_HELD} \
                 group by tier union all \
                 select 'working', count(*) from working_memory where expires_at is not null and expires_at <= ?1"
        )))
        .bind(micros(now))
        .fetch_all(&self.inner.pool)
        .await
        .map_err(store_error)?;
        let mut counts: BTreeMap<Tier, u64> = Tier::ALL.into_iter().map(|t| (t, 0)).collect();
        for (tier, n) in rows {
            *counts.entry(Tier::parse(&tier).ok_or_else(|| corrupt("tier", &tier))?).or_default() += n as u64;
        }
        Ok(counts.into_iter().collect())
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
        if tier == Tier::Working {
            return Ok(Vec::new());
        }
        // In (tenant_id, id) order, through the unique index on it.
        let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(format!(
            "select tenant_id, id, retention, importance, created_at, last_accessed_at, access_count \
             from memories where {NOT_HELD} and tier = "
        ));
        qb.push_bind(tier.as_str());
        qb.push(" and importance < ").push_bind(rule.importance_below());
        qb.push(" and retention <> 'permanent' and created_at <= ").push_bind(micros(rule.ingested_before(now)));
        qb.push(" and (expires_at is null or expires_at > ").push_bind(micros(now)).push(")");
        // A superseded fact is history kept with its chain; never recalled,
        // it is never accessed and would always decay.
        qb.push(" and valid_until is null");
        if let Some(t) = tenant {
            qb.push(" and tenant_id = ").push_bind(t.to_string());
        }
        if let Some((t, id)) = after {
            qb.push(" and (tenant_id, id) > (").push_bind(t.clone()).push(", ").push_bind(*id).push(")");
        }
        qb.push(" order by tenant_id, id limit ").push_bind(limit as i64);
        type Row = (String, Uuid, String, f64, i64, Option<i64>, i64);
        let rows: Vec<Row> = qb.build_query_as().fetch_all(&self.inner.pool).await.map_err(store_error)?;
        rows.into_iter()
            .map(|(tenant, id, retention, importance, created, accessed, access_count)| {
                Ok(DecayCandidate {
                    tenant,
                    id,
                    tier,
                    retention: Retention::parse(&retention).ok_or_else(|| corrupt("retention", &retention))?,
                    importance,
                    created_at: from_micros(created)?,
                    last_accessed_at: accessed.map(from_micros).transpose()?,
                    access_count,
                })
            })
            .collect()
    }

    async fn delete(&self, tier: Tier, rows: &[Doomed]) -> StoreResult<Vec<Doomed>> {
        let (store, rows) = (self.clone(), rows.to_vec());
        finish(tokio::spawn(async move { store.delete_batch(tier, &rows).await })).await
    }

    fn index_sizes(&self) -> Vec<(&'static str, usize)> {
        let vectors = self.inner.vectors.read().unwrap_or_else(|poisoned| poisoned.into_inner()).len();
        let text = self.inner.text.read().unwrap_or_else(|poisoned| poisoned.into_inner()).len();
        vec![("vectors", vectors), ("text", text)]
    }
}

impl SqliteStore {
    /// One batch of expired memories of `tier`, deleted under the write gate.
    async fn delete_expired_batch(&self, tier: Tier, now: DateTime<Utc>, limit: usize) -> StoreResult<Vec<Doomed>> {
        let _gate = self.inner.write_gate.lock().await;
        let mut tx = self.inner.pool.begin().await.map_err(store_error)?;
        // Through the partial indexes on expires_at (migration 0005).
        let rows: Vec<(String, Uuid)> = if tier == Tier::Working {
            sqlx::query_as(
                "delete from working_memory where seq in (select seq from working_memory \
                     where expires_at is not null and expires_at <= ?1 order by expires_at limit ?2) \
                 returning tenant_id, id",
            )
            .bind(micros(now))
            .bind(limit as i64)
            .fetch_all(&mut *tx)
            .await
        } else {
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "delete from memories where seq in (select seq from memories \
                     where tier = ?1 and expires_at is not null and expires_at <= ?2 and {NOT_HELD} \
                     order by expires_at limit ?3) \
                 returning tenant_id, id"
            )))
            .bind(tier.as_str())
            .bind(micros(now))
            .bind(limit as i64)
            .fetch_all(&mut *tx)
            .await
        }
        .map_err(store_error)?;
        tx.commit().await.map_err(store_error)?;
        Ok(self.forget_deleted(tier, rows))
    }

    /// These memories of `tier`, deleted under the write gate.
    async fn delete_batch(&self, tier: Tier, rows: &[Doomed]) -> StoreResult<Vec<Doomed>> {
        if rows.is_empty() || tier == Tier::Working {
            return Ok(Vec::new());
        }
        let _gate = self.inner.write_gate.lock().await;
        let mut tx = self.inner.pool.begin().await.map_err(store_error)?;
        let mut deleted = Vec::with_capacity(rows.len());
        for row in rows {
            // Held rows stay (see `store::postgres::retention::delete_rows`
            // for why the delete itself checks).
            let gone = sqlx::query(sqlx::AssertSqlSafe(format!(
                "delete from memories where tenant_id = ? and id = ? and tier = ? and {NOT_HELD}"
            )))
            .bind(&row.tenant)
            .bind(row.id)
            .bind(tier.as_str())
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
            if gone.rows_affected() > 0 {
                deleted.push((row.tenant.clone(), row.id));
            }
        }
        tx.commit().await.map_err(store_error)?;
        Ok(self.forget_deleted(tier, deleted))
    }

    /// After the commit of a sweep's batch (under the write gate): removes
    /// the deleted memories from the in-process indexes, or for working
    /// memory drops the tenants' cached sessions.
    fn forget_deleted(&self, tier: Tier, rows: Vec<(String, Uuid)>) -> Vec<Doomed> {
        let mut by_tenant: BTreeMap<&str, Vec<IndexOp>> = BTreeMap::new();
        for (tenant, id) in &rows {
            by_tenant.entry(tenant).or_default().push(IndexOp::Remove(*id));
        }
        for (tenant, ops) in by_tenant {
            if tier == Tier::Working {
                self.working_memory().forget_sessions(tenant);
            } else {
                self.apply(tenant, ops);
            }
        }
        rows.into_iter().map(|(tenant, id)| Doomed { tenant, id }).collect()
    }
}

/// The result of a spawned batch (a panic in it is an internal error).
async fn finish(task: tokio::task::JoinHandle<StoreResult<Vec<Doomed>>>) -> StoreResult<Vec<Doomed>> {
    task.await.map_err(|e| crate::store::StoreError::Internal(anyhow::anyhow!("sweep batch failed: {e}")))?
}
