//! The load generator: every query once through `/v1/memories/search` or
//! `/v1/context` from N concurrent clients, each request's latency (send to
//! last body byte) and the server's own `timings` recorded.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

use crate::load::session_of;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Search,
    Context,
    /// One episodic memory written (`POST /v1/memories`), only in mixed runs.
    Write,
    /// One write, six searches and three contexts in every ten requests.
    Mixed,
}

impl Endpoint {
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Search => "search",
            Endpoint::Context => "context",
            Endpoint::Write => "write",
            Endpoint::Mixed => "mixed",
        }
    }

    fn path(self) -> &'static str {
        match self {
            Endpoint::Search => "/v1/memories/search",
            Endpoint::Context => "/v1/context",
            Endpoint::Write | Endpoint::Mixed => "/v1/memories",
        }
    }

    /// What the `i`th request of a run does.
    pub fn op(self, i: usize) -> Endpoint {
        match (self, i % 10) {
            (Endpoint::Mixed, 0) => Endpoint::Write,
            (Endpoint::Mixed, 1..=6) => Endpoint::Search,
            (Endpoint::Mixed, _) => Endpoint::Context,
            (e, _) => e,
        }
    }
}

/// Metadata of the memories a mixed run writes, so the benchmark can delete
/// them after it and the next run starts from the loaded rows.
pub const MIXED_MARK: &str = "mixed-run";

pub const TOP_K: usize = 20;
pub const MAX_CONTEXT_TOKENS: usize = 8_000;

pub struct Query {
    pub text: String,
    pub agent: String,
}

/// The response `timings` fields, in this order.
pub const LEGS: [&str; 7] =
    ["embedding_ms", "vector_ms", "text_ms", "neighbours_ms", "working_ms", "scoring_ms", "total_ms"];
/// Tiers as they appear in results, in this order.
pub const TIERS: [&str; 4] = ["working", "episodic", "semantic", "procedural"];

/// One answered request.
pub struct Sample {
    pub query: usize,
    /// What it did (in a mixed run, one of write, search and context).
    pub op: Endpoint,
    pub latency_us: u64,
    pub timings: [f64; 7],
    /// Search: results returned; context: memories packed.
    pub items: usize,
    pub per_tier: [usize; 4],
    pub tokens_used: usize,
}

pub struct Run {
    pub endpoint: Endpoint,
    pub concurrency: usize,
    pub samples: Vec<Sample>,
    pub errors: usize,
    pub first_error: Option<String>,
    pub wall: Duration,
    /// The machine's 1-minute load average at the start and the end of the
    /// run: anything well above the clients' concurrency + 1 means other
    /// work shared the cores.
    pub load: (f64, f64),
}

fn load_avg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

pub fn body(endpoint: Endpoint, i: usize, q: &Query) -> Value {
    let session = session_of(&q.agent);
    match endpoint.op(i) {
        Endpoint::Write | Endpoint::Mixed => json!({"memories": [{
            "agent_id": q.agent, "session_id": session, "tier": "episodic",
            "content": format!("{} (noted in request {i})", q.text), "metadata": {"bench": MIXED_MARK},
        }]}),
        Endpoint::Search => json!({"agent_id": q.agent, "session_id": session, "query": q.text, "top_k": TOP_K}),
        Endpoint::Context => json!({
            "agent_id": q.agent, "session_id": session, "query": q.text, "max_context_tokens": MAX_CONTEXT_TOKENS,
        }),
    }
}

fn tier_index(tier: &str) -> Option<usize> {
    TIERS.iter().position(|t| *t == tier)
}

/// Reads what the benchmark reports from a 200 answer.
pub fn sample_of(endpoint: Endpoint, query: usize, latency: Duration, answer: &Value) -> anyhow::Result<Sample> {
    let endpoint = endpoint.op(query);
    let latency_us = latency.as_micros() as u64;
    if endpoint == Endpoint::Write {
        let written = answer["memories"].as_array().map_or(0, Vec::len);
        anyhow::ensure!(written == 1, "a write answered {answer}");
        let (timings, per_tier) = ([0.0; 7], [0; 4]);
        return Ok(Sample { query, op: endpoint, latency_us, timings, items: 1, per_tier, tokens_used: 0 });
    }
    let mut timings = [0.0; 7];
    for (slot, leg) in timings.iter_mut().zip(LEGS) {
        *slot = answer["timings"][leg].as_f64().with_context(|| format!("no timings.{leg} in the answer"))?;
    }
    let mut per_tier = [0; 4];
    let (items, tokens_used) = match endpoint {
        Endpoint::Search => {
            let results = answer["results"].as_array().context("no results array")?;
            for r in results {
                if let Some(i) = r["memory"]["tier"].as_str().and_then(tier_index) {
                    per_tier[i] += 1;
                }
            }
            (results.len(), 0)
        }
        _ => {
            let sections = answer["sections"].as_object().context("no sections object")?;
            for (tier, items) in sections {
                if let Some(i) = tier_index(tier) {
                    per_tier[i] += items.as_array().map_or(0, Vec::len);
                }
            }
            let used = answer["usage"]["tokens_used"].as_u64().context("no usage.tokens_used")?;
            (per_tier.iter().sum(), used as usize)
        }
    };
    Ok(Sample { query, op: endpoint, latency_us, timings, items, per_tier, tokens_used })
}

/// Sends every query once, from `concurrency` clients sharing one counter.
pub async fn run(
    client: &reqwest::Client,
    base: &str,
    endpoint: Endpoint,
    concurrency: usize,
    queries: Arc<Vec<Query>>,
) -> anyhow::Result<Run> {
    let next = Arc::new(AtomicUsize::new(0));
    let load_start = load_avg();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let (client, base, next, queries) = (client.clone(), base.to_string(), next.clone(), queries.clone());
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut errors = 0;
            let mut first_error = None;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(q) = queries.get(i) else { break };
                let body = body(endpoint, i, q);
                let url = format!("{base}{}", endpoint.op(i).path());
                let t0 = Instant::now();
                let answer = async {
                    let r = client.post(&url).json(&body).send().await?;
                    let status = r.status();
                    anyhow::Ok((status, r.bytes().await?))
                }
                .await;
                let elapsed = t0.elapsed();
                let outcome = match answer {
                    Ok((status, bytes)) if status.is_success() => serde_json::from_slice::<Value>(&bytes)
                        .context("answer is not JSON")
                        .and_then(|v| sample_of(endpoint, i, elapsed, &v)),
                    Ok((status, bytes)) => Err(anyhow::anyhow!("{status}: {}", String::from_utf8_lossy(&bytes))),
                    Err(e) => Err(e),
                };
                match outcome {
                    Ok(s) => samples.push(s),
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| format!("{e:#}"));
                    }
                }
            }
            (samples, errors, first_error)
        }));
    }
    let mut run = Run {
        endpoint,
        concurrency,
        samples: Vec::new(),
        errors: 0,
        first_error: None,
        wall: Duration::ZERO,
        load: (load_start, f64::NAN),
    };
    for t in tasks {
        let (samples, errors, first_error) = t.await.context("a client panicked")?;
        run.samples.extend(samples);
        run.errors += errors;
        if run.first_error.is_none() {
            run.first_error = first_error;
        }
    }
    run.wall = started.elapsed();
    run.load.1 = load_avg();
    Ok(run)
}

/// Nearest-rank percentile of unsorted values.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

pub fn mean(values: &[f64]) -> f64 {
    if values.is_empty() { f64::NAN } else { values.iter().sum::<f64>() / values.len() as f64 }
}
