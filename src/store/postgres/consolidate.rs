//! Consolidation's primitives on Postgres (`store::consolidate`, migration
//! 0011): the waiting episodes, a per-agent advisory lock held on a
//! connection of its own, and the jobs table.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::rows::{self, MemoryRow};
use super::{PgStore, store_error};
use crate::domain::consolidate::{Job, JobReport, JobState};
use crate::domain::{Memory, Tier};
use crate::store::consolidate::{Backlog, Consolidations};
use crate::store::{StoreResult, SweepLease, corrupt};

/// What a waiting episode is: live, not consolidated, not a summary and not
/// a shared copy.
const WAITING: &str = "consolidated_at IS NULL AND provenance IS NULL AND NOT (metadata ? 'consolidation') \
    AND (expires_at IS NULL OR expires_at > $3)";

const JOB_COLUMNS: &str =
    "id, tenant_id, agent_id, state, requested_by, requested_at, cutoff, started_at, finished_at, report, error";

type JobTuple = (
    Uuid,
    String,
    String,
    String,
    String,
    DateTime<Utc>,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    sqlx::types::Json<JobReport>,
    Option<String>,
);

fn job_of(t: JobTuple) -> StoreResult<Job> {
    let (id, tenant, agent_id, state, requested_by, requested_at, cutoff, started_at, finished_at, report, error) = t;
    Ok(Job {
        id,
        tenant,
        agent_id,
        state: JobState::parse(&state).ok_or_else(|| corrupt("job state", &state))?,
        requested_by,
        requested_at,
        cutoff,
        started_at,
        finished_at,
        report: report.0,
        error,
    })
}

#[async_trait]
impl Consolidations for PgStore {
    async fn try_lock(&self, tenant: &str, agent_id: &str) -> StoreResult<Option<SweepLease>> {
        // A session lock on a connection taken out of the pool: it lasts as
        // long as the run, and closing the connection (dropping the lease,
        // or the process dying) releases it.
        let mut conn = self.pool.acquire().await.map_err(store_error)?.detach();
        let got: bool = sqlx::query_scalar(
            "SELECT pg_try_advisory_lock(hashtextextended('consolidation:' || length($1) || ':' || $1 || $2, 0))",
        )
        .bind(tenant)
        .bind(agent_id)
        .fetch_one(&mut conn)
        .await
        .map_err(store_error)?;
        Ok(got.then(|| SweepLease::holding(conn)))
    }

    async fn backlog(&self, cutoff: DateTime<Utc>, now: DateTime<Utc>, limit: usize) -> StoreResult<Vec<Backlog>> {
        let rows: Vec<(String, String, i64, DateTime<Utc>)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT tenant_id, agent_id, count(*), min(created_at) FROM episodic_memory \
             WHERE created_at <= $1 AND {WAITING} GROUP BY tenant_id, agent_id \
             ORDER BY count(*) DESC, min(created_at) LIMIT $2"
        )))
        .bind(cutoff)
        .bind(limit as i64)
        .bind(now)
        .fetch_all(&self.pool)
        .await
        .map_err(store_error)?;
        Ok(rows
            .into_iter()
            .map(|(tenant, agent_id, n, oldest)| Backlog { tenant, agent_id, episodes: n as u64, oldest })
            .collect())
    }

    async fn pending(
        &self,
        tenant: &str,
        agent_id: &str,
        cutoff: DateTime<Utc>,
        now: DateTime<Utc>,
        limit: usize,
    ) -> StoreResult<Vec<Memory>> {
        let found: Vec<MemoryRow> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {} FROM episodic_memory WHERE tenant_id = $1 AND agent_id = $2 AND created_at <= $4 \
             AND {WAITING} ORDER BY created_at, id LIMIT $5",
            rows::columns(Tier::Episodic)
        )))
        .bind(tenant)
        .bind(agent_id)
        .bind(now)
        .bind(cutoff)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(store_error)?;
        found.into_iter().map(Memory::try_from).collect()
    }

    async fn insert_job(&self, job: &Job) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO consolidation_jobs (id, tenant_id, agent_id, state, requested_by, requested_at, cutoff) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(job.id)
        .bind(&job.tenant)
        .bind(&job.agent_id)
        .bind(job.state.as_str())
        .bind(&job.requested_by)
        .bind(job.requested_at)
        .bind(job.cutoff)
        .execute(&self.pool)
        .await
        .map_err(store_error)?;
        Ok(())
    }

    async fn job(&self, tenant: &str, id: Uuid) -> StoreResult<Option<Job>> {
        let row: Option<JobTuple> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {JOB_COLUMNS} FROM consolidation_jobs WHERE tenant_id = $1 AND id = $2"
        )))
        .bind(tenant)
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(store_error)?;
        row.map(job_of).transpose()
    }

    async fn claim_job(&self, now: DateTime<Utc>, stale_before: DateTime<Utc>) -> StoreResult<Option<Job>> {
        let row: Option<JobTuple> = sqlx::query_as(AssertSqlSafe(format!(
            "UPDATE consolidation_jobs SET state = 'running', started_at = $1 WHERE id = \
                 (SELECT id FROM consolidation_jobs WHERE state = 'queued' \
                     OR (state = 'running' AND started_at < $2) \
                  ORDER BY requested_at LIMIT 1 FOR UPDATE SKIP LOCKED) \
             RETURNING {JOB_COLUMNS}"
        )))
        .bind(now)
        .bind(stale_before)
        .fetch_optional(&self.pool)
        .await
        .map_err(store_error)?;
        row.map(job_of).transpose()
    }

    async fn update_job(&self, job: &Job) -> StoreResult<()> {
        sqlx::query(
            "UPDATE consolidation_jobs SET state = $3, started_at = $4, finished_at = $5, report = $6, error = $7 \
             WHERE tenant_id = $1 AND id = $2",
        )
        .bind(&job.tenant)
        .bind(job.id)
        .bind(job.state.as_str())
        .bind(job.started_at)
        .bind(job.finished_at)
        .bind(sqlx::types::Json(&job.report))
        .bind(&job.error)
        .execute(&self.pool)
        .await
        .map_err(store_error)?;
        Ok(())
    }
}
