//! Periodic upkeep: forgetting idempotency keys past their lifetime.

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
}

impl Maintenance {
    pub async fn run_once(&self) -> anyhow::Result<Report> {
        let now = self.clock.now();
        let upkeep = &self.store.maintenance;
        let idempotency_keys_deleted = upkeep.forget_idempotency_keys(now).await?;
        Ok(Report { idempotency_keys_deleted })
    }

    pub async fn run(self, every: Duration, shutdown: CancellationToken) {
        // The first tick is immediate: keys that outlived their lifetime while
        // the server was down go at start.
        let mut ticker = tokio::time::interval(every);
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
