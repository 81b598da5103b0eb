//! Whether one tenant's writes slow another tenant's searches: search latency
//! of tenant B idle, under a sustained write load from tenant A, and while A
//! sends one maximal batch (60 memories of 32 KiB, about 1.97 MB).
//!
//! A load generator, not a test: it prints numbers and asserts nothing.
//! `scripts/bench-fairness.sh` starts a release server with the bundled model
//! and two API keys and runs this against it; results go to `bench/RESULTS.md`.
//!
//!   cargo bench --bench fairness -- --url URL --key-a KEY --key-b KEY [--searches 300]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use serde_json::{Value, json};

#[derive(Parser, Debug)]
#[command(about = "Search latency of one tenant under another tenant's writes")]
struct Args {
    /// Base URL of the server.
    #[arg(long)]
    url: String,
    /// API key of tenant A (the writer).
    #[arg(long)]
    key_a: String,
    /// API key of tenant B (the searcher).
    #[arg(long)]
    key_b: String,
    /// Searches per phase (sequential, one client).
    #[arg(long, default_value_t = 300)]
    searches: usize,
    /// Concurrent writers of the sustained write load.
    #[arg(long, default_value_t = 4)]
    writers: usize,
    /// Memories tenant B holds before the searches.
    #[arg(long, default_value_t = 1_000)]
    seed: usize,
    /// `cargo bench` passes this to every bench binary; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

const TOPICS: &[&str] = &[
    "the quarterly budget review moved to Thursday afternoon",
    "a strong preference for window seats on long flights",
    "the staging database ran out of disk during the nightly import",
    "a lemon tree on the balcony that needs water every other day",
    "the new onboarding checklist for support engineers",
    "a refund for the duplicate charge on the March invoice",
    "the kitchen renovation quote from the second contractor",
    "a reminder to renew the passport before the trip to Lisbon",
];
const WHO: &[&str] = &["The user", "Alice", "The customer", "Bob from accounting", "The team lead", "Our client"];

fn sentence(i: usize) -> String {
    format!("{} mentioned {} (note {i}).", WHO[i % WHO.len()], TOPICS[(i / WHO.len()) % TOPICS.len()])
}

/// About `bytes` of prose: sentences until the size is reached.
fn long_text(bytes: usize, salt: usize) -> String {
    let mut s = String::with_capacity(bytes + 128);
    let mut i = salt * 1_000;
    while s.len() < bytes {
        let next = sentence(i);
        if s.len() + next.len() + 1 > bytes {
            break;
        }
        s.push_str(&next);
        s.push(' ');
        i += 1;
    }
    s.truncate(s.trim_end().len());
    s
}

struct Client {
    http: reqwest::Client,
    url: String,
}

impl Client {
    async fn post(&self, key: &str, path: &str, body: &Value) -> anyhow::Result<(u16, Duration)> {
        let t = Instant::now();
        let r = self.http.post(format!("{}{path}", self.url)).bearer_auth(key).json(body).send().await?;
        let status = r.status().as_u16();
        r.bytes().await?;
        Ok((status, t.elapsed()))
    }
}

#[derive(Default)]
struct Latencies {
    ms: Vec<f64>,
    errors: usize,
}

impl Latencies {
    fn percentile(&self, p: f64) -> f64 {
        let mut v = self.ms.clone();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return f64::NAN;
        }
        let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
        v[rank.min(v.len()) - 1]
    }

    fn row(&self, phase: &str, extra: &str) -> String {
        format!(
            "| {phase} | {} | {} | {:.1} | {:.1} | {:.1} | {extra} |",
            self.ms.len(),
            self.errors,
            self.percentile(50.0),
            self.percentile(95.0),
            self.percentile(100.0)
        )
    }
}

/// Sequential searches of tenant B until `n` are done or `stop` is set.
async fn searches(c: &Client, key: &str, n: usize, stop: Option<&AtomicBool>) -> anyhow::Result<Latencies> {
    let mut out = Latencies::default();
    for i in 0..n {
        if stop.is_some_and(|s| s.load(Ordering::Acquire)) {
            break;
        }
        let body = json!({"agent_id": "searcher", "query": format!("what did {} say about {}", WHO[i % WHO.len()],
                          TOPICS[i % TOPICS.len()]), "top_k": 10});
        let (status, took) = c.post(key, "/v1/memories/search", &body).await?;
        if status == 200 {
            out.ms.push(took.as_secs_f64() * 1e3);
        } else {
            out.errors += 1;
        }
    }
    Ok(out)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Longer than the server's write timeout (180 s by default): the batch gets its answer.
    let http = reqwest::Client::builder().timeout(Duration::from_secs(300)).build()?;
    let c = Arc::new(Client { http, url: args.url.clone() });

    // Tenant B's memories, written in batches of 100.
    for start in (0..args.seed).step_by(100) {
        let memories: Vec<Value> = (start..(start + 100).min(args.seed))
            .map(|i| json!({"agent_id": "searcher", "tier": "episodic", "content": sentence(i)}))
            .collect();
        let (status, _) = c.post(&args.key_b, "/v1/memories", &json!({"memories": memories})).await?;
        if status != 201 {
            bail!("seeding tenant B: HTTP {status}");
        }
    }
    // Warm-up: connections, caches, the model's first calls.
    searches(&c, &args.key_b, 30, None).await?;

    println!("| phase | searches | errors | p50 ms | p95 ms | max ms | other tenant |");
    println!("|---|---|---|---|---|---|---|");
    let idle = searches(&c, &args.key_b, args.searches, None).await?;
    println!("{}", idle.row("idle", ""));

    // Sustained write load: tenant A's writers post single short memories
    // without pause until the searches are done.
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let mut writers = Vec::new();
    for w in 0..args.writers {
        let (c, stop, written, refused, key) =
            (c.clone(), stop.clone(), written.clone(), refused.clone(), args.key_a.clone());
        writers.push(tokio::spawn(async move {
            let mut i = w * 1_000_000;
            while !stop.load(Ordering::Acquire) {
                let body = json!({"agent_id": "writer", "tier": "episodic", "content": sentence(i)});
                match c.post(&key, "/v1/memories", &body).await {
                    Ok((201, _)) => written.fetch_add(1, Ordering::AcqRel),
                    _ => refused.fetch_add(1, Ordering::AcqRel),
                };
                i += 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let before = written.load(Ordering::Acquire);
    let loaded = searches(&c, &args.key_b, args.searches, None).await?;
    let rate = (written.load(Ordering::Acquire) - before) as f64 / started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Release);
    for w in writers {
        w.await?;
    }
    println!(
        "{}",
        loaded.row(
            &format!("{} writers", args.writers),
            &format!("{rate:.0} writes/s, {} refused", refused.load(Ordering::Acquire))
        )
    );

    // One maximal batch: 60 memories of 32 KiB.
    let memories: Vec<Value> = (0..60)
        .map(|i| json!({"agent_id": "writer", "tier": "episodic", "content": long_text(32 * 1024, i)}))
        .collect();
    let batch = json!({"memories": memories});
    let size = serde_json::to_vec(&batch)?.len();
    let done = Arc::new(AtomicBool::new(false));
    let big = {
        let (c, done, key) = (c.clone(), done.clone(), args.key_a.clone());
        tokio::spawn(async move {
            let r = c.post(&key, "/v1/memories", &batch).await;
            done.store(true, Ordering::Release);
            r
        })
    };
    let during = searches(&c, &args.key_b, usize::MAX, Some(&done)).await?;
    let (status, took) = big.await?.context("the large batch")?;
    println!(
        "{}",
        during.row(
            "during a 60 × 32 KiB batch",
            &format!("batch of {size} bytes: HTTP {status} in {:.1} s", took.as_secs_f64())
        )
    );
    let after = searches(&c, &args.key_b, args.searches, None).await?;
    println!("{}", after.row("right after the batch", ""));
    Ok(())
}
