//! Periodic upkeep of the Postgres schema: episodic partitions for the months
//! ahead, and forgetting idempotency keys past their lifetime.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::store::Backend;

pub struct Maintenance {
    pub store: Backend,
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
        // Only Postgres partitions episodic memory by month.
        let partitions_created = match self.store.pg() {
            Some(pg) => pg.ensure_partitions(now, self.partitions_ahead_months).await?,
            None => 0,
        };
        let idempotency_keys_deleted = self.store.forget_idempotency_keys(now).await?;
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
