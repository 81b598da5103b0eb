//! Retention's primitives on Postgres: deleting expired rows in bounded
//! batches through the `*_expires` indexes (migration 0004), listing decay
//! candidates, and the advisory lock that lets one replica sweep at a time.
//! Every query leaves out rows of a user under an active legal hold
//! (`holds::NOT_HELD`): they are neither listed, counted nor deleted. The
//! condition is part of each delete statement itself, so a hold committed
//! before a batch starts is seen by it; a batch already running when a hold
//! commits may still finish.
//! The Redis half (working memory) is in `store/redis.rs`; both are put
//! together as `Sweep` in `store/storage.rs`.
//!
//! Must not: decide what decays (`domain::retention` does).

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, Postgres, QueryBuilder};
use uuid::Uuid;

use super::holds::NOT_HELD;
use super::rows::table;
use super::{LOCK_RETENTION, PgStore, store_error};
use crate::domain::retention::{DecayCandidate, DecayRule};
use crate::domain::{Retention, Tier};
use crate::store::{Doomed, StoreResult, SweepCursor, SweepLease, corrupt};

/// The persistent tiers, the tables retention sweeps.
pub(crate) const PERSISTENT: [Tier; 3] = [Tier::Episodic, Tier::Semantic, Tier::Procedural];

impl PgStore {
    /// Takes the sweep's session-level advisory lock on a connection taken
    /// out of the pool: the lock lives as long as that connection, which the
    /// lease closes when dropped (also when the sweeping task dies), so a
    /// crashed sweeper never leaves the lock behind.
    pub async fn try_begin_sweep(&self) -> StoreResult<Option<SweepLease>> {
        let mut conn = self.pool.acquire().await.map_err(store_error)?.detach();
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(LOCK_RETENTION)
            .fetch_one(&mut conn)
            .await
            .map_err(store_error)?;
        Ok(got.then(|| SweepLease::holding(conn)))
    }

    /// Deletes up to `limit` rows of a persistent tier expired at `now`, in one
    /// statement (its own transaction); rows locked by a writer are skipped.
    pub async fn delete_expired(&self, tier: Tier, now: DateTime<Utc>, limit: usize) -> StoreResult<Vec<Doomed>> {
        let t = table(tier);
        let rows: Vec<(String, Uuid)> = sqlx::query_as(AssertSqlSafe(format!(
            "WITH doomed AS (SELECT tenant_id, id FROM {t} m WHERE expires_at <= $1 AND {NOT_HELD} \
                 ORDER BY expires_at LIMIT $2 FOR UPDATE OF m SKIP LOCKED) \
             DELETE FROM {t} m USING doomed d WHERE m.tenant_id = d.tenant_id AND m.id = d.id \
             RETURNING m.tenant_id, m.id"
        )))
        .bind(now)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(store_error)?;
        Ok(rows.into_iter().map(|(tenant, id)| Doomed { tenant, id }).collect())
    }

    /// A tenant's expired rows of a persistent tier: how many, and up to `limit` ids.
    pub async fn expired(
        &self,
        tenant: &str,
        tier: Tier,
        now: DateTime<Utc>,
        limit: usize,
    ) -> StoreResult<(u64, Vec<Uuid>)> {
        let t = table(tier);
        let count: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {t} m WHERE tenant_id = $1 AND expires_at <= $2 AND {NOT_HELD}"
        )))
        .bind(tenant)
        .bind(now)
        .fetch_one(&self.pool)
        .await
        .map_err(store_error)?;
        let ids: Vec<Uuid> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT id FROM {t} m WHERE tenant_id = $1 AND expires_at <= $2 AND {NOT_HELD} \
             ORDER BY expires_at, id LIMIT $3"
        )))
        .bind(tenant)
        .bind(now)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(store_error)?;
        Ok((count as u64, ids))
    }

    /// Expired rows not yet deleted, per persistent tier, all tenants.
    pub async fn expired_backlog(&self, now: DateTime<Utc>) -> StoreResult<Vec<(Tier, u64)>> {
        let mut out = Vec::with_capacity(PERSISTENT.len());
        for tier in PERSISTENT {
            let n: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT count(*) FROM {} m WHERE expires_at <= $1 AND {NOT_HELD}",
                table(tier)
            )))
            .bind(now)
            .fetch_one(&self.pool)
            .await
            .map_err(store_error)?;
            out.push((tier, n as u64));
        }
        Ok(out)
    }

    /// Live rows decay might forget, in id order (the primary key; ids are
    /// UUIDv7, so roughly oldest first) after the cursor's id.
    pub async fn decay_candidates(
        &self,
        tier: Tier,
        tenant: Option<&str>,
        rule: &DecayRule,
        after: Option<&SweepCursor>,
        limit: usize,
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<DecayCandidate>> {
        let mut qb: QueryBuilder<Postgres> = QueryBuilder::new(format!(
            "SELECT tenant_id, id, retention, importance, created_at, last_accessed_at, access_count FROM {} m \
             WHERE {NOT_HELD} AND importance < ",
            table(tier)
        ));
        qb.push_bind(rule.importance_below());
        qb.push(" AND retention <> 'permanent' AND created_at <= ").push_bind(rule.ingested_before(now));
        qb.push(" AND (expires_at IS NULL OR expires_at > ").push_bind(now).push(")");
        if tier == Tier::Semantic {
            // A superseded fact is history, kept with its chain; it is not
            // recalled, so it is never accessed and would always decay.
            qb.push(" AND valid_until IS NULL");
        }
        if let Some(t) = tenant {
            qb.push(" AND tenant_id = ").push_bind(t.to_string());
        }
        if let Some((_, id)) = after {
            qb.push(" AND id > ").push_bind(*id);
        }
        qb.push(" ORDER BY id LIMIT ").push_bind(limit as i64);
        type Row = (String, Uuid, String, f64, DateTime<Utc>, Option<DateTime<Utc>>, i32);
        let rows: Vec<Row> = qb.build_query_as().fetch_all(&self.pool).await.map_err(store_error)?;
        rows.into_iter()
            .map(|(tenant, id, retention, importance, created_at, last_accessed_at, access_count)| {
                Ok(DecayCandidate {
                    tenant,
                    id,
                    tier,
                    retention: Retention::parse(&retention).ok_or_else(|| corrupt("retention", &retention))?,
                    importance,
                    created_at,
                    last_accessed_at,
                    access_count: i64::from(access_count),
                })
            })
            .collect()
    }

    /// Deletes these rows of a persistent tier in one statement, except
    /// held ones: decay lists its candidates and deletes them in two steps,
    /// and a hold placed in between must still win. The erasure worker
    /// deletes through here too; its rows are never held (`domain::holds`:
    /// an erasure of a held user is refused, and a hold waits for an
    /// unfinished erasure of its user).
    pub async fn delete_rows(&self, tier: Tier, rows: &[Doomed]) -> StoreResult<Vec<Doomed>> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let tenants: Vec<&str> = rows.iter().map(|r| r.tenant.as_str()).collect();
        let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
        let deleted: Vec<(String, Uuid)> = sqlx::query_as(AssertSqlSafe(format!(
            "DELETE FROM {} m USING unnest($1::text[], $2::uuid[]) AS d(tenant_id, id) \
             WHERE m.tenant_id = d.tenant_id AND m.id = d.id AND {NOT_HELD} RETURNING m.tenant_id, m.id",
            table(tier)
        )))
        .bind(&tenants)
        .bind(&ids)
        .fetch_all(&self.pool)
        .await
        .map_err(store_error)?;
        Ok(deleted.into_iter().map(|(tenant, id)| Doomed { tenant, id }).collect())
    }
}
