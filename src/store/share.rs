//! Sharing's storage: grants, teams, and the copies a share made (found by
//! their provenance). Each backend implements the primitives; who may share
//! what is decided in `domain::share` and by the sharing service.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::StoreResult;
use crate::domain::Memory;
use crate::domain::share::{Grant, Teams};

/// Which copies to list.
#[derive(Debug, Clone, Copy)]
pub enum Copies<'a> {
    /// Held by this agent (shared into it).
    Into(&'a str),
    /// Made from this agent's memories (shared out of it).
    From(&'a str),
    /// Made under this grant.
    Grant(Uuid),
}

/// A tenant's grants and teams, and its shared copies.
#[async_trait]
pub trait Sharing: Send + Sync {
    /// Every grant of the tenant, revoked ones included, oldest first.
    async fn grants(&self, tenant: &str) -> StoreResult<Vec<Grant>>;

    async fn insert_grant(&self, tenant: &str, grant: &Grant) -> StoreResult<()>;

    /// Marks a grant revoked (unless it already is); returns it as stored,
    /// `None` when the tenant has no such grant.
    async fn revoke_grant(&self, tenant: &str, id: Uuid, by: &str, at: DateTime<Utc>) -> StoreResult<Option<Grant>>;

    async fn teams(&self, tenant: &str) -> StoreResult<Teams>;

    /// Replaces a team's members (an empty list deletes the team).
    async fn set_team(&self, tenant: &str, team: &str, agents: &[String]) -> StoreResult<()>;

    /// Live copies, newest first, at most `limit`.
    async fn copies(
        &self,
        tenant: &str,
        which: Copies<'_>,
        now: DateTime<Utc>,
        limit: usize,
    ) -> StoreResult<Vec<Memory>>;
}
