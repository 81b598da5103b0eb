//! The local model's work queue: which texts the one model thread embeds
//! next, so that no caller can starve the others.
//!
//! - Queries (a search or context waiting) have a worker and a copy of the
//!   model of their own (`LocalEmbedder`), so they never wait for write work;
//!   a worker that is handed both would still embed queries first.
//! - Writes share what is left tenant by tenant: each step takes a small slice
//!   of work (at most `write_step_tokens` padded tokens, and always at least
//!   one window) from the next tenant in turn, so a tenant's 2 MB batch
//!   delays another tenant's writes by one slice a turn, never by the batch.
//! - Background work (re-embedding) runs only when nothing else waits.
//! - A caller that went away (timeout, disconnect) is dropped before its next
//!   slice: abandoned work stops at once.
//! - The queue is bounded (bytes of write text, count of queries): past the
//!   bound a caller is refused at once with `EmbedError::Busy` (503 with
//!   Retry-After) instead of waiting behind an ever longer queue. A job is
//!   always admitted into an empty queue, so the largest valid batch is
//!   never refused by an idle server.
//!
//! Must not: embed on an async worker thread, or hold a caller's work after
//! the caller is gone.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::EmbedError;
use super::local::{MAX_BATCH_TOKENS, MiniLm, Sums, group_len};

/// Who waits for an embedding; decides its place in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane<'a> {
    /// A search or context request: served before any write.
    Query,
    /// A write (or patch) of this tenant: writes share the rest fairly.
    Write { tenant: &'a str },
    /// Background upkeep (re-embedding): only when nothing else waits.
    Background,
}

/// A job's class, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Class {
    Query,
    Write(String),
    Background,
}

pub(super) type Reply = oneshot::Sender<Result<Vec<Vec<f32>>, EmbedError>>;

/// Texts of one caller and where their vectors go.
pub(super) struct Job {
    pub texts: Vec<String>,
    pub class: Class,
    pub reply: Reply,
    /// What the job holds of the queue's bound, given back when it leaves.
    pub held: Held,
}

/// A job's share of the queue's bounds.
#[derive(Debug, Clone, Copy)]
pub(super) enum Held {
    Query,
    WriteBytes(usize),
    Nothing,
}

/// What is queued, shared by the callers (who are admitted or refused
/// against it) and the worker (which gives it back as jobs leave).
#[derive(Debug, Default)]
pub(super) struct Load {
    pub queries: AtomicUsize,
    pub write_bytes: AtomicUsize,
    /// Forward passes run, and sequences (windows) embedded, since start.
    pub steps: AtomicUsize,
    pub sequences: AtomicUsize,
}

impl Load {
    pub(super) fn release(&self, held: Held) {
        match held {
            Held::Query => {
                self.queries.fetch_sub(1, Ordering::AcqRel);
            }
            Held::WriteBytes(n) => {
                self.write_bytes.fetch_sub(n, Ordering::AcqRel);
            }
            Held::Nothing => {}
        }
    }
}

/// The queue's settings (`embedding.local.*`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Settings {
    /// How long the first query of a batch waits for others, while queries overlap.
    pub window: Duration,
    /// Most sequences in one forward pass.
    pub max_batch: usize,
    /// Most padded tokens of write work in one step.
    pub write_step_tokens: usize,
}

/// A job being embedded: its windows, longest first, and how far it got.
struct Plan {
    job: Job,
    seqs: Vec<(usize, Vec<u32>)>,
    next: usize,
    sums: Sums,
}

impl Plan {
    fn rest(&self) -> &[(usize, Vec<u32>)] {
        &self.seqs[self.next..]
    }

    fn done(&self) -> bool {
        self.next == self.seqs.len()
    }

    fn abandoned(&self) -> bool {
        self.job.reply.is_closed()
    }
}

#[derive(Default)]
struct Queues {
    queries: VecDeque<Plan>,
    /// Tenants with write work, served in turn; each tenant's jobs in order.
    tenants: VecDeque<(String, VecDeque<Plan>)>,
    background: VecDeque<Plan>,
}

impl Queues {
    fn is_empty(&self) -> bool {
        self.queries.is_empty() && self.tenants.is_empty() && self.background.is_empty()
    }

    fn push(&mut self, plan: Plan) {
        match &plan.job.class {
            Class::Query => self.queries.push_back(plan),
            Class::Background => self.background.push_back(plan),
            Class::Write(tenant) => match self.tenants.iter_mut().find(|(t, _)| t == tenant) {
                Some((_, jobs)) => jobs.push_back(plan),
                None => self.tenants.push_back((tenant.clone(), VecDeque::from([plan]))),
            },
        }
    }

    /// Drops the jobs whose callers went away.
    fn drop_abandoned(&mut self, load: &Load) {
        let mut keep = |p: &Plan| {
            let gone = p.abandoned();
            if gone {
                load.release(p.job.held);
            }
            !gone
        };
        self.queries.retain(&mut keep);
        self.background.retain(&mut keep);
        for (_, jobs) in &mut self.tenants {
            jobs.retain(&mut keep);
        }
        self.tenants.retain(|(_, jobs)| !jobs.is_empty());
    }

    /// Sequences waiting in query jobs.
    fn query_sequences(&self) -> usize {
        self.queries.iter().map(|p| p.rest().len()).sum()
    }

    /// The plans of the next step, each with how many of its sequences it
    /// contributes, in the order their sequences are passed to the model.
    fn next_step(&mut self, settings: &Settings) -> Vec<(Plan, usize)> {
        let mut step = Step::new(settings.max_batch);
        if !self.queries.is_empty() {
            // Queries, first come first served, as many as one pass holds.
            while let Some(plan) = self.queries.pop_front() {
                let n = step.take(plan.rest(), MAX_BATCH_TOKENS);
                let full = n < plan.rest().len();
                step.plans.push((plan, n));
                if full {
                    break;
                }
            }
        } else if !self.tenants.is_empty() {
            // One slice of one job per tenant, tenants in turn, until the
            // step's token budget is spent.
            for _ in 0..self.tenants.len() {
                let Some((tenant, mut jobs)) = self.tenants.pop_front() else { break };
                let Some(plan) = jobs.pop_front() else { continue };
                let n = step.take(plan.rest(), settings.write_step_tokens);
                if n == 0 {
                    // Not served this step: it keeps its place at the head of the ring.
                    jobs.push_front(plan);
                    self.tenants.push_front((tenant, jobs));
                    break;
                }
                step.plans.push((plan, n));
                step.returning.push((tenant, jobs));
            }
        } else if let Some(plan) = self.background.pop_front() {
            let n = step.take(plan.rest(), settings.write_step_tokens);
            step.plans.push((plan, n));
        }
        // Tenants go to the back of the ring, in the order they were served.
        self.tenants.extend(step.returning.drain(..));
        step.plans
    }

    /// Puts a job that is not done back where it was: at the front of its queue.
    fn put_back(&mut self, plan: Plan) {
        match &plan.job.class {
            Class::Query => self.queries.push_front(plan),
            Class::Background => self.background.push_front(plan),
            Class::Write(tenant) => match self.tenants.iter_mut().find(|(t, _)| t == tenant) {
                Some((_, jobs)) => jobs.push_front(plan),
                None => self.tenants.push_back((tenant.clone(), VecDeque::from([plan]))),
            },
        }
    }
}

/// The sequences one forward pass takes, gathered across jobs.
struct Step {
    plans: Vec<(Plan, usize)>,
    returning: Vec<(String, VecDeque<Plan>)>,
    max_batch: usize,
    count: usize,
    longest: usize,
    shortest: usize,
    tokens: usize,
}

impl Step {
    fn new(max_batch: usize) -> Step {
        Step {
            plans: Vec::new(),
            returning: Vec::new(),
            max_batch,
            count: 0,
            longest: 0,
            shortest: usize::MAX,
            tokens: 0,
        }
    }

    /// How many of `rest` (longest first) join the pass within `budget`
    /// padded tokens; the first sequence of a pass always does.
    fn take(&mut self, rest: &[(usize, Vec<u32>)], budget: usize) -> usize {
        if self.count == 0 {
            let n = group_len(rest.iter().map(|(_, ids)| ids.len()), self.max_batch, budget);
            if let Some((_, first)) = rest.first() {
                self.longest = first.len();
                self.shortest = rest[n - 1].1.len();
                self.tokens = budget;
            }
            self.count = n;
            return n;
        }
        let mut n = 0;
        for (_, ids) in rest {
            let (longest, shortest) = (self.longest.max(ids.len()), self.shortest.min(ids.len()));
            // The pass is padded to its longest sequence; keep padding under a
            // quarter of a sequence and the padded total within the budget.
            if self.count + n + 1 > self.max_batch || (self.count + n + 1) * longest > self.tokens.min(budget) {
                break;
            }
            if shortest * 4 < longest * 3 {
                break;
            }
            self.longest = longest;
            self.shortest = shortest;
            n += 1;
        }
        self.count += n;
        n
    }
}

/// Turns a job into a plan (tokenising its texts), or answers it at once.
fn plan(model: &MiniLm, job: Job, load: &Load) -> Option<Plan> {
    let texts: Vec<&str> = job.texts.iter().map(String::as_str).collect();
    match model.sequences(&texts, false) {
        Ok(seqs) if !seqs.is_empty() => {
            let sums = Sums::new(texts.len());
            Some(Plan { job, seqs, next: 0, sums })
        }
        Ok(_) => {
            load.release(job.held);
            let _ = job.reply.send(Ok(Vec::new()));
            None
        }
        Err(e) => {
            load.release(job.held);
            let _ = job.reply.send(Err(EmbedError::BadResponse(format!("the local model failed: {e}"))));
            None
        }
    }
}

/// Embeds queued jobs slice by slice until every sender is gone.
pub(super) fn worker(
    model: &MiniLm,
    pool: &rayon::ThreadPool,
    rx: &mpsc::Receiver<Job>,
    settings: Settings,
    load: Arc<Load>,
) {
    let mut queues = Queues::default();
    // Whether queries are overlapping: the last query pass held several, or
    // more were queued behind the first. Only then is waiting for company
    // worth it; a lone query (concurrency 1) is embedded at once.
    let mut overlapping = false;
    loop {
        if queues.is_empty() {
            match rx.recv() {
                Ok(job) => queues.extend(plan(model, job, &load)),
                Err(_) => return,
            }
        }
        while let Ok(job) = rx.try_recv() {
            queues.extend(plan(model, job, &load));
        }
        if overlapping && !queues.queries.is_empty() {
            let deadline = Instant::now() + settings.window;
            while queues.query_sequences() < settings.max_batch {
                match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    Ok(job) => queues.extend(plan(model, job, &load)),
                    Err(_) => break,
                }
            }
        }
        queues.drop_abandoned(&load);
        if queues.queries.is_empty() && (!queues.tenants.is_empty() || !queues.background.is_empty()) {
            yield_to_queries(&load);
        }
        let step = queues.next_step(&settings);
        if step.is_empty() {
            continue;
        }
        if step[0].0.job.class == Class::Query {
            overlapping = step.len() > 1;
        }
        let seqs: Vec<&[u32]> =
            step.iter().flat_map(|(p, n)| p.rest()[..*n].iter().map(|(_, ids)| ids.as_slice())).collect();
        let count = seqs.len();
        // A panic inside the runtime must cost this step's jobs, not the worker.
        let result =
            pool.install(|| std::panic::catch_unwind(AssertUnwindSafe(|| model.forward(seqs.iter().copied()))));
        drop(seqs);
        load.steps.fetch_add(1, Ordering::AcqRel);
        load.sequences.fetch_add(count, Ordering::AcqRel);
        let failure = match result {
            Ok(Ok(vectors)) => {
                let mut vectors = vectors.into_iter();
                let mut unfinished = Vec::new();
                for (mut plan, n) in step {
                    for k in plan.next..plan.next + n {
                        let text = plan.seqs[k].0;
                        if let Some(v) = vectors.next() {
                            plan.sums.add(text, &v);
                        }
                    }
                    plan.next += n;
                    if plan.done() {
                        load.release(plan.job.held);
                        // The caller may have gone meanwhile; nothing to do then.
                        let _ = plan.job.reply.send(Ok(plan.sums.finish()));
                    } else {
                        unfinished.push(plan);
                    }
                }
                // Back to the front of their queues, in their order.
                for plan in unfinished.into_iter().rev() {
                    queues.put_back(plan);
                }
                continue;
            }
            Ok(Err(e)) => {
                tracing::error!(error = format!("{e:#}"), sequences = count, "local embedding failed");
                format!("the local model failed: {e}")
            }
            Err(_) => {
                tracing::error!(sequences = count, "local embedding panicked");
                "the local model panicked".to_string()
            }
        };
        for (plan, _) in step {
            load.release(plan.job.held);
            let _ = plan.job.reply.send(Err(EmbedError::BadResponse(failure.clone())));
        }
    }
}

/// Write work waits while queries are being embedded elsewhere (on the query
/// worker), up to a few milliseconds: on a small machine both workers and
/// the database share the cores, and a search should not share its core
/// with a write's forward pass.
fn yield_to_queries(load: &Load) {
    let until = Instant::now() + QUERY_YIELD;
    while load.queries.load(Ordering::Acquire) > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// The longest a write step waits for queries in flight.
const QUERY_YIELD: Duration = Duration::from_millis(20);

impl Extend<Plan> for Queues {
    fn extend<I: IntoIterator<Item = Plan>>(&mut self, plans: I) {
        for plan in plans {
            self.push(plan);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::Lane;
    use crate::config::LocalConfig;
    use crate::embed::local::LocalEmbedder;
    use crate::embed::{EmbedError, Embedder};

    fn embedder(tweak: impl FnOnce(&mut LocalConfig)) -> std::sync::Arc<LocalEmbedder> {
        let mut config = LocalConfig {
            model_dir: crate::embed::local::tests::model_dir().to_string_lossy().into_owned(),
            ..LocalConfig::default()
        };
        tweak(&mut config);
        std::sync::Arc::new(LocalEmbedder::new(&config).expect("the model loads"))
    }

    /// Texts of about `windows` model windows each: distinct words, so the
    /// tokenizer makes one token of each.
    fn long_texts(count: usize, windows: usize) -> Vec<String> {
        const WORDS: [&str; 12] = [
            "river", "apple", "green", "house", "music", "winter", "table", "garden", "light", "paper", "stone",
            "bread",
        ];
        (0..count)
            .map(|i| (0..windows * 230).map(|w| WORDS[(i + w * 5) % WORDS.len()]).collect::<Vec<_>>().join(" "))
            .collect()
    }

    #[tokio::test]
    async fn a_query_is_embedded_before_a_large_write_finishes() {
        let e = embedder(|_| {});
        let texts = long_texts(12, 8);
        let writer = e.clone();
        let write = tokio::spawn(async move { writer.embed_in(&texts, Lane::Write { tenant: "t1" }).await });
        // Let the write start.
        while e.load.write_bytes.load(Ordering::Acquire) == 0 || e.load.steps.load(Ordering::Acquire) == 0 {
            tokio::task::yield_now().await;
        }
        let query = e.embed_in(&["where is the lemon tree".to_string()], Lane::Query).await.unwrap();
        assert_eq!(query.len(), 1);
        assert!(!write.is_finished(), "the query waited for the whole write");
        assert_eq!(write.await.unwrap().unwrap().len(), 12);
    }

    #[tokio::test]
    async fn tenants_take_turns_so_a_small_write_passes_a_large_one() {
        let e = embedder(|_| {});
        let big = long_texts(12, 8);
        let writer = e.clone();
        let large = tokio::spawn(async move { writer.embed_in(&big, Lane::Write { tenant: "big" }).await });
        while e.load.steps.load(Ordering::Acquire) == 0 {
            tokio::task::yield_now().await;
        }
        let small = long_texts(1, 2);
        assert_eq!(e.embed_in(&small, Lane::Write { tenant: "small" }).await.unwrap().len(), 1);
        assert!(!large.is_finished(), "the small tenant waited for the large batch");
        large.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn work_of_a_caller_that_went_away_is_dropped() {
        let e = embedder(|_| {});
        let texts = long_texts(12, 8);
        let total_windows = 12 * 8;
        let writer = e.clone();
        let write = tokio::spawn(async move { writer.embed_in(&texts, Lane::Write { tenant: "t1" }).await });
        while e.load.steps.load(Ordering::Acquire) < 2 {
            tokio::task::yield_now().await;
        }
        write.abort();
        // The job leaves the queue at the worker's next look, and the bytes it held are given back.
        while e.load.write_bytes.load(Ordering::Acquire) != 0 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let done = e.load.sequences.load(Ordering::Acquire);
        assert!(done < total_windows / 2, "{done} of {total_windows} windows embedded for nobody");
        // And the worker serves the next caller.
        assert_eq!(e.embed_in(&["after".to_string()], Lane::Query).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_full_queue_refuses_writes_but_an_empty_one_takes_any() {
        let e = embedder(|c| c.max_queued_write_bytes = 4096);
        // Far over the bound, but the queue is empty: admitted.
        let big = long_texts(4, 4);
        let writer = e.clone();
        let first = tokio::spawn(async move { writer.embed_in(&big, Lane::Write { tenant: "t1" }).await });
        while e.load.write_bytes.load(Ordering::Acquire) == 0 {
            tokio::task::yield_now().await;
        }
        let refused = e.embed_in(&["one more".to_string()], Lane::Write { tenant: "t2" }).await;
        assert!(matches!(refused, Err(EmbedError::Busy { retry_after_secs: 2 })), "{refused:?}");
        // Queries have their own bound.
        assert_eq!(e.embed_in(&["a query".to_string()], Lane::Query).await.unwrap().len(), 1);
        assert_eq!(first.await.unwrap().unwrap().len(), 4);
        // Drained: writes are admitted again.
        assert_eq!(e.embed_in(&["one more".to_string()], Lane::Write { tenant: "t2" }).await.unwrap().len(), 1);
    }
}
