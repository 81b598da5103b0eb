//! Erasure: accepting a request (durable, and the subject hidden, before it
//! is acknowledged) and the worker that finishes it. For each unfinished
//! erasure the worker deletes the claimed rows (through the retention
//! sweep's delete, which also empties the in-process indexes), evicts the
//! claimed skills from the skill cache, deletes the subject's working
//! memory, purges deleted bytes, then verifies with each store's own queries
//! and appends the audit entry. A store that is down leaves the erasure
//! `retrying` (the claims keep it hidden); the next look resumes it, also
//! after a restart. One worker at a time (on Postgres, across replicas).
//! Legal holds are placed and released here too: they and erasures are
//! decided against each other in one transaction (`store::erasure`).
//!
//! Must not: decide what belongs to the subject (`domain::erasure`), or
//! hold SQL (`store::erasure`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::clock::Clock;
use crate::domain::Tier;
use crate::domain::erasure::{
    AuditEntry, Broken, Counts, Erasing, ErasureRecord, ErasureState, NewAuditEntry, Receipt, Subject, verify_chain,
};
use crate::domain::holds::{self, Hold};
use crate::store::erasure::Erasures;
use crate::store::{Doomed, SkillCache, StoreResult, Sweep, Transfer, WorkingMemory};

pub struct Eraser {
    pub erasure: Arc<dyn Erasures>,
    pub sweep: Arc<dyn Sweep>,
    pub working: Arc<dyn WorkingMemory>,
    pub transfer: Arc<dyn Transfer>,
    pub skills: Arc<dyn SkillCache>,
    pub clock: Arc<dyn Clock>,
    /// Erasures not finished, for working-memory reads (`MemoryService`).
    pub erasing: Arc<Erasing>,
    /// The backend (`postgres` or `embedded`), naming the stores in receipts.
    pub backend: &'static str,
    /// Rows per delete transaction.
    pub batch: usize,
    /// Wakes the worker when a request is accepted.
    pub wake: Notify,
}

impl Eraser {
    /// (persistent store, working-memory store) as receipts name them.
    fn stores(&self) -> (&'static str, &'static str) {
        match self.backend {
            "postgres" => ("postgres", "redis"),
            _ => ("sqlite", "sqlite"),
        }
    }

    /// Accepts an erasure: stores it and hides the subject, in one
    /// transaction, then wakes the worker. Returns the erasure as stored.
    pub async fn request(&self, tenant: &str, actor: &str, subject: Subject) -> StoreResult<ErasureRecord> {
        let now = up_to_micros(self.clock.now());
        let record = ErasureRecord {
            id: Uuid::now_v7(),
            tenant: tenant.to_string(),
            subject,
            requested_by: actor.to_string(),
            state: ErasureState::Pending,
            attempts: 0,
            last_error: None,
            receipt: Receipt::default(),
            requested_at: now,
            completed_at: None,
            updated_at: now,
        };
        let (persistent, _) = self.stores();
        let tx = self.erasure.begin_erasure().await?;
        let accepted = crate::store::erasure::accept(tx, record, persistent).await?;
        self.erasing.add(tenant, accepted.record.subject.clone(), accepted.record.requested_at);
        // A skill cached before the request could still be served from the
        // cache until the worker evicts it; the working-memory guard
        // (`Erasing`) covers that window, this shortens it.
        for id in &accepted.skills {
            let _ = self.skills.evict(tenant, *id).await;
        }
        metrics::counter!("engram_erasures_total", "state" => "pending").increment(1);
        self.wake.notify_one();
        Ok(accepted.record)
    }

    /// Places a legal hold on a user, audited in the same transaction
    /// (`store::erasure::place_hold`). Refused while an erasure of the user
    /// is unfinished.
    pub async fn place_hold(
        &self,
        tenant: &str,
        actor: &str,
        user_id: String,
        reason: Option<String>,
    ) -> StoreResult<Hold> {
        let hold = Hold::new(tenant, user_id, reason, actor, self.clock.now());
        let audit = NewAuditEntry {
            tenant: tenant.to_string(),
            at: hold.placed_at,
            actor: actor.to_string(),
            operation: holds::PLACED.into(),
            // The user and the hold, never the reason: it is free text.
            target: json!({"hold_id": hold.id, "user_id": hold.user_id}),
            counts: json!({}),
        };
        let tx = self.erasure.begin_erasure().await?;
        crate::store::erasure::place_hold(tx, &hold, &audit).await?;
        metrics::counter!("engram_legal_holds_total", "change" => "placed").increment(1);
        Ok(hold)
    }

    /// Releases a hold, audited in the same transaction; a hold already
    /// released is returned unchanged. `None`: the tenant has no such hold.
    pub async fn release_hold(&self, tenant: &str, actor: &str, id: Uuid) -> StoreResult<Option<Hold>> {
        let now = self.clock.now();
        let tx = self.erasure.begin_erasure().await?;
        let mut changed = false;
        let released = crate::store::erasure::release_hold(tx, tenant, id, |held| {
            changed = true;
            let released = held.released(actor, now);
            let audit = NewAuditEntry {
                tenant: tenant.to_string(),
                at: released.released_at.unwrap_or(now),
                actor: actor.to_string(),
                operation: holds::RELEASED.into(),
                target: json!({"hold_id": released.id, "user_id": released.user_id}),
                counts: json!({}),
            };
            (released, audit)
        })
        .await?;
        if changed {
            metrics::counter!("engram_legal_holds_total", "change" => "released").increment(1);
        }
        Ok(released)
    }

    pub async fn hold(&self, tenant: &str, id: Uuid) -> StoreResult<Option<Hold>> {
        self.erasure.hold(tenant, id).await
    }

    /// The tenant's active holds, of one user when given.
    pub async fn active_holds(&self, tenant: &str, user_id: Option<&str>) -> StoreResult<Vec<Hold>> {
        self.erasure.active_holds(tenant, user_id).await
    }

    pub async fn receipt(&self, tenant: &str, id: Uuid) -> StoreResult<Option<ErasureRecord>> {
        self.erasure.erasure(tenant, id).await
    }

    /// Works on every unfinished erasure, oldest first; returns how many
    /// finished (completed or failed). Does nothing while another worker holds the lease.
    pub async fn run_once(&self) -> anyhow::Result<usize> {
        let Some(_lease) = self.erasure.try_lease().await.context("taking the erasure lease")? else {
            return Ok(0);
        };
        let unfinished = self.erasure.unfinished(100).await.context("listing unfinished erasures")?;
        self.remember(&unfinished);
        let mut finished = 0;
        for mut record in unfinished {
            let started = Instant::now();
            match self.work(&mut record).await {
                Ok(()) => {
                    finished += 1;
                    metrics::counter!("engram_erasures_total", "state" => record.state.as_str()).increment(1);
                    metrics::histogram!("engram_erasure_duration_seconds").record(started.elapsed().as_secs_f64());
                    if record.state == ErasureState::Failed {
                        tracing::error!(
                            erasure = %record.id,
                            tenant = %record.tenant,
                            verification = ?record.receipt.verification,
                            "ERASURE FAILED: verification found the subject's records after deletion"
                        );
                    } else {
                        tracing::info!(erasure = %record.id, deleted = ?record.receipt.deleted, "erasure completed");
                    }
                }
                Err(e) => {
                    // No content in the error: store errors name stores and operations.
                    tracing::warn!(erasure = %record.id, error = %e, "erasure interrupted; retrying later");
                    record.state = ErasureState::Retrying;
                    record.attempts += 1;
                    record.last_error = Some(e.to_string());
                    record.updated_at = self.clock.now();
                    metrics::counter!("engram_erasures_total", "state" => "retrying").increment(1);
                    if let Err(e) = self.erasure.update_erasure(&record).await {
                        tracing::warn!(erasure = %record.id, error = %e, "could not save an erasure's state");
                    }
                }
            }
        }
        let left = self.erasure.unfinished(100).await.context("listing unfinished erasures")?;
        self.remember(&left);
        Ok(finished)
    }

    fn remember(&self, unfinished: &[ErasureRecord]) {
        self.erasing.set(unfinished.iter().map(|r| (r.tenant.clone(), r.subject.clone(), r.requested_at)));
        metrics::gauge!("engram_erasures_unfinished").set(unfinished.len() as f64);
    }

    /// One erasure, from its claims to its receipt.
    async fn work(&self, r: &mut ErasureRecord) -> StoreResult<()> {
        let (persistent, working_store) = self.stores();
        r.state = ErasureState::Running;
        r.updated_at = self.clock.now();
        self.erasure.update_erasure(r).await?;

        let claimed = self.erasure.claimed(&r.tenant, r.id).await?;
        let samples = self.erasure.sample_vectors(&r.tenant, r.id).await?;
        for tier in [Tier::Episodic, Tier::Semantic, Tier::Procedural] {
            let doomed: Vec<Doomed> = claimed
                .iter()
                .filter(|(t, _)| *t == tier)
                .map(|(_, id)| Doomed { tenant: r.tenant.clone(), id: *id })
                .collect();
            for chunk in doomed.chunks(self.batch) {
                self.sweep.delete(tier, chunk).await?;
            }
        }
        let mut deleted: Counts = r.receipt.deleted.clone();
        for (tier, n) in count_tiers(&claimed) {
            // Claimed rows are gone now, whoever deleted them (this worker,
            // or a retention sweep or delete in between).
            deleted.entry(persistent.to_string()).or_default().insert(tier.as_str().to_string(), n);
        }
        let skills: Vec<Uuid> = claimed.iter().filter(|(t, _)| *t == Tier::Procedural).map(|(_, id)| *id).collect();
        for id in &skills {
            self.skills.evict(&r.tenant, *id).await?;
        }
        let cache = if self.backend == "postgres" { "redis" } else { "process" };
        deleted.entry(cache.to_string()).or_default().insert("skill_cache_evictions".into(), skills.len() as u64);

        self.working.available()?;
        let entries: Vec<_> = self
            .transfer
            .working_entries(&r.tenant)
            .await?
            .into_iter()
            .filter(|m| r.subject.covers(m, r.requested_at))
            .collect();
        if !entries.is_empty() {
            self.working.remove(&r.tenant, &entries).await?;
        }
        Receipt::add(&mut deleted, working_store, "working", entries.len() as u64);
        r.receipt.deleted = deleted;
        // Saved now: a retry must not count these entries again.
        self.erasure.update_erasure(r).await?;

        r.receipt.purge = self.erasure.purge().await?;
        r.receipt.verification = self.erasure.verify(r, &claimed, &samples).await?;
        let now = self.clock.now();
        r.receipt.verified_at = Some(now);
        r.state = if r.receipt.survivors() == 0 { ErasureState::Completed } else { ErasureState::Failed };
        let entry = self
            .erasure
            .append_audit(&NewAuditEntry {
                tenant: r.tenant.clone(),
                at: now,
                actor: r.requested_by.clone(),
                operation: "erasure".into(),
                target: json!({"erasure_id": r.id, "selector": r.subject}),
                counts: json!({
                    "state": r.state.as_str(),
                    "deleted": r.receipt.deleted,
                    "survivors": r.receipt.survivors(),
                }),
            })
            .await?;
        r.receipt.audit_hash = Some(entry.hash);
        r.last_error = None;
        r.completed_at = Some(now);
        r.updated_at = now;
        self.erasure.update_erasure(r).await?;
        self.erasure.release(&r.tenant, r.id).await?;
        Ok(())
    }

    /// Works on erasures when woken and every `every`, until shutdown.
    pub async fn run(self: Arc<Self>, every: Duration, shutdown: CancellationToken) {
        loop {
            match self.run_once().await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(finished = n, "erasure worker pass"),
                Err(e) => tracing::warn!(error = ?e, "erasure worker pass failed; retrying later"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(every) => {}
            }
        }
    }

    /// Appends an audit entry for an operation outside erasure (an export,
    /// an import).
    pub async fn audit(&self, entry: &NewAuditEntry) -> StoreResult<AuditEntry> {
        self.erasure.append_audit(entry).await
    }

    /// Recomputes the audit chains (of one tenant, or of all) from the
    /// first entry; returns how many entries were checked and the first
    /// broken one.
    pub async fn verify_audit(&self, tenant: Option<&str>) -> StoreResult<(u64, Option<Broken>)> {
        verify_audit(self.erasure.as_ref(), tenant).await
    }
}

/// The first whole microsecond at or after `t`. Databases keep
/// microseconds, working memory keeps the clock's nanoseconds: a request
/// time rounded down would leave out an entry written in its microsecond.
fn up_to_micros(t: chrono::DateTime<chrono::Utc>) -> chrono::DateTime<chrono::Utc> {
    let micros = t.timestamp_micros() + i64::from(!t.timestamp_subsec_nanos().is_multiple_of(1000));
    chrono::DateTime::from_timestamp_micros(micros).unwrap_or(t)
}

fn count_tiers(claimed: &[(Tier, Uuid)]) -> BTreeMap<Tier, u64> {
    let mut out: BTreeMap<Tier, u64> = BTreeMap::new();
    for (t, _) in claimed {
        *out.entry(*t).or_default() += 1;
    }
    out
}

/// `Eraser::verify_audit` for callers with only the store (the CLI).
pub async fn verify_audit(store: &dyn Erasures, tenant: Option<&str>) -> StoreResult<(u64, Option<Broken>)> {
    let mut heads = BTreeMap::new();
    let (mut after, mut checked) = (0i64, 0u64);
    loop {
        let page = store.audit_page(tenant, after, 1000).await?;
        let Some(last) = page.last() else { return Ok((checked, None)) };
        after = last.seq;
        if let Some(broken) = verify_chain(&page, &mut heads) {
            checked += page.iter().take_while(|e| e.seq < broken.seq).count() as u64;
            return Ok((checked, Some(broken)));
        }
        checked += page.len() as u64;
    }
}
