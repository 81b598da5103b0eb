//! The retention sweep's cost: how fast it deletes expired memories, and
//! what it does to search latency while it runs.
//!
//! A load generator, not a test: it prints numbers and asserts nothing.
//! `scripts/bench-sweep.sh` drives it in two steps:
//!
//!   cargo bench --bench sweep -- generate --out FILE --live N --expiring M --model-dir DIR
//!     writes an `engram import` file: N live and M expiring episodic memories
//!     of one tenant, each with a vector of the bundled model (2,000 embedded
//!     sentences, each reused with a little noise, so vectors cluster as real
//!     ones do); the expiring ones under their own agent, to be made expired
//!     directly in the database once imported.
//!   cargo bench --bench sweep -- measure --url URL --expiring M
//!     search latency idle (before the first sweep), then while the sweep
//!     deletes the M expired memories (read from /metrics), and the sweep's
//!     rate.
//!
//! Erasure (`scripts/bench-erasure.sh`) uses the same data: `generate
//! --subject-rows N` gives the live memories users (`user-0` … `user-49`),
//! N of them the user `subject`; `erase --url URL` then measures search
//! latency idle, erases `subject` through `POST /v1/erasure`, and measures
//! search latency (of the other users' memories, same agent) until the
//! erasure completes.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::Utc;
use clap::{Parser, Subcommand};
use engram::config::{LocalConfig, LocalRuntime};
use engram::embed::local::LocalEmbedder;
use engram::embed::{Embedder, Lane};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use uuid::Uuid;

#[derive(Parser, Debug)]
#[command(about = "Retention sweep benchmark")]
struct Args {
    #[command(subcommand)]
    command: Command,
    /// `cargo bench` passes this to every bench binary; ignored.
    #[arg(long, hide = true, global = true)]
    bench: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    Generate {
        #[arg(long)]
        out: std::path::PathBuf,
        #[arg(long)]
        live: usize,
        #[arg(long)]
        expiring: usize,
        #[arg(long)]
        model_dir: String,
        /// Live memories given to the user `subject` (the rest to 50 other users).
        #[arg(long)]
        subject_rows: Option<usize>,
    },
    Erase {
        #[arg(long)]
        url: String,
        /// Searches of the idle phase.
        #[arg(long, default_value_t = 300)]
        searches: usize,
    },
    Measure {
        #[arg(long)]
        url: String,
        #[arg(long)]
        expiring: u64,
        /// Searches of the idle phase.
        #[arg(long, default_value_t = 300)]
        searches: usize,
    },
}

pub const TENANT: &str = "bench-sweep";
pub const LIVE_AGENT: &str = "agent-live";
pub const EXPIRING_AGENT: &str = "agent-expiring";
/// The user `erase` erases.
pub const SUBJECT: &str = "subject";

const SUBJECTS: &[&str] = &["The user", "Alice", "The customer", "Bob from accounting", "The team lead", "Our client"];
const VERBS: &[&str] = &["mentioned", "asked about", "complained about", "confirmed", "postponed", "forgot"];
const THINGS: &[&str] = &[
    "the quarterly budget review",
    "window seats on long flights",
    "the staging database disk",
    "the lemon tree on the balcony",
    "the onboarding checklist",
    "the duplicate charge on the invoice",
    "the kitchen renovation quote",
    "renewing the passport",
    "the team offsite in May",
    "the broken printer on floor two",
];

fn sentence(i: usize) -> String {
    let s = SUBJECTS[i % SUBJECTS.len()];
    let v = VERBS[(i / SUBJECTS.len()) % VERBS.len()];
    let t = THINGS[(i / (SUBJECTS.len() * VERBS.len())) % THINGS.len()];
    format!("{s} {v} {t} (case {})", i / (SUBJECTS.len() * VERBS.len() * THINGS.len()))
}

async fn generate(
    out: &std::path::Path,
    live: usize,
    expiring: usize,
    model_dir: String,
    subject_rows: Option<usize>,
) -> anyhow::Result<()> {
    let config = LocalConfig { model_dir, runtime: LocalRuntime::OnnxInt8, ..LocalConfig::default() };
    let embedder = LocalEmbedder::new(&config).context("loading the bundled model")?;
    let bases: Vec<String> = (0..2_000).map(sentence).collect();
    let t = Instant::now();
    let mut vectors = Vec::with_capacity(bases.len());
    for chunk in bases.chunks(64) {
        vectors.extend(embedder.embed_in(chunk, Lane::Background).await?);
    }
    eprintln!("sweep: embedded {} sentences in {:.1} s", bases.len(), t.elapsed().as_secs_f64());

    let mut rng = StdRng::seed_from_u64(7);
    let file = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
    let now = Utc::now();
    let created = now - chrono::Duration::hours(2);
    writeln!(
        w,
        "{}",
        json!({"kind": "header", "format": "engram-export", "version": 1, "tenant": TENANT, "exported_at": now,
               "vectors": true})
    )?;
    for i in 0..live + expiring {
        let base = i % bases.len();
        let content = format!("{} note {i}", bases[base]);
        let mut v: Vec<f32> = vectors[base].iter().map(|x| x + rng.random_range(-0.02f32..0.02)).collect();
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter_mut().for_each(|x| *x /= norm);
        let expiring_row = i >= live;
        // Far-future expiry for now: the script moves it into the past in
        // the database once the rows are in (an import skips expired rows).
        let (agent, retention, expires_at) = if expiring_row {
            (EXPIRING_AGENT, "long_term", Some(now + chrono::Duration::days(300)))
        } else {
            (LIVE_AGENT, "permanent", None)
        };
        let at = created + chrono::Duration::milliseconds(i as i64);
        // Spread evenly: every `live / subject` rows one is the subject's.
        let user = subject_rows.filter(|_| !expiring_row).map(|n| {
            if n > 0 && i % (live / n).max(1) == 0 && i / (live / n).max(1) < n {
                SUBJECT.to_string()
            } else {
                format!("user-{}", i % 50)
            }
        });
        let record = json!({
            "kind": "memory", "id": Uuid::now_v7(), "tier": "episodic", "agent_id": agent, "user_id": user,
            "session_id": null, "content": content, "importance": 0.5, "retention": retention, "metadata": {},
            "private": false, "occurred_at": at, "created_at": at, "updated_at": at, "expires_at": expires_at,
            "access_count": 0, "last_accessed_at": null, "embedding_model": "all-MiniLM-L6-v2-int8",
            "event_type": "conversation", "content_hash": engram::domain::content::content_hash(&content),
            "vector": v,
        });
        serde_json::to_writer(&mut w, &record)?;
        w.write_all(b"\n")?;
    }
    writeln!(w, "{}", json!({"kind": "end", "counts": {"episodic": live + expiring}}))?;
    w.flush()?;
    eprintln!("sweep: wrote {} memories to {}", live + expiring, out.display());
    Ok(())
}

fn percentile(ms: &[f64], p: f64) -> f64 {
    let mut v = ms.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[((p / 100.0 * v.len() as f64).ceil().max(1.0) as usize).min(v.len()) - 1]
}

/// Memories the sweep deleted so far, from the server's metrics.
async fn deleted(http: &reqwest::Client, url: &str) -> anyhow::Result<u64> {
    let text = http.get(format!("{url}/metrics")).send().await?.text().await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("engram_retention_deleted_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

async fn search(http: &reqwest::Client, url: &str, i: usize) -> anyhow::Result<f64> {
    let body = json!({"agent_id": LIVE_AGENT, "query": sentence(i * 7 + 3), "top_k": 10});
    let t = Instant::now();
    let r = http.post(format!("{url}/v1/memories/search")).json(&body).send().await?;
    let status = r.status();
    let _: Value = r.json().await?;
    if !status.is_success() {
        bail!("search: HTTP {status}");
    }
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

async fn measure(url: &str, expiring: u64, searches: usize) -> anyhow::Result<()> {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?;
    for i in 0..30 {
        search(&http, url, i).await?;
    }
    let mut idle = Vec::new();
    for i in 0..searches {
        idle.push(search(&http, url, i).await?);
    }
    let before = deleted(&http, url).await?;
    if before > 0 {
        bail!(
            "the sweep began during the idle phase ({before} deleted); start it later (retention.sweep_interval_secs)"
        );
    }
    // Wait for the sweep to start.
    let waited = Instant::now();
    while deleted(&http, url).await? == before {
        if waited.elapsed() > Duration::from_secs(300) {
            bail!("no sweep deleted anything within 5 minutes");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let started = Instant::now();
    let mut during = Vec::new();
    let mut i = 0;
    let mut last_poll = Instant::now();
    let mut done = deleted(&http, url).await?;
    while done < before + expiring {
        during.push(search(&http, url, i).await?);
        i += 1;
        if last_poll.elapsed() > Duration::from_millis(100) {
            done = deleted(&http, url).await?;
            last_poll = Instant::now();
        }
        if started.elapsed() > Duration::from_secs(1_800) {
            bail!("the sweep had deleted {} of {expiring} after 30 minutes", done - before);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!("| phase | searches | p50 ms | p95 ms | max ms | sweep |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| idle | {} | {:.1} | {:.1} | {:.1} | |",
        idle.len(),
        percentile(&idle, 50.0),
        percentile(&idle, 95.0),
        percentile(&idle, 100.0)
    );
    println!(
        "| during the sweep | {} | {:.1} | {:.1} | {:.1} | {} rows in {secs:.1} s: {:.0} rows/s |",
        during.len(),
        percentile(&during, 50.0),
        percentile(&during, 95.0),
        percentile(&during, 100.0),
        done - before,
        (done - before) as f64 / secs
    );
    Ok(())
}

/// Search latency idle, then while `subject` is erased; the erasure's time
/// from request to `completed`, and its receipt's counts.
async fn erase(url: &str, searches: usize) -> anyhow::Result<()> {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?;
    for i in 0..30 {
        search(&http, url, i).await?;
    }
    let mut idle = Vec::new();
    for i in 0..searches {
        idle.push(search(&http, url, i).await?);
    }
    let started = Instant::now();
    let r = http.post(format!("{url}/v1/erasure")).json(&json!({"user_id": SUBJECT})).send().await?;
    let accepted_ms = started.elapsed().as_secs_f64() * 1e3;
    let status = r.status();
    let body: Value = r.json().await?;
    if status.as_u16() != 202 {
        bail!("erasure: HTTP {status}: {body}");
    }
    let id = body["id"].as_str().context("an erasure id")?.to_string();
    let mut during = Vec::new();
    let mut last_poll = Instant::now();
    let mut i = 0;
    let receipt = loop {
        during.push(search(&http, url, i).await?);
        i += 1;
        if last_poll.elapsed() > Duration::from_millis(100) {
            last_poll = Instant::now();
            let r: Value = http.get(format!("{url}/v1/erasure/{id}")).send().await?.json().await?;
            match r["state"].as_str() {
                Some("completed") => break r,
                Some("failed") => bail!("the erasure failed: {r}"),
                _ => {}
            }
        }
        if started.elapsed() > Duration::from_secs(1_800) {
            bail!("the erasure had not completed after 30 minutes");
        }
    };
    let secs = started.elapsed().as_secs_f64();
    println!("| phase | searches | p50 ms | p95 ms | max ms | erasure |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| idle | {} | {:.1} | {:.1} | {:.1} | |",
        idle.len(),
        percentile(&idle, 50.0),
        percentile(&idle, 95.0),
        percentile(&idle, 100.0)
    );
    println!(
        "| during the erasure | {} | {:.1} | {:.1} | {:.1} | accepted in {accepted_ms:.0} ms, completed in {secs:.1} s; deleted {} |",
        during.len(),
        percentile(&during, 50.0),
        percentile(&during, 95.0),
        percentile(&during, 100.0),
        receipt["deleted"]
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match args.command {
        Command::Generate { out, live, expiring, model_dir, subject_rows } => {
            generate(&out, live, expiring, model_dir, subject_rows).await
        }
        Command::Erase { url, searches } => erase(url.as_str(), searches).await,
        Command::Measure { url, expiring, searches } => measure(&url, expiring, searches).await,
    }
}
