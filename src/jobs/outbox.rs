//! Writes the working-memory entries of committed batches that a crash or a
//! Redis failure after the commit kept out of working memory (the outbox,
//! `MemoryService::complete_staged`). Entries are written by id, so this
//! racing a retry of the same batch still leaves one copy.
//!
//! Then evicts the cached copies of skills that writes changed or deleted
//! (`MemoryService::complete_evictions`): the writer evicts after its commit,
//! but a crash or an unreachable Redis can stop it, and a Redis that comes
//! back with its data would hand the old skill to every replica until the
//! entry expires. Every replica runs this, so the stale copy lasts at most
//! one interval once Redis answers again.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::service::MemoryService;

/// Entries staged more recently than this belong to requests still running.
const MIN_AGE_SECS: i64 = 5;
/// Entries written per run.
const BATCH: usize = 500;

pub struct Outbox {
    pub service: Arc<MemoryService>,
}

impl Outbox {
    /// Writes up to one batch of entries staged at least `MIN_AGE_SECS` ago;
    /// returns how many were taken out of the outbox.
    pub async fn run_once(&self) -> anyhow::Result<usize> {
        let before = self.service.clock.now() - chrono::Duration::seconds(MIN_AGE_SECS);
        Ok(self.service.complete_staged(before, BATCH).await?)
    }

    /// Evicts up to one batch of skills staged for eviction, of any age (an
    /// early eviction costs a cache miss); returns how many rows it took out.
    pub async fn evict_once(&self) -> anyhow::Result<usize> {
        Ok(self.service.complete_evictions(BATCH).await?)
    }

    pub async fn run(self, every: Duration, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(every);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            match self.run_once().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(entries = n, "working-memory outbox written"),
                Err(e) => tracing::warn!(error = %e, "working-memory outbox not written; retrying at the next tick"),
            }
            match self.evict_once().await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(skills = n, "skill-cache evictions completed"),
                Err(e) => tracing::warn!(error = %e, "skill-cache evictions not completed; retrying at the next tick"),
            }
        }
    }
}
