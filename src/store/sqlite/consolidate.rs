//! Consolidation's primitives on SQLite (`store::consolidate`, migration
//! 0010): the waiting episodes, an in-process per-agent lock, and the jobs
//! table.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::rows::{COLUMNS, MemoryRow};
use super::{SqliteStore, from_micros, micros, store_error};
use crate::domain::Memory;
use crate::domain::consolidate::{Job, JobReport, JobState};
use crate::store::consolidate::{Backlog, Consolidations};
use crate::store::{StoreError, StoreResult, SweepLease, corrupt};

/// What a waiting episode is (`?3` is now): live, not consolidated, not a
/// summary and not a shared copy.
const WAITING: &str = "m.tier = 'episodic' and m.consolidated_at is null and m.provenance is null \
    and json_extract(m.metadata, '$.consolidation') is null and (m.expires_at is null or m.expires_at > ?3)";

const JOB_COLUMNS: &str =
    "id, tenant_id, agent_id, state, requested_by, requested_at, cutoff, started_at, finished_at, report, error";

type JobTuple = (Uuid, String, String, String, String, i64, i64, Option<i64>, Option<i64>, String, Option<String>);

fn job_of(t: JobTuple) -> StoreResult<Job> {
    let (id, tenant, agent_id, state, requested_by, requested_at, cutoff, started_at, finished_at, report, error) = t;
    Ok(Job {
        id,
        tenant,
        agent_id,
        state: JobState::parse(&state).ok_or_else(|| corrupt("job state", &state))?,
        requested_by,
        requested_at: from_micros(requested_at)?,
        cutoff: from_micros(cutoff)?,
        started_at: started_at.map(from_micros).transpose()?,
        finished_at: finished_at.map(from_micros).transpose()?,
        report: serde_json::from_str::<JobReport>(&report).map_err(|_| corrupt("job report", &report))?,
        error,
    })
}

/// Removes its agent from the set being consolidated when dropped.
struct Held {
    set: Arc<Mutex<HashSet<(String, String)>>>,
    key: (String, String),
}

impl Drop for Held {
    fn drop(&mut self) {
        self.set.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.key);
    }
}

#[async_trait]
impl Consolidations for SqliteStore {
    async fn try_lock(&self, tenant: &str, agent_id: &str) -> StoreResult<Option<SweepLease>> {
        let set = self.inner.consolidating.clone();
        let key = (tenant.to_string(), agent_id.to_string());
        let fresh = set.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone());
        Ok(fresh.then(|| SweepLease::holding(Held { set, key })))
    }

    async fn backlog(&self, cutoff: DateTime<Utc>, now: DateTime<Utc>, limit: usize) -> StoreResult<Vec<Backlog>> {
        let rows: Vec<(String, String, i64, i64)> = sqlx::query_as(AssertSqlSafe(format!(
            "select m.tenant_id, m.agent_id, count(*), min(m.created_at) from memories m \
             where m.created_at <= ?1 and {WAITING} group by m.tenant_id, m.agent_id \
             order by count(*) desc, min(m.created_at) limit ?2"
        )))
        .bind(micros(cutoff))
        .bind(limit as i64)
        .bind(micros(now))
        .fetch_all(&self.inner.pool)
        .await
        .map_err(store_error)?;
        rows.into_iter()
            .map(|(tenant, agent_id, n, oldest)| {
                Ok(Backlog { tenant, agent_id, episodes: n as u64, oldest: from_micros(oldest)? })
            })
            .collect()
    }

    async fn pending(
        &self,
        tenant: &str,
        agent_id: &str,
        cutoff: DateTime<Utc>,
        now: DateTime<Utc>,
        limit: usize,
    ) -> StoreResult<Vec<Memory>> {
        let rows: Vec<MemoryRow> = sqlx::query_as(AssertSqlSafe(format!(
            "select {COLUMNS} from memories m where m.tenant_id = ?1 and m.agent_id = ?2 and m.created_at <= ?4 \
             and {WAITING} order by m.created_at, m.id limit ?5"
        )))
        .bind(tenant)
        .bind(agent_id)
        .bind(micros(now))
        .bind(micros(cutoff))
        .bind(limit as i64)
        .fetch_all(&self.inner.pool)
        .await
        .map_err(store_error)?;
        rows.into_iter().map(Memory::try_from).collect()
    }

    async fn insert_job(&self, job: &Job) -> StoreResult<()> {
        let _gate = self.inner.write_gate.lock().await;
        sqlx::query(
            "insert into consolidation_jobs (id, tenant_id, agent_id, state, requested_by, requested_at, cutoff) \
             values (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(job.id)
        .bind(&job.tenant)
        .bind(&job.agent_id)
        .bind(job.state.as_str())
        .bind(&job.requested_by)
        .bind(micros(job.requested_at))
        .bind(micros(job.cutoff))
        .execute(&self.inner.pool)
        .await
        .map_err(store_error)?;
        Ok(())
    }

    async fn job(&self, tenant: &str, id: Uuid) -> StoreResult<Option<Job>> {
        let row: Option<JobTuple> = sqlx::query_as(AssertSqlSafe(format!(
            "select {JOB_COLUMNS} from consolidation_jobs where tenant_id = ? and id = ?"
        )))
        .bind(tenant)
        .bind(id)
        .fetch_optional(&self.inner.pool)
        .await
        .map_err(store_error)?;
        row.map(job_of).transpose()
    }

    async fn claim_job(&self, now: DateTime<Utc>, stale_before: DateTime<Utc>) -> StoreResult<Option<Job>> {
        let _gate = self.inner.write_gate.lock().await;
        let row: Option<JobTuple> = sqlx::query_as(AssertSqlSafe(format!(
            "update consolidation_jobs set state = 'running', started_at = ?1 where id = \
                 (select id from consolidation_jobs where state = 'queued' \
                     or (state = 'running' and started_at < ?2) order by requested_at limit 1) \
             returning {JOB_COLUMNS}"
        )))
        .bind(micros(now))
        .bind(micros(stale_before))
        .fetch_optional(&self.inner.pool)
        .await
        .map_err(store_error)?;
        row.map(job_of).transpose()
    }

    async fn update_job(&self, job: &Job) -> StoreResult<()> {
        let report = serde_json::to_string(&job.report).map_err(|e| StoreError::Internal(e.into()))?;
        let _gate = self.inner.write_gate.lock().await;
        sqlx::query(
            "update consolidation_jobs set state = ?3, started_at = ?4, finished_at = ?5, report = ?6, error = ?7 \
             where tenant_id = ?1 and id = ?2",
        )
        .bind(&job.tenant)
        .bind(job.id)
        .bind(job.state.as_str())
        .bind(job.started_at.map(micros))
        .bind(job.finished_at.map(micros))
        .bind(report)
        .bind(&job.error)
        .execute(&self.inner.pool)
        .await
        .map_err(store_error)?;
        Ok(())
    }
}
