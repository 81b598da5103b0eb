//! The retention sweep: hard-deletes memories past their `expires_at`, then
//! memories whose retention score decayed below the threshold, from every
//! store they live in, in bounded batches; and the dry run that lists what
//! the next sweep would delete.
//!
//! Reads already hide expired memories; the sweep is what makes them gone.
//! Each batch is one transaction of at most `batch` rows (on the embedded
//! backend it holds the write queue for that batch only). One sweeper runs at
//! a time (on Postgres, across replicas: an advisory lock). Deleted skills
//! are evicted from the skill cache. The dry run and the sweep share every
//! decision (`domain::retention::DecayRule`) and read the same clock, so at
//! one instant a sweep deletes what the dry run listed.
//!
//! Must not: hold a rule of its own. What decays is `domain::retention`'s;
//! how rows are found and deleted is each backend's `Sweep`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::clock::Clock;
use crate::domain::Tier;
use crate::domain::retention::{DecayRule, Reason};
use crate::store::{Doomed, SkillCache, StoreResult, Sweep, SweepCursor};

pub struct RetentionSweep {
    pub sweep: Arc<dyn Sweep>,
    pub skills: Arc<dyn SkillCache>,
    pub clock: Arc<dyn Clock>,
    pub decay: DecayRule,
    /// Rows per batch (one transaction each).
    pub batch: usize,
}

/// What one sweep deleted.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepReport {
    /// False when another sweeper held the lock and this one did nothing.
    pub ran: bool,
    /// Memories deleted, per tier and reason.
    pub deleted: BTreeMap<(Tier, Reason), u64>,
    /// What could not be swept this time (the error is logged).
    pub failed: Vec<(Tier, Reason)>,
}

/// Ids a sweep would delete for one reason: how many, and the first of them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Listing {
    pub count: u64,
    pub ids: Vec<Uuid>,
}

/// What the next sweep would delete of one tenant's tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierPreview {
    pub tier: Tier,
    pub expired: Listing,
    pub decayed: Listing,
}

impl RetentionSweep {
    /// One sweep: every tier's expired memories, then the decayed ones of
    /// the tiers decay applies to. Returns at once (`ran: false`) when
    /// another sweeper is at work.
    pub async fn run_once(&self) -> anyhow::Result<SweepReport> {
        self.run_until(&CancellationToken::new()).await
    }

    /// `run_once`, stopping between batches once `stop` is cancelled (a
    /// batch, once begun, finishes: its commit and the index changes after
    /// it belong together). A tier that fails (Redis down, say) is logged
    /// and named in the report; the other tiers are still swept.
    pub async fn run_until(&self, stop: &CancellationToken) -> anyhow::Result<SweepReport> {
        let mut report = SweepReport::default();
        let Some(_lease) = self.sweep.try_begin().await.context("taking the sweep lock")? else {
            return Ok(report);
        };
        report.ran = true;
        let now = self.clock.now();
        for tier in Tier::ALL {
            if let Err(e) = self.expire(tier, now, stop, &mut report).await {
                tracing::warn!(error = ?e, tier = tier.as_str(), "retention: expired memories not swept");
                report.failed.push((tier, Reason::Expired));
            }
        }
        for tier in Tier::ALL.into_iter().filter(|t| self.decay.applies_to(*t)) {
            if let Err(e) = self.decay(tier, now, stop, &mut report).await {
                tracing::warn!(error = ?e, tier = tier.as_str(), "retention: decayed memories not swept");
                report.failed.push((tier, Reason::Decayed));
            }
        }
        self.observe().await;
        Ok(report)
    }

    /// Deletes a tier's expired memories, batch after batch.
    async fn expire(
        &self,
        tier: Tier,
        now: DateTime<Utc>,
        stop: &CancellationToken,
        report: &mut SweepReport,
    ) -> anyhow::Result<()> {
        while !stop.is_cancelled() {
            let gone = self
                .sweep
                .delete_expired(tier, now, self.batch)
                .await
                .with_context(|| format!("deleting expired {} memories", tier.as_str()))?;
            let full = gone.len() >= self.batch;
            self.deleted(tier, Reason::Expired, gone, report).await;
            if !full {
                break;
            }
        }
        Ok(())
    }

    /// Deletes a tier's decayed memories: candidates a batch at a time, the
    /// rule deciding, then one delete per batch.
    async fn decay(
        &self,
        tier: Tier,
        now: DateTime<Utc>,
        stop: &CancellationToken,
        report: &mut SweepReport,
    ) -> anyhow::Result<()> {
        let mut after: Option<SweepCursor> = None;
        while !stop.is_cancelled() {
            let candidates = self
                .sweep
                .decay_candidates(tier, None, &self.decay, after.as_ref(), self.batch, now)
                .await
                .with_context(|| format!("listing {} memories that may decay", tier.as_str()))?;
            let Some(last) = candidates.last() else { break };
            after = Some((last.tenant.clone(), last.id));
            let doomed: Vec<Doomed> = candidates
                .iter()
                .filter(|c| self.decay.should_forget(c, now))
                .map(|c| Doomed { tenant: c.tenant.clone(), id: c.id })
                .collect();
            let gone = self
                .sweep
                .delete(tier, &doomed)
                .await
                .with_context(|| format!("deleting decayed {} memories", tier.as_str()))?;
            self.deleted(tier, Reason::Decayed, gone, report).await;
            if candidates.len() < self.batch {
                break;
            }
        }
        Ok(())
    }

    /// Counts a batch, and evicts deleted skills from the cache (a failure
    /// there is logged: the cached copy expires on its own within minutes).
    async fn deleted(&self, tier: Tier, reason: Reason, gone: Vec<Doomed>, report: &mut SweepReport) {
        if gone.is_empty() {
            return;
        }
        if tier == Tier::Procedural {
            for d in &gone {
                if let Err(e) = self.skills.evict(&d.tenant, d.id).await {
                    tracing::warn!(error = %e, id = %d.id, "retention: cannot evict a deleted skill from the cache");
                }
            }
        }
        let n = gone.len() as u64;
        metrics::counter!("engram_retention_deleted_total", "tier" => tier.as_str(), "reason" => reason.as_str())
            .increment(n);
        *report.deleted.entry((tier, reason)).or_default() += n;
    }

    /// Sets the gauges: expired memories not yet deleted per tier, and the
    /// sizes of the backend's in-process indexes.
    pub async fn observe(&self) {
        match self.sweep.expired_backlog(self.clock.now()).await {
            Ok(backlog) => {
                for (tier, n) in backlog {
                    metrics::gauge!("engram_retention_backlog", "tier" => tier.as_str()).set(n as f64);
                }
            }
            Err(e) => tracing::debug!(error = %e, "retention: cannot count the backlog"),
        }
        for (index, n) in self.sweep.index_sizes() {
            metrics::gauge!("engram_index_entries", "index" => index).set(n as f64);
        }
    }

    /// What the next sweep would delete of `tenant`'s memories, per tier,
    /// listing at most `limit` ids for each reason (the counts are whole).
    pub async fn preview(&self, tenant: &str, limit: usize) -> StoreResult<(DateTime<Utc>, Vec<TierPreview>)> {
        let now = self.clock.now();
        let mut tiers = Vec::with_capacity(Tier::ALL.len());
        for tier in Tier::ALL {
            let (count, ids) = self.sweep.expired(tenant, tier, now, limit).await?;
            let mut decayed = Listing::default();
            if self.decay.applies_to(tier) {
                let mut after: Option<SweepCursor> = None;
                loop {
                    let candidates = self
                        .sweep
                        .decay_candidates(tier, Some(tenant), &self.decay, after.as_ref(), self.batch, now)
                        .await?;
                    let Some(last) = candidates.last() else { break };
                    after = Some((last.tenant.clone(), last.id));
                    for c in candidates.iter().filter(|c| self.decay.should_forget(c, now)) {
                        decayed.count += 1;
                        if decayed.ids.len() < limit {
                            decayed.ids.push(c.id);
                        }
                    }
                    if candidates.len() < self.batch {
                        break;
                    }
                }
            }
            tiers.push(TierPreview { tier, expired: Listing { count, ids }, decayed });
        }
        Ok((now, tiers))
    }

    /// Sweeps every `every` until shutdown (the first sweep one period after start).
    pub async fn run(self: Arc<Self>, every: Duration, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(every);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            match self.run_until(&shutdown).await {
                Ok(report) if report.ran => {
                    tracing::info!(deleted = ?report.deleted, failed = ?report.failed, "retention sweep done")
                }
                Ok(_) => tracing::debug!("retention sweep skipped: another sweeper is at work"),
                Err(e) => tracing::error!(error = ?e, "retention sweep failed; retrying at the next tick"),
            }
        }
    }
}
