//! Flushes access counts of recalled memories to the store in batches, so
//! that a search never waits on an UPDATE.

use std::collections::HashMap;
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
}

impl AccessFlusher {
    /// Drains what is queued and writes it, one statement per tenant and tier.
    pub async fn run_once(&mut self) -> usize {
        let mut batch: HashMap<String, HashMap<(Tier, Uuid), i32>> = HashMap::new();
        while let Ok((tenant, hits)) = self.rx.try_recv() {
            let counts = batch.entry(tenant).or_default();
            for hit in hits {
                *counts.entry(hit).or_insert(0) += 1;
            }
        }
        let mut written = 0;
        let now = self.clock.now();
        for (tenant, counts) in batch {
            let hits: Vec<(Tier, Uuid, i32)> = counts.into_iter().map(|((t, id), n)| (t, id, n)).collect();
            written += hits.len();
            if let Err(e) = self.store.record_access(&tenant, &hits, now).await {
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
