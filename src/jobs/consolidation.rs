//! Consolidation: turns an agent's episodes, once they are
//! `consolidation.min_age_secs` old, into summaries and facts
//! (`domain::consolidate`), written through the ordinary write path.
//!
//! Work comes as jobs: asked for through the API (`POST
//! /v1/consolidation`) or made by the schedule for the agents with the
//! largest backlog. Jobs live in the database, so any replica takes a
//! queued one and one left running by a process that died is taken again.
//! A run holds a per-agent lock (a Postgres advisory lock; in-process on the
//! embedded backend), so one agent is consolidated by one run at a time.
//! Each group of episodes is written, and its episodes marked consolidated,
//! in one transaction: a crash loses at most the group in flight, which the
//! next run takes again.
//!
//! Must not: decide what a summary or a fact is (`domain::consolidate`), or
//! hold SQL (`store::consolidate`).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::clock::Clock;
use crate::config::ConsolidationConfig;
use crate::domain::Tier;
use crate::domain::consolidate::{self, Job, JobReport, JobState, SCHEDULE_ACTOR};
use crate::llm::{Llm, LlmError, Task};
use crate::service::{MemoryService, ServiceError};
use crate::store::StoreError;
use crate::store::consolidate::Consolidations;
use crate::store::write::GroupEffects;

/// A job marked running for this long without finishing is taken to have
/// lost its process, and is run again.
const STALE_AFTER_SECS: i64 = 600;

/// How long a job waits for its agent's lock (held by another run) before
/// it goes back to the queue.
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Service(#[from] ServiceError),
    #[error(transparent)]
    Model(#[from] LlmError),
}

impl From<StoreError> for RunError {
    fn from(e: StoreError) -> Self {
        RunError::Service(e.into())
    }
}

/// What a run left for a later one: the episodes of groups whose model
/// answers stayed unusable, and the last such error.
#[derive(Default)]
struct Left {
    episodes: std::collections::HashSet<Uuid>,
    unusable: Option<LlmError>,
}

pub struct Consolidator {
    pub service: Arc<MemoryService>,
    /// The chat model, when one is configured; the rule-based path otherwise.
    pub llm: Option<Arc<dyn Llm>>,
    pub store: Arc<dyn Consolidations>,
    pub clock: Arc<dyn Clock>,
    pub config: ConsolidationConfig,
    /// Wakes the worker when a job is queued.
    pub wake: Notify,
}

impl Consolidator {
    fn min_age(&self) -> chrono::Duration {
        chrono::Duration::seconds(self.config.min_age_secs as i64)
    }

    fn job(&self, tenant: &str, agent_id: &str, by: &str, now: DateTime<Utc>) -> Job {
        Job {
            id: Uuid::now_v7(),
            tenant: tenant.to_string(),
            agent_id: agent_id.to_string(),
            state: JobState::Queued,
            requested_by: by.to_string(),
            requested_at: now,
            cutoff: now - self.min_age(),
            started_at: None,
            finished_at: None,
            report: JobReport::default(),
            error: None,
        }
    }

    /// Queues a run of one agent over every episode ingested at least
    /// `min_age_secs` before now.
    pub async fn request(&self, tenant: &str, agent_id: &str, by: &str) -> Result<Job, StoreError> {
        let job = self.job(tenant, agent_id, by, self.clock.now());
        self.store.insert_job(&job).await?;
        metrics::counter!("engram_consolidation_jobs_total", "state" => "queued").increment(1);
        self.wake.notify_one();
        Ok(job)
    }

    pub async fn find(&self, tenant: &str, id: Uuid) -> Result<Option<Job>, StoreError> {
        self.store.job(tenant, id).await
    }

    /// Runs each agent with a backlog, the largest first, skipping those
    /// another run holds, and reports the backlog as metrics. Each run is
    /// recorded as a job (`requested_by` = `schedule`). Returns how many
    /// agents this pass consolidated.
    pub async fn schedule(&self) -> Result<usize, StoreError> {
        let now = self.clock.now();
        let backlog = self.store.backlog(now - self.min_age(), now, 1000).await?;
        let total: u64 = backlog.iter().map(|b| b.episodes).sum();
        let oldest = backlog.iter().map(|b| b.oldest).min().map_or(0.0, |t| (now - t).num_seconds().max(0) as f64);
        metrics::gauge!("engram_consolidation_backlog_episodes").set(total as f64);
        metrics::gauge!("engram_consolidation_backlog_oldest_seconds").set(oldest);
        if total > self.config.backlog_alert_episodes {
            tracing::warn!(
                episodes = total,
                alert = self.config.backlog_alert_episodes,
                "the consolidation backlog is over consolidation.backlog_alert_episodes"
            );
        }
        let mut ran = 0;
        for b in &backlog {
            let mut job = self.job(&b.tenant, &b.agent_id, SCHEDULE_ACTOR, now);
            job.started_at = Some(self.clock.now());
            let mut report = JobReport::default();
            let outcome = match self.consolidate(&job, &mut report).await {
                Ok(false) => continue,
                Ok(true) => Ok(()),
                Err(e) => Err(e),
            };
            job.report = report;
            self.finish(&mut job, outcome);
            self.store.insert_job(&job).await?;
            ran += 1;
        }
        Ok(ran)
    }

    /// Records how a run ended in its job (its report holds what was
    /// written, also when a later group failed).
    fn finish(&self, job: &mut Job, outcome: Result<(), RunError>) {
        job.finished_at = Some(self.clock.now());
        match outcome {
            Ok(()) => job.state = JobState::Completed,
            Err(e) => {
                tracing::error!(error = ?e, job = %job.id, "consolidation failed; its episodes wait for the next run");
                job.state = JobState::Failed;
                job.error = Some(match e {
                    RunError::Model(e) => e.to_string(),
                    RunError::Service(ServiceError::Embedding(_)) => "the embedder was unavailable".into(),
                    RunError::Service(ServiceError::Store(StoreError::Unavailable { what, .. })) => {
                        format!("{what} was unavailable")
                    }
                    RunError::Service(_) => "an internal error; the server's log has it under the job id".into(),
                });
            }
        }
        metrics::counter!("engram_consolidation_jobs_total", "state" => job.state.as_str()).increment(1);
    }

    /// Runs queued jobs until none is left; returns how many ran. Tests call
    /// this; the worker loop calls it when woken.
    pub async fn run_queued(&self) -> Result<usize, StoreError> {
        let mut ran = 0;
        loop {
            let now = self.clock.now();
            let stale = now - chrono::Duration::seconds(STALE_AFTER_SECS);
            let Some(job) = self.store.claim_job(now, stale).await? else {
                return Ok(ran);
            };
            self.run_job(job).await?;
            ran += 1;
        }
    }

    async fn run_job(&self, mut job: Job) -> Result<(), StoreError> {
        let started = std::time::Instant::now();
        let mut report = JobReport::default();
        let outcome = loop {
            match self.consolidate(&job, &mut report).await {
                Ok(true) => break Ok(()),
                Ok(false) if started.elapsed() < LOCK_WAIT => tokio::time::sleep(Duration::from_millis(200)).await,
                // Another run kept the agent: this one goes back to the queue.
                Ok(false) => {
                    job.state = JobState::Queued;
                    job.started_at = None;
                    return self.store.update_job(&job).await;
                }
                Err(e) => break Err(e),
            }
        };
        job.report = report;
        self.finish(&mut job, outcome);
        self.store.update_job(&job).await
    }

    /// One run over the job's agent, adding what it writes to `report`:
    /// false when another run holds the agent.
    async fn consolidate(&self, job: &Job, report: &mut JobReport) -> Result<bool, RunError> {
        let Some(_lease) = self.store.try_lock(&job.tenant, &job.agent_id).await? else {
            return Ok(false);
        };
        // Batch after batch until every waiting episode up to the cutoff is
        // taken; a batch that took nothing (its groups changed under it, or
        // every group in it was left) ends the run, and the next run reads
        // them again. Episodes of a group left in this run are not read
        // again by it.
        let mut left = Left::default();
        loop {
            let now = self.clock.now();
            let limit = self.config.batch_size;
            let mut episodes = self.store.pending(&job.tenant, &job.agent_id, job.cutoff, now, limit).await?;
            let read = episodes.len();
            episodes.retain(|m| !left.episodes.contains(&m.id));
            let before = report.episodes;
            self.consolidate_batch(job, &episodes, report, &mut left).await?;
            if read < limit || report.episodes == before {
                return match left.unusable {
                    Some(e) => Err(RunError::Model(e)),
                    None => Ok(true),
                };
            }
        }
    }

    /// Consolidates one batch of episodes, group by group, into `report`.
    async fn consolidate_batch(
        &self,
        job: &Job,
        episodes: &[crate::domain::Memory],
        report: &mut JobReport,
        left: &mut Left,
    ) -> Result<(), RunError> {
        for group in consolidate::groups(episodes, self.config.group_size) {
            let drafts = match &self.llm {
                Some(llm) => match self.model_drafts(llm.as_ref(), job, &group).await {
                    Ok(drafts) => drafts,
                    // The answers for this group stayed unusable (a small
                    // model that runs on for these turns, say): the group
                    // waits for a later run and the others go on, so one
                    // such group cannot hold up the agent's consolidation
                    // for good. A model that is down or a spent budget ends
                    // the run: the next group would fail the same way.
                    Err(RunError::Model(e @ LlmError::BadAnswer(_))) => {
                        tracing::warn!(job = %job.id, episodes = group.episodes.len(), error = %e,
                            "a group's model answers stayed unusable; it waits for a later run");
                        metrics::counter!("engram_consolidation_groups_failed_total").increment(1);
                        report.groups_failed += 1;
                        left.episodes.extend(group.episodes.iter().map(|m| m.id));
                        left.unusable = Some(e);
                        continue;
                    }
                    Err(e) => return Err(e),
                },
                None => {
                    let mut drafts = Vec::new();
                    let sentences = self.config.summary_sentences;
                    drafts.extend(consolidate::summary_draft(&job.agent_id, &group, sentences, job.id));
                    for episode in &group.episodes {
                        drafts.extend(consolidate::fact_drafts(&job.agent_id, episode, job.id));
                    }
                    drafts
                }
            };
            let sources: Vec<Uuid> = group.episodes.iter().map(|m| m.id).collect();
            let skills = consolidate::skill_outcomes(&group);
            let effects = GroupEffects {
                agent_id: &job.agent_id,
                sources: &sources,
                policy: self.config.source_policy(),
                skills: &skills,
            };
            let merge = self.config.merge_cosine;
            let done = match self.service.write_consolidated(&job.tenant, drafts, &effects, merge).await {
                Ok(done) => done,
                // Its episodes changed meanwhile (erased, expired, taken by
                // another run): left for the next run to read again.
                Err(ServiceError::Store(StoreError::Conflict(_))) => continue,
                Err(e) => return Err(e.into()),
            };
            report.episodes += sources.len() as u64;
            report.skills_updated += done.skills.len() as u64;
            report.episodes_deleted += done.sources_deleted;
            report.episodes_shortened += done.sources_shortened;
            metrics::counter!("engram_consolidated_episodes_total").increment(sources.len() as u64);
            metrics::counter!("engram_consolidation_records_total", "kind" => "skill_updated")
                .increment(done.skills.len() as u64);
            metrics::counter!("engram_consolidation_records_total", "kind" => "source_deleted")
                .increment(done.sources_deleted);
            metrics::counter!("engram_consolidation_records_total", "kind" => "source_shortened")
                .increment(done.sources_shortened);
            for w in done.written {
                let kind = match (w.memory.tier, w.deduplicated, w.memory.contested_by.is_some()) {
                    (Tier::Episodic, ..) => {
                        report.summaries += 1;
                        "summary"
                    }
                    (_, true, _) => {
                        report.facts_deduplicated += 1;
                        "fact_deduplicated"
                    }
                    (_, false, true) => {
                        report.facts_candidates += 1;
                        "fact_candidate"
                    }
                    (_, false, false) => {
                        report.facts += 1;
                        "fact"
                    }
                };
                metrics::counter!("engram_consolidation_records_total", "kind" => kind).increment(1);
                if !w.deduplicated {
                    report.memory_ids.push(w.memory.id);
                }
            }
        }
        Ok(())
    }

    /// A group's summary (when it has two episodes or more) and facts, by
    /// the model. Any failure, after the client's retries, stops the run
    /// before the group is written: its episodes wait for the next run.
    async fn model_drafts(
        &self,
        llm: &dyn Llm,
        job: &Job,
        group: &consolidate::Group<'_>,
    ) -> Result<Vec<crate::domain::draft::Draft>, RunError> {
        let input = consolidate::model_input(group);
        let mut drafts = Vec::new();
        if group.episodes.len() >= 2 {
            let task = Task {
                name: "summary",
                instructions: consolidate::SUMMARY_INSTRUCTIONS,
                input: input.clone(),
                schema: consolidate::summary_schema(),
            };
            let answer = llm.structured(&job.tenant, &task, &|v| consolidate::parse_summary(v).map(|_| ())).await?;
            let text = consolidate::parse_summary(&answer).map_err(LlmError::BadAnswer)?;
            drafts.push(consolidate::model_summary_draft(&job.agent_id, group, text, job.id, llm.model()));
        }
        let n = group.episodes.len();
        let task = Task {
            name: "facts",
            instructions: consolidate::FACTS_INSTRUCTIONS,
            input,
            schema: consolidate::facts_schema(n),
        };
        let answer = llm.structured(&job.tenant, &task, &|v| consolidate::parse_facts(v, n).map(|_| ())).await?;
        let (facts, rejected) = consolidate::parse_facts(&answer, n).map_err(LlmError::BadAnswer)?;
        if rejected > 0 {
            metrics::counter!("engram_consolidation_model_facts_rejected_total").increment(rejected as u64);
        }
        drafts.extend(consolidate::model_fact_drafts(&job.agent_id, group, facts, job.id, llm.model()));
        Ok(drafts)
    }

    /// The worker: runs queued jobs when woken or every few seconds, and
    /// queues the scheduled passes every `interval_secs` (when not 0).
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let every = Duration::from_secs(self.config.interval_secs.max(1));
        let mut schedule = tokio::time::interval(every);
        schedule.tick().await;
        let mut poll = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.wake.notified() => {}
                _ = poll.tick() => {}
                _ = schedule.tick(), if self.config.interval_secs > 0 => {
                    // Stopped at shutdown like the jobs below.
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        outcome = self.schedule() => match outcome {
                            Ok(n) => tracing::info!(agents = n, "consolidation scheduled"),
                            Err(e) => tracing::error!(error = ?e, "could not schedule consolidation"),
                        },
                    }
                }
            }
            // A shutdown does not wait for a run (a slow model can take
            // minutes): the group in flight rolls back with its transaction,
            // and its job, left `running`, is taken again once it is stale.
            tokio::select! {
                _ = shutdown.cancelled() => return,
                outcome = self.run_queued() => {
                    if let Err(e) = outcome {
                        tracing::error!(error = ?e, "consolidation jobs could not be run; retrying");
                    }
                }
            }
        }
    }
}
