//! Periodic upkeep: episodic partitions for the months ahead (on Postgres),
//! and forgetting idempotency keys past their lifetime.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::store::Storage;

pub struct Maintenance {
    pub store: Storage,
    pub clock: Arc<dyn Clock>,
    pub partitions_ahead_months: u32,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub partitions_created: i32,
    pub idempotency_keys_deleted: u64,
}

impl Maintenance {
    pub async fn run_once(&self) -> anyhow::Result<Report> {
        let now = self.clock.now();
        let upkeep = &self.store.maintenance;
        let partitions_created = upkeep.ensure_partitions(now, self.partitions_ahead_months).await?;
        let idempotency_keys_deleted = upkeep.forget_idempotency_keys(now).await?;
        Ok(Report { partitions_created, idempotency_keys_deleted })
    }

    pub async fn run(self, every: Duration, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(every);
        ticker.tick().await; // the first tick is immediate; startup already did this work
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            match self.run_once().await {
                Ok(report) => tracing::info!(?report, "maintenance done"),
                Err(e) => tracing::error!(error = ?e, "maintenance failed; retrying at the next tick"),
            }
        }
    }
}
