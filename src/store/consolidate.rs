//! Consolidation's storage: which episodes wait, the per-agent lock, and the
//! jobs. Each backend implements the primitives; what a run does with them
//! is decided in `domain::consolidate` and by the consolidation service.
//! Marking episodes consolidated happens in the write transaction of what
//! was made from them (`write::WriteTx::mark_consolidated`), so an episode is
//! consolidated exactly once even across a crash.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{StoreResult, SweepLease};
use crate::domain::Memory;
use crate::domain::consolidate::Job;

/// One agent's waiting episodes.
#[derive(Debug, Clone, PartialEq)]
pub struct Backlog {
    pub tenant: String,
    pub agent_id: String,
    pub episodes: u64,
    /// When the oldest waiting episode was ingested.
    pub oldest: DateTime<Utc>,
}

#[async_trait]
pub trait Consolidations: Send + Sync {
    /// The right to consolidate one agent; `None` while another run (of
    /// this process or another) holds it. Dropping the lease releases it.
    async fn try_lock(&self, tenant: &str, agent_id: &str) -> StoreResult<Option<SweepLease>>;

    /// Agents with episodes ingested at or before `cutoff` that wait for
    /// consolidation, the largest backlog first, at most `limit`.
    async fn backlog(&self, cutoff: DateTime<Utc>, now: DateTime<Utc>, limit: usize) -> StoreResult<Vec<Backlog>>;

    /// An agent's waiting episodes ingested at or before `cutoff`, oldest
    /// first, at most `limit`: live, not yet consolidated, neither a derived
    /// record nor a shared copy (those are made from other memories).
    async fn pending(
        &self,
        tenant: &str,
        agent_id: &str,
        cutoff: DateTime<Utc>,
        now: DateTime<Utc>,
        limit: usize,
    ) -> StoreResult<Vec<Memory>>;

    async fn insert_job(&self, job: &Job) -> StoreResult<()>;

    async fn job(&self, tenant: &str, id: Uuid) -> StoreResult<Option<Job>>;

    /// Takes the oldest queued job, or one left `running` since before
    /// `stale_before` (its process died), marking it running at `now`.
    async fn claim_job(&self, now: DateTime<Utc>, stale_before: DateTime<Utc>) -> StoreResult<Option<Job>>;

    /// Stores a job's state, times, report and error.
    async fn update_job(&self, job: &Job) -> StoreResult<()>;
}
