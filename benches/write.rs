//! Write latency of a running engram server, measured from a client.
//!
//! A load generator, not a test: it prints numbers and asserts nothing
//! (timing assertions in tests are flaky by nature). For each class of write
//! and each concurrency it sends `--total` single-memory POSTs, records every
//! request's latency (send to last body byte) and prints one markdown table.
//! `scripts/bench-write.sh` starts a release server and runs this against it;
//! results go to `bench/RESULTS.md` by hand.
//!
//!   cargo bench --bench write -- --url http://127.0.0.1:18080 [--total 10000] [--api-key K]
//!
//! Classes:
//!   working   tier working, one session per writer (Redis only)
//!   episodic  tier episodic, sentence-length content (Postgres commit)
//!   semantic  new facts with unique content: the dedup lookup, then an insert
//!   supersede facts about a subject/predicate the agent already has a value
//!             for: each write also retires the previous value (an UPDATE)
//!
//! Every run uses its own agent ids, so runs neither deduplicate against nor
//! supersede each other's memories.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use serde_json::{Value, json};
use uuid::Uuid;

#[derive(Parser, Debug)]
#[command(about = "Write-latency benchmark for a running engram server")]
struct Args {
    /// Base URL of the server, e.g. http://127.0.0.1:18080
    #[arg(long)]
    url: String,
    /// Memories written per (class, concurrency) run, one per request.
    #[arg(long, default_value_t = 10_000)]
    total: usize,
    /// Sent as `Authorization: Bearer <key>` when the server has API keys.
    #[arg(long)]
    api_key: Option<String>,
    /// Concurrencies to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 8, 32])]
    concurrency: Vec<usize>,
    /// Classes to run, comma-separated: working, episodic, semantic, supersede.
    #[arg(long, value_delimiter = ',', default_values_t = [Class::Working, Class::Episodic, Class::Semantic, Class::Supersede])]
    class: Vec<Class>,
    /// Unmeasured requests per class before its runs (connections, caches).
    #[arg(long, default_value_t = 200)]
    warmup: usize,
    /// `cargo bench` passes this to every bench binary; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, clap::ValueEnum)]
enum Class {
    Working,
    Episodic,
    Semantic,
    Supersede,
}

impl std::fmt::Display for Class {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Class::Working => "working",
            Class::Episodic => "episodic",
            Class::Semantic => "semantic",
            Class::Supersede => "supersede",
        })
    }
}

// Pieces of realistic agent memories: 15-30 words once assembled.
const WHO: &[&str] = &["The user", "Alice", "The customer", "Bob from accounting", "The team lead", "Our client"];
const DID: &[&str] = &[
    "asked to reschedule the design review",
    "mentioned a strong preference for window seats on long flights",
    "reported that the invoice export fails for amounts above ten thousand",
    "confirmed the new onboarding checklist works on mobile",
    "wants weekly summaries sent on Monday mornings instead of Friday evenings",
    "said the staging database was slow after the last migration",
    "requested vegetarian options for the offsite lunch",
];
const WHEN: &[&str] = &[
    "during the morning stand-up",
    "in a follow-up email after the demo",
    "while we were debugging the payment flow together",
    "at the end of the quarterly planning session",
    "in the support chat this afternoon",
];
const PREDICATES: &[&str] = &[
    "prefers_seat",
    "home_city",
    "timezone",
    "favourite_language",
    "dietary_preference",
    "manager",
    "working_hours",
    "preferred_editor",
];

/// The body of request `i` of writer `w` in one run.
fn body(class: Class, agent: &str, session: &str, w: usize, i: usize) -> Value {
    let pick = |list: &[&'static str], salt: usize| list[(i * 7 + w * 13 + salt) % list.len()];
    let sentence = format!("{} {} {} (note {i}).", pick(WHO, 0), pick(DID, 1), pick(WHEN, 2));
    match class {
        Class::Working => json!({"agent_id": agent, "tier": "working", "session_id": session, "content": sentence}),
        Class::Episodic => json!({"agent_id": agent, "tier": "episodic", "session_id": session, "content": sentence}),
        Class::Semantic => json!({
            "agent_id": agent, "tier": "semantic",
            "content": format!("{} {} (fact {i} of writer {w}).", pick(WHO, 0), pick(DID, 1)),
        }),
        Class::Supersede => {
            let predicate = pick(PREDICATES, 3);
            json!({
                "agent_id": agent, "tier": "semantic", "subject": "user", "predicate": predicate,
                "content": format!("The user's {} is option {i} of writer {w}.", predicate.replace('_', " ")),
            })
        }
    }
}

/// One (class, concurrency) run's results.
struct RunResult {
    class: Class,
    concurrency: usize,
    /// Latencies of the 201s, in microseconds, sorted.
    latencies_us: Vec<u64>,
    errors: usize,
    first_error: Option<String>,
    wall: Duration,
}

impl RunResult {
    /// Nearest-rank percentile in milliseconds.
    fn percentile_ms(&self, p: f64) -> f64 {
        let n = self.latencies_us.len();
        if n == 0 {
            return f64::NAN;
        }
        let rank = ((p / 100.0) * n as f64).ceil().max(1.0) as usize;
        self.latencies_us[rank.min(n) - 1] as f64 / 1000.0
    }

    fn row(&self) -> String {
        let requests = self.latencies_us.len() + self.errors;
        format!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {} |",
            self.class,
            self.concurrency,
            requests,
            self.percentile_ms(50.0),
            self.percentile_ms(95.0),
            self.percentile_ms(99.0),
            self.percentile_ms(100.0),
            requests as f64 / self.wall.as_secs_f64(),
            self.errors,
        )
    }
}

/// Sends `total` writes of `class` from `concurrency` writers, which share
/// one counter so the total is exact whatever their speeds.
async fn run(
    client: &reqwest::Client,
    url: &str,
    class: Class,
    concurrency: usize,
    total: usize,
    label: &str,
) -> anyhow::Result<RunResult> {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(concurrency);
    for w in 0..concurrency {
        let (client, url, next) = (client.clone(), url.to_string(), next.clone());
        let agent = format!("bench-{label}-{class}-c{concurrency}-w{w}");
        let session = format!("s-{label}-{w}");
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(total / concurrency + 1);
            let mut errors = 0;
            let mut first_error = None;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                let body = body(class, &agent, &session, w, i);
                let t0 = Instant::now();
                let answer = async {
                    let r = client.post(&url).json(&body).send().await?;
                    let status = r.status();
                    anyhow::Ok((status, r.bytes().await?))
                }
                .await;
                let elapsed = t0.elapsed();
                match answer {
                    Ok((status, _)) if status == reqwest::StatusCode::CREATED => {
                        latencies.push(elapsed.as_micros() as u64)
                    }
                    Ok((status, bytes)) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| format!("{status}: {}", String::from_utf8_lossy(&bytes)));
                    }
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| format!("{e:#}"));
                    }
                }
            }
            (latencies, errors, first_error)
        }));
    }
    let mut result = RunResult {
        class,
        concurrency,
        latencies_us: Vec::with_capacity(total),
        errors: 0,
        first_error: None,
        wall: Duration::ZERO,
    };
    for t in tasks {
        let (latencies, errors, first_error) = t.await.context("a writer panicked")?;
        result.latencies_us.extend(latencies);
        result.errors += errors;
        if result.first_error.is_none() {
            result.first_error = first_error;
        }
    }
    result.wall = started.elapsed();
    result.latencies_us.sort_unstable();
    Ok(result)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.total == 0 || args.concurrency.contains(&0) {
        bail!("--total and every --concurrency must be at least 1");
    }
    let base = args.url.trim_end_matches('/').to_string();
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(key) = &args.api_key {
        headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {key}").parse().context("--api-key")?);
    }
    let max_concurrency = args.concurrency.iter().copied().max().unwrap_or(1);
    let client = reqwest::Client::builder()
        .default_headers(headers)
        .pool_max_idle_per_host(max_concurrency)
        .timeout(Duration::from_secs(30))
        .build()?;

    let ready = client.get(format!("{base}/readyz")).send().await.with_context(|| format!("reaching {base}"))?;
    if !ready.status().is_success() {
        bail!("{base}/readyz answered {}: {}", ready.status(), ready.text().await.unwrap_or_default());
    }

    let url = format!("{base}/v1/memories");
    let label = Uuid::new_v4().simple().to_string()[..12].to_string();
    eprintln!(
        "write benchmark: {} per run, classes {:?}, concurrency {:?}, run label {label}",
        args.total, args.class, args.concurrency
    );
    let mut results = Vec::new();
    for &class in &args.class {
        if args.warmup > 0 {
            let warm =
                run(&client, &url, class, max_concurrency.min(8), args.warmup, &format!("{label}-warmup")).await?;
            if warm.errors > 0 {
                bail!("warm-up of {class}: {} errors, first: {}", warm.errors, warm.first_error.unwrap_or_default());
            }
        }
        for &concurrency in &args.concurrency {
            let r = run(&client, &url, class, concurrency, args.total, &label).await?;
            eprintln!("{}", r.row());
            if let Some(e) = &r.first_error {
                eprintln!("  {class} at {concurrency}: {} errors, first: {e}", r.errors);
            }
            results.push(r);
        }
    }

    println!();
    println!("| class | concurrency | requests | p50 ms | p95 ms | p99 ms | max ms | throughput req/s | errors |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &results {
        println!("{}", r.row());
    }
    if results.iter().any(|r| r.errors > 0) {
        bail!("some requests failed; see above");
    }
    Ok(())
}
