//! Periodic upkeep: forgetting idempotency keys past their lifetime, and
//! moving working memory an earlier version left in its Redis layout.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::store::Storage;

pub struct Maintenance {
    pub store: Storage,
    pub clock: Arc<dyn Clock>,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub idempotency_keys_deleted: u64,
    pub working_entries_moved: u64,
}

impl Maintenance {
    pub async fn run_once(&self) -> anyhow::Result<Report> {
        let now = self.clock.now();
        let upkeep = &self.store.maintenance;
        let idempotency_keys_deleted = upkeep.forget_idempotency_keys(now).await?;
        let working_entries_moved = upkeep.move_working_layout(now).await?;
        Ok(Report { idempotency_keys_deleted, working_entries_moved })
    }

    /// Runs at start, then every `every`; after a failure (a store down at
    /// start, say) again after `retry`, so that working memory in an old
    /// layout is not left unread for a whole period.
    pub async fn run(self, every: Duration, retry: Duration, shutdown: CancellationToken) {
        let mut wait = Duration::ZERO;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            wait = match self.run_once().await {
                Ok(report) => {
                    tracing::info!(?report, "maintenance done");
                    every
                }
                Err(e) => {
                    tracing::error!(error = ?e, "maintenance failed; retrying in {retry:?}");
                    retry.min(every)
                }
            };
        }
    }
}
