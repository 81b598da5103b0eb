//! Flushes access counts of recalled memories to the store in batches, so
//! that a search never waits on an UPDATE. A memory's access is counted once
//! per `search.access_interval_secs`: frequency measures on how many occasions
//! a memory was recalled, and a burst of searches is one occasion.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::clock::Clock;
use crate::domain::Tier;
use crate::store::MemoryStore;

pub struct AccessFlusher {
    pub store: Arc<dyn MemoryStore>,
    pub clock: Arc<dyn Clock>,
    pub rx: mpsc::Receiver<crate::recall::AccessBatch>,
    /// `search.access_interval_secs`: retrievals this soon after a counted one are not counted.
    pub interval: chrono::Duration,
}

impl AccessFlusher {
    /// Drains what is queued and writes it, one statement per tenant and tier.
    pub async fn run_once(&mut self) -> usize {
        let mut batch: HashMap<String, HashSet<(Tier, Uuid)>> = HashMap::new();
        while let Ok((tenant, hits)) = self.rx.try_recv() {
            batch.entry(tenant).or_default().extend(hits);
        }
        let mut written = 0;
        let now = self.clock.now();
        // A batch spans well under a second: retrievals in it are one occasion.
        let counted_after = now - self.interval;
        for (tenant, hits) in batch {
            let hits: Vec<(Tier, Uuid)> = hits.into_iter().collect();
            written += hits.len();
            if let Err(e) = self.store.record_access(&tenant, &hits, now, counted_after).await {
                tracing::warn!(error = %e, count = hits.len(), "could not record accesses");
            }
        }
        written
    }

    pub async fn run(mut self, every: Duration, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(every);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    self.run_once().await;
                    return;
                }
                _ = ticker.tick() => {
                    self.run_once().await;
                }
            }
        }
    }
}
