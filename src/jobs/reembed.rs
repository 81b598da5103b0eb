//! Background re-embedding after the configured embedding model changes (or
//! when a model is configured where there was none).
//!
//! Search compares only vectors of the configured model, so until this job
//! has moved a memory into the new vector space, that memory is found by the
//! full-text leg alone; nothing ever compares vectors of two models. The job
//! is resumable (a row is done when it carries the configured model), safe
//! with several replicas (rows are claimed with SKIP LOCKED), and rate
//! limited (a pause between batches). Progress: logs, and the
//! `engram_reembed_pending` gauge and `engram_reembed_done_total` counter.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::domain::Tier;
use crate::embed::Embedder;
use crate::store::Storage;

pub struct Reembed {
    pub store: Storage,
    pub embedder: Arc<dyn Embedder>,
    pub clock: Arc<dyn Clock>,
    pub batch: usize,
    pub pause: Duration,
}

impl Reembed {
    /// One batch per tier; returns how many rows moved.
    pub async fn run_once(&self) -> anyhow::Result<usize> {
        let mut done = 0;
        for tier in [Tier::Episodic, Tier::Semantic, Tier::Procedural] {
            done += self
                .store
                .maintenance
                .reembed_batch(tier, self.embedder.as_ref(), self.batch, self.clock.now())
                .await?;
        }
        metrics::counter!("engram_reembed_done_total").increment(done as u64);
        Ok(done)
    }

    /// Works until nothing is pending, then checks again now and then.
    pub async fn run(self, shutdown: CancellationToken) {
        let model = self.embedder.model_id().to_string();
        let mut announced = false;
        let mut total = 0usize;
        // The job runs in the server: its progress is log lines (done, the
        // rate since it started, the time left at that rate), not a bar.
        let mut started = std::time::Instant::now();
        loop {
            let pending = match self.store.maintenance.reembed_pending(&model).await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "re-embedding: cannot count pending rows");
                    0
                }
            };
            metrics::gauge!("engram_reembed_pending").set(pending as f64);
            let mut idle = Duration::from_secs(60);
            if pending > 0 {
                if !announced {
                    tracing::info!(model, pending, "re-embedding memories into the configured model's vector space");
                    announced = true;
                    started = std::time::Instant::now();
                    total = 0;
                }
                match self.run_once().await {
                    Ok(n) => {
                        total += n;
                        let remaining = (pending - n as i64).max(0);
                        let per_sec = total as f64 / started.elapsed().as_secs_f64().max(1e-3);
                        let eta_secs = if per_sec > 0.0 { (remaining as f64 / per_sec).round() as u64 } else { 0 };
                        tracing::info!(
                            model,
                            done = total,
                            remaining,
                            per_sec = per_sec.round() as u64,
                            eta_secs,
                            "re-embedding progress"
                        );
                        idle = self.pause;
                    }
                    Err(e) => tracing::warn!(error = ?e, "re-embedding batch failed; retrying later"),
                }
            } else if announced {
                tracing::info!(model, done = total, "re-embedding finished");
                announced = false;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(idle) => {}
            }
        }
    }
}
