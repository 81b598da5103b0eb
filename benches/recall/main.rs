//! Recall latency of a running engram server at 200K memories, measured from
//! a client, plus the ANN recall and raw SQL cost of its vector leg.
//!
//! A load generator, not a test: it prints numbers and asserts nothing about
//! them. `scripts/bench-recall.sh SCIFACT_ZIP` starts a release server on a
//! database of its own and runs this against it; results go to
//! `bench/RESULTS.md` by hand.
//!
//!   cargo bench --bench recall -- --zip scifact.zip --url http://127.0.0.1:18080 \
//!       --database-url postgres://engram@127.0.0.1:54329/engram_bench_recall
//!
//! Steps:
//! 1. data (`load`): 200K SciFact-derived memories of one tenant, loaded once
//!    and reused while the row counts match;
//! 2. latency (`client`): every SciFact claim once per (endpoint, concurrency)
//!    against agent A (100K memories) and, one query in seven, a 10K agent;
//!    p50/p95/p99, throughput and the mean of each leg's server timing;
//! 3. ANN recall@20 of the vector leg against exact search (`sql`);
//! 4. the vector leg straight in SQL at concurrency 1, and the plans of both
//!    legs (EXPLAIN ANALYZE, BUFFERS).

mod client;
mod export;
mod load;
mod scifact;
mod sql;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::Utc;
use clap::Parser;
use client::{Endpoint, LEGS, Query, Run, TIERS, mean, percentile};
use engram::config::{DatabaseConfig, LocalConfig, SearchConfig};
use engram::embed::Embedder;
use engram::embed::local::LocalEmbedder;
use load::{AGENT_A, SMALL_AGENT};
use sql::{Probe, Scope};

#[derive(Parser, Debug)]
#[command(about = "Recall-latency benchmark for a running engram server")]
struct Args {
    /// BEIR SciFact zip (corpus_train.csv and the claims_*.csv files).
    #[arg(long)]
    zip: String,
    /// Base URL of the server, e.g. http://127.0.0.1:18080
    #[arg(long)]
    url: String,
    /// The server's database, for the bulk load and the SQL measurements
    /// (Postgres backend).
    #[arg(long, required_unless_present_any = ["embedded", "export_data"])]
    database_url: Option<String>,
    /// The server's Redis, to count the working memory already written
    /// (Postgres backend).
    #[arg(long, env = "REDIS_URL", required_unless_present_any = ["embedded", "export_data"])]
    redis_url: Option<String>,
    /// The server runs the embedded backend on data imported from
    /// `--export-data`: only the HTTP runs, no load and no SQL steps.
    #[arg(long)]
    embedded: bool,
    /// Write the data set of agent A and the small agent, with vectors, as an
    /// `engram import` file to PATH and exit (no server needed).
    #[arg(long, value_name = "PATH")]
    export_data: Option<String>,
    /// The server's `redis.key_prefix`.
    #[arg(long, default_value = "engram-bench-recall")]
    redis_key_prefix: String,
    /// The server's tenant (its auth.default_tenant when it has no API keys).
    #[arg(long, default_value = "bench-recall")]
    tenant: String,
    /// Sent as `Authorization: Bearer <key>` when the server has API keys.
    #[arg(long)]
    api_key: Option<String>,
    /// The server's model directory (all-MiniLM-L6-v2): the data set and the
    /// queries are embedded with the server's model.
    #[arg(long, env = "ENGRAM_MODEL_DIR")]
    model_dir: String,
    /// Threads of this program's embedder (loading only; the runs measure the server's).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Queries per run (distinct claims; 0 = all of them).
    #[arg(long, default_value_t = 0)]
    queries: usize,
    /// Concurrencies to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 8, 32])]
    concurrency: Vec<usize>,
    /// Queries per agent whose vector leg is compared with exact search.
    #[arg(long, default_value_t = 300)]
    recall_sample: usize,
    /// hnsw.ef_search values whose recall and latency are measured (the
    /// server's is `search.ef_search`, 40 by default; the aims are judged at
    /// the server's).
    #[arg(long, value_delimiter = ',', default_values_t = [40, 100, 200])]
    ef_search: Vec<u32>,
    /// Agents of `--tiny-agent-memories` each, beyond agent A and the ten
    /// small ones (9989 makes 1M memories over 10K agents); one query in seven
    /// goes to one of them.
    #[arg(long, default_value_t = 0)]
    tiny_agents: usize,
    #[arg(long, default_value_t = 80)]
    tiny_agent_memories: usize,
    /// Embed at most this many distinct texts; the others get synthetic
    /// vectors derived from them (load::cached_vectors). 0 embeds every text.
    #[arg(long, default_value_t = 0)]
    embed_at_most: usize,
    /// Requests of the mixed run (one write, six searches and three contexts
    /// in ten, spread over the agents) at the highest --concurrency; 0 skips it.
    #[arg(long, default_value_t = 0)]
    mixed: usize,
    /// Unmeasured requests per endpoint before its runs.
    #[arg(long, default_value_t = 100)]
    warmup: usize,
    /// Queries whose two legs are EXPLAINed (ANALYZE, BUFFERS).
    #[arg(long, default_value_t = 3)]
    explain: usize,
    /// `cargo bench` passes this to every bench binary; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// The issue's aims, at concurrency 1 against agent A.
const AIM_SEARCH_P95_MS: f64 = 25.0;
const AIM_CONTEXT_P95_MS: f64 = 60.0;
const AIM_RECALL: f64 = 0.95;
const AIM_OVERHEAD_RATIO: f64 = 2.0;
/// search.rs: per-leg limit of a top-20 search, and of a context (search.context_candidates).
const SEARCH_PER_LEG: i64 = 40;
const CONTEXT_PER_LEG: i64 = 200;

struct RecallRow {
    agent: &'static str,
    ef: u32,
    queries: usize,
    by_id: f64,
    ties: f64,
    p5: f64,
    ann_p50: f64,
    ann_p95: f64,
    exact_p50: f64,
    short_ann: usize,
    short_exact: usize,
}

/// The samples of one report group (an agent, or the tiny agents together).
fn agent_of(run: &Run, queries: &[Query], agent: &str) -> Vec<usize> {
    (0..run.samples.len()).filter(|&i| load::group(&queries[run.samples[i].query].agent) == agent).collect()
}

fn latencies(run: &Run, idx: &[usize]) -> Vec<f64> {
    idx.iter().map(|&i| run.samples[i].latency_us as f64 / 1e3).collect()
}

fn leg(run: &Run, idx: &[usize], leg: usize) -> Vec<f64> {
    idx.iter().map(|&i| run.samples[i].timings[leg]).collect()
}

fn latency_row(run: &Run, queries: &[Query], agent: &str) -> String {
    let idx = agent_of(run, queries, agent);
    let l = latencies(run, &idx);
    let requests = run.samples.len() + run.errors;
    format!(
        "| {} | {agent} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} | {} | {:.1} → {:.1} |",
        run.endpoint.name(),
        run.concurrency,
        l.len(),
        percentile(&l, 50.0),
        percentile(&l, 95.0),
        percentile(&l, 99.0),
        percentile(&l, 100.0),
        requests as f64 / run.wall.as_secs_f64(),
        run.errors,
        run.load.0,
        run.load.1,
    )
}

fn legs_row(run: &Run, queries: &[Query], agent: &str) -> String {
    let idx = agent_of(run, queries, agent);
    let means: Vec<String> = (0..LEGS.len()).map(|i| format!("{:.2}", mean(&leg(run, &idx, i)))).collect();
    let client = mean(&latencies(run, &idx));
    format!("| {} | {agent} | {} | {} | {client:.2} |", run.endpoint.name(), run.concurrency, means.join(" | "))
}

fn content_row(run: &Run, queries: &[Query], agent: &str) -> String {
    let idx = agent_of(run, queries, agent);
    let items: Vec<f64> = idx.iter().map(|&i| run.samples[i].items as f64).collect();
    let total: usize = idx.iter().map(|&i| run.samples[i].items).sum::<usize>().max(1);
    let shares: Vec<String> = (0..TIERS.len())
        .map(|t| {
            let n: usize = idx.iter().map(|&i| run.samples[i].per_tier[t]).sum();
            format!("{:.1}", 100.0 * n as f64 / total as f64)
        })
        .collect();
    let short = match run.endpoint {
        Endpoint::Search => idx.iter().filter(|&&i| run.samples[i].items < client::TOP_K).count().to_string(),
        _ => "-".into(),
    };
    let tokens = match run.endpoint {
        Endpoint::Search | Endpoint::Write | Endpoint::Mixed => "-".into(),
        Endpoint::Context => {
            format!("{:.0}", mean(&idx.iter().map(|&i| run.samples[i].tokens_used as f64).collect::<Vec<_>>()))
        }
    };
    format!(
        "| {} | {agent} | {} | {:.1} | {} | {} | {} |",
        run.endpoint.name(),
        run.concurrency,
        mean(&items),
        short,
        shares.join(" | "),
        tokens
    )
}

async fn check_ready(client: &reqwest::Client, base: &str) -> anyhow::Result<()> {
    let ready = client.get(format!("{base}/readyz")).send().await.with_context(|| format!("reaching {base}"))?;
    if !ready.status().is_success() {
        bail!("{base}/readyz answered {}: {}", ready.status(), ready.text().await.unwrap_or_default());
    }
    Ok(())
}

/// Statistics are flushed by each backend within about 10 s of going idle.
async fn settled_scan_counts(pool: &sqlx::PgPool) -> anyhow::Result<(i64, i64)> {
    tokio::time::sleep(Duration::from_secs(11)).await;
    Ok(sql::scan_counts(pool).await?)
}

/// Block hits and reads of the database since the server started, once the
/// backends have flushed their statistics.
async fn settled_block_counts(pool: &sqlx::PgPool) -> anyhow::Result<(i64, i64)> {
    tokio::time::sleep(Duration::from_secs(11)).await;
    Ok(sqlx::query_as(
        "SELECT blks_hit::int8, blks_read::int8 FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(pool)
    .await?)
}

/// The mixed load: `--mixed` requests over the query set's agents, one write,
/// six searches and three contexts in ten, at `concurrency`; latency per
/// operation and throughput. The memories it wrote are deleted after it, so
/// that the loaded rows stay as planned.
async fn mixed_run(
    http: &reqwest::Client,
    base: &str,
    pool: Option<&sqlx::PgPool>,
    args: &Args,
    queries: &[Query],
    concurrency: usize,
) -> anyhow::Result<()> {
    let mixed: Vec<Query> = (0..args.mixed)
        .map(|i| {
            let q = &queries[(i * 31) % queries.len()];
            Query { text: q.text.clone(), agent: q.agent.clone() }
        })
        .collect();
    let before = match pool {
        Some(pool) => Some(settled_block_counts(pool).await?),
        None => None,
    };
    let mixed = Arc::new(mixed);
    let r = client::run(http, base, Endpoint::Mixed, concurrency, mixed.clone()).await?;
    let blocks = match (before, pool) {
        (Some(b), Some(pool)) => {
            let a = settled_block_counts(pool).await?;
            Some((a.0 - b.0, a.1 - b.1))
        }
        _ => None,
    };
    if let Some(pool) = pool {
        let deleted = sqlx::query("DELETE FROM episodic_memory WHERE tenant_id = $1 AND metadata ->> 'bench' = $2")
            .bind(&args.tenant)
            .bind(client::MIXED_MARK)
            .execute(pool)
            .await?
            .rows_affected();
        eprintln!("mixed: the run's {deleted} written memories deleted");
    }
    println!();
    println!(
        "### Mixed load: {} requests at concurrency {concurrency} (1 write : 6 searches : 3 contexts), run {:.1} s, {:.0} req/s, load avg {:.1} → {:.1}",
        r.samples.len() + r.errors,
        r.wall.as_secs_f64(),
        (r.samples.len() + r.errors) as f64 / r.wall.as_secs_f64(),
        r.load.0,
        r.load.1
    );
    println!();
    println!("| operation | agent | requests | p50 ms | p95 ms | p99 ms | max ms | per s |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for op in [Endpoint::Write, Endpoint::Search, Endpoint::Context] {
        for agent in [AGENT_A, SMALL_AGENT, load::TINY_GROUP, "all"] {
            let l: Vec<f64> = r
                .samples
                .iter()
                .filter(|s| s.op == op && (agent == "all" || load::group(&mixed[s.query].agent) == agent))
                .map(|s| s.latency_us as f64 / 1e3)
                .collect();
            if l.is_empty() {
                continue;
            }
            println!(
                "| {} | {agent} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
                op.name(),
                l.len(),
                percentile(&l, 50.0),
                percentile(&l, 95.0),
                percentile(&l, 99.0),
                percentile(&l, 100.0),
                l.len() as f64 / r.wall.as_secs_f64()
            );
        }
    }
    if let Some((hit, read)) = blocks {
        println!();
        println!(
            "Postgres buffer hits during the mixed run: {hit} of {} blocks ({:.4}).",
            hit + read,
            hit as f64 / (hit + read).max(1) as f64
        );
    }
    if r.errors > 0 {
        bail!("mixed run: {} requests failed, first: {}", r.errors, r.first_error.unwrap_or_default());
    }
    Ok(())
}

/// The three tables of the HTTP runs: latency, server timings, what came back.
fn print_runs(runs: &[Run], queries: &[Query], groups: &[&str]) {
    println!();
    println!("### Latency (client side: send to last body byte)");
    println!();
    println!(
        "| endpoint | agent | concurrency | requests | p50 ms | p95 ms | p99 ms | max ms | run req/s | errors | load avg |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in runs {
        for g in groups {
            println!("{}", latency_row(r, queries, g));
        }
    }
    println!();
    println!("### Server timings, mean ms per request (response `timings`)");
    println!();
    println!(
        "| endpoint | agent | concurrency | embedding | vector | text | neighbours | working | scoring | server total | client mean |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in runs {
        for g in groups {
            println!("{}", legs_row(r, queries, g));
        }
    }
    println!();
    println!("### What came back (search: results; context: memories packed; tier shares in %)");
    println!();
    println!(
        "| endpoint | agent | concurrency | items mean | searches < {} | working | episodic | semantic | procedural | tokens used mean |",
        client::TOP_K
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in runs {
        for g in groups {
            println!("{}", content_row(r, queries, g));
        }
    }
}

/// The latency aims on the embedded backend (search and context p95 at
/// concurrency 1, agent A); the other two are about Postgres's SQL.
fn embedded_aims(runs: &[Run], queries: &[Query]) -> anyhow::Result<()> {
    let find = |e: Endpoint| runs.iter().find(|r| r.endpoint == e && r.concurrency == 1);
    let p95 = |r: Option<&Run>| r.map_or(f64::NAN, |r| percentile(&latencies(r, &agent_of(r, queries, AGENT_A)), 95.0));
    let (s95, c95) = (p95(find(Endpoint::Search)), p95(find(Endpoint::Context)));
    let met = |ok: bool| if ok { "yes" } else { "**no**" };
    println!();
    println!("### Aims ({AGENT_A}, 100K memories, concurrency 1, embedded backend)");
    println!();
    println!("| aim | target | measured | met |");
    println!("|---|---:|---:|---|");
    println!("| search p95 | ≤ {AIM_SEARCH_P95_MS} ms | {s95:.1} ms | {} |", met(s95 <= AIM_SEARCH_P95_MS));
    println!(
        "| context p95 (query embedding included) | ≤ {AIM_CONTEXT_P95_MS} ms | {c95:.1} ms | {} |",
        met(c95 <= AIM_CONTEXT_P95_MS)
    );
    let errors: usize = runs.iter().map(|r| r.errors).sum();
    if errors > 0 {
        bail!("{errors} requests failed; see above");
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.concurrency.is_empty() || args.concurrency.contains(&0) {
        bail!("every --concurrency must be at least 1");
    }
    let base = args.url.trim_end_matches('/').to_string();
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(key) = &args.api_key {
        headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {key}").parse().context("--api-key")?);
    }
    let max_concurrency = args.concurrency.iter().copied().max().unwrap_or(1);
    let http = reqwest::Client::builder()
        .default_headers(headers)
        .pool_max_idle_per_host(max_concurrency)
        .timeout(Duration::from_secs(60))
        .build()?;
    // 1. Data.
    let corpus = scifact::load(&args.zip)?;
    eprintln!("data: {} distinct memory texts, {} distinct claims", corpus.texts.len(), corpus.claims.len());
    let shape = load::Shape { tiny_agents: args.tiny_agents, tiny_memories: args.tiny_agent_memories };
    let planned = load::plan(&corpus.texts, shape)?;
    let embedder = LocalEmbedder::new(&LocalConfig {
        model_dir: args.model_dir.clone(),
        threads: args.threads,
        batch_window_ms: 0,
        max_batch: 32,
        // The server's default runtime, so the loaded vectors are in its model's space.
        ..LocalConfig::default()
    })?;
    let model = embedder.model_id().to_string();
    if let Some(path) = &args.export_data {
        let mine: Vec<load::Planned> =
            planned.into_iter().filter(|p| p.agent == AGENT_A || p.agent == SMALL_AGENT).collect();
        return export::write(path, &args.tenant, &mine, &embedder, Utc::now()).await;
    }
    check_ready(&http, &base).await?;
    let pool = match (&args.database_url, &args.redis_url, args.embedded) {
        (Some(database_url), Some(redis_url), false) => {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(4)
                .connect(database_url)
                .await
                .context("connecting to --database-url")?;
            load::ensure_persistent(&pool, database_url, &args.tenant, &planned, &embedder, args.embed_at_most).await?;
            let redis = load::connect_redis(redis_url, &args.redis_key_prefix).await?;
            load::ensure_working(&http, &base, &redis, &args.tenant, &planned).await?;
            Some(pool)
        }
        _ => None,
    };

    // 2. Queries: distinct claims, one in seven to the small agent (and one in
    // seven to a tiny agent when there are some).
    let n = if args.queries == 0 { corpus.claims.len() } else { args.queries.min(corpus.claims.len()) };
    if n < 1_000 {
        eprintln!("note: {n} queries per run, fewer than the 1,000 the issue asks for");
    }
    let queries: Vec<Query> = corpus.claims[..n]
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let agent = match i % 7 {
                3 => SMALL_AGENT.to_string(),
                5 if args.tiny_agents > 0 => load::tiny_agent(i * 7919 % args.tiny_agents),
                _ => AGENT_A.to_string(),
            };
            Query { text: c.clone(), agent }
        })
        .collect();
    let groups: Vec<&str> =
        if args.tiny_agents > 0 { vec![AGENT_A, SMALL_AGENT, load::TINY_GROUP] } else { vec![AGENT_A, SMALL_AGENT] };
    let n_a = queries.iter().filter(|q| q.agent == AGENT_A).count();
    eprintln!("queries: {n} distinct claims per run, {n_a} to {AGENT_A}, {} to the others", n - n_a);
    let queries = Arc::new(queries);
    // Warm-up texts are memory sentences, never claims: no measured query runs twice in a run.
    let warmup: Arc<Vec<Query>> = Arc::new(
        corpus.texts.iter().rev().take(args.warmup).map(|t| Query { text: t.clone(), agent: AGENT_A.into() }).collect(),
    );

    // One search first: a wrong tenant or an empty store shows here, not as fast numbers.
    let probe = client::run(
        &http,
        &base,
        Endpoint::Search,
        1,
        Arc::new(queries[..1].iter().map(|q| Query { text: q.text.clone(), agent: AGENT_A.into() }).collect()),
    )
    .await?;
    match probe.samples.first() {
        Some(s) if s.per_tier[1..].iter().sum::<usize>() > 0 => {}
        Some(s) => bail!(
            "a search of {AGENT_A} returned {} results and none of a persistent tier: does --tenant {:?} match the server's tenant?",
            s.items,
            args.tenant
        ),
        None => bail!("the probe search failed: {}", probe.first_error.unwrap_or_default()),
    }

    let mut runs: Vec<Run> = Vec::new();
    let mut scans_api = None;
    // (endpoint, concurrency, blocks found in shared buffers, blocks read) per run.
    let mut hits: Vec<(Endpoint, usize, i64, i64)> = Vec::new();
    for endpoint in [Endpoint::Search, Endpoint::Context] {
        if !warmup.is_empty() {
            let w = client::run(&http, &base, endpoint, 4, warmup.clone()).await?;
            if w.errors > 0 {
                bail!(
                    "warm-up of {}: {} errors, first: {}",
                    endpoint.name(),
                    w.errors,
                    w.first_error.unwrap_or_default()
                );
            }
        }
        for &c in &args.concurrency {
            let before = match &pool {
                Some(pool) if endpoint == Endpoint::Search && c == 1 => Some(settled_scan_counts(pool).await?),
                _ => None,
            };
            let blocks_before = match &pool {
                Some(pool) => Some(settled_block_counts(pool).await?),
                None => None,
            };
            let r = client::run(&http, &base, endpoint, c, queries.clone()).await?;
            if let (Some(b), Some(pool)) = (blocks_before, &pool) {
                let a = settled_block_counts(pool).await?;
                hits.push((endpoint, c, a.0 - b.0, a.1 - b.1));
            }
            if let (Some(b), Some(pool)) = (before, &pool) {
                let a = settled_scan_counts(pool).await?;
                scans_api = Some((a.0 - b.0, a.1 - b.1, r.samples.len() + r.errors));
            }
            for g in &groups {
                eprintln!("{}", latency_row(&r, &queries, g));
            }
            if let Some(e) = &r.first_error {
                eprintln!("  {} at {c}: {} errors, first: {e}", endpoint.name(), r.errors);
            }
            runs.push(r);
        }
    }

    print_runs(&runs, &queries, &groups);
    if !hits.is_empty() {
        println!();
        println!("### Postgres buffer hits during each run (pg_stat_database: blocks found in shared_buffers / all)");
        println!();
        println!("| endpoint | concurrency | blocks hit | blocks read | hit rate |");
        println!("|---|---:|---:|---:|---:|");
        for (e, c, hit, read) in &hits {
            let rate = *hit as f64 / (*hit + *read).max(1) as f64;
            println!("| {} | {c} | {hit} | {read} | {:.4} |", e.name(), rate);
        }
    }
    if args.mixed > 0 {
        mixed_run(&http, &base, pool.as_ref(), &args, &queries, max_concurrency).await?;
    }
    let Some(pool) = pool else {
        return embedded_aims(&runs, &queries);
    };
    let database_url = args.database_url.clone().unwrap_or_default();

    // 3 and 4. Straight SQL, on connections set up by the server's own code.
    let db_config = DatabaseConfig { url: database_url.clone(), max_connections: 1, ..DatabaseConfig::default() };
    let ann = engram::store::postgres::connect_lazy(&db_config, &SearchConfig::default())?;
    let exact = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::raw_sql("SET enable_indexscan = off; SET enable_indexonlyscan = off").execute(conn).await?;
                Ok(())
            })
        })
        .connect(&database_url)
        .await?;
    let now = Utc::now();
    // The statistics the server chooses its scans and words by (read after
    // the load's ANALYZE).
    let stats = Arc::new(engram::store::postgres::stats::read(&pool).await?);
    let scope =
        |agent: &str| Scope { tenant: args.tenant.clone(), agent: agent.to_string(), now, stats: stats.clone() };
    let texts: Vec<String> = queries.iter().map(|q| q.text.clone()).collect();
    let vectors: Vec<pgvector::Vector> =
        embedder.embed(&texts).await.context("embedding the queries")?.into_iter().map(Into::into).collect();
    let mut lexemes = Vec::with_capacity(texts.len());
    for t in &texts {
        lexemes.push(sql::lexemes(&ann, t).await?);
    }
    let probe = |i: usize| Probe { model: &model, vector: &vectors[i], lexemes: &lexemes[i] };
    let a_idx: Vec<usize> = (0..queries.len()).filter(|&i| queries[i].agent == AGENT_A).collect();
    // The queries and their vectors, for experiments in psql (bench/recall-experiments.sql).
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS bench_recall_query; CREATE TABLE bench_recall_query (i integer PRIMARY KEY, \
         agent_id text NOT NULL, claim text NOT NULL, embedding vector(384) NOT NULL)",
    )
    .execute(&pool)
    .await?;
    sqlx::query(
        "INSERT INTO bench_recall_query SELECT * FROM UNNEST($1::int4[], $2::text[], $3::text[], $4::vector[])",
    )
    .bind((0..queries.len() as i32).collect::<Vec<_>>())
    .bind(queries.iter().map(|q| q.agent.as_str()).collect::<Vec<_>>())
    .bind(queries.iter().map(|q| q.text.as_str()).collect::<Vec<_>>())
    .bind(&vectors)
    .execute(&pool)
    .await?;

    eprintln!("sql: timing the legs at concurrency 1 ({} queries of {AGENT_A})", a_idx.len());
    for &i in a_idx.iter().take(20) {
        sql::time_vector(&ann, &probe(i), &scope(AGENT_A), SEARCH_PER_LEG).await?;
    }
    let before = settled_scan_counts(&pool).await?;
    let mut vec40 = Vec::new();
    for &i in &a_idx {
        vec40.push(sql::time_vector(&ann, &probe(i), &scope(AGENT_A), SEARCH_PER_LEG).await?);
    }
    let after = settled_scan_counts(&pool).await?;
    let scans_sql = (after.0 - before.0, after.1 - before.1, a_idx.len());
    let mut vec200 = Vec::new();
    let mut text40 = Vec::new();
    let mut text200 = Vec::new();
    for &i in &a_idx {
        vec200.push(sql::time_vector(&ann, &probe(i), &scope(AGENT_A), CONTEXT_PER_LEG).await?);
        text40.push(sql::time_text(&ann, &probe(i), &scope(AGENT_A), SEARCH_PER_LEG).await?);
        text200.push(sql::time_text(&ann, &probe(i), &scope(AGENT_A), CONTEXT_PER_LEG).await?);
    }

    // Exact top-20 once per sampled query, then the ANN top-20 at each ef_search.
    eprintln!("sql: ANN recall@20 against exact search, ef_search {:?}", args.ef_search);
    let mut recall_rows = Vec::new();
    for &agent in &groups {
        let sample: Vec<usize> =
            (0..queries.len()).filter(|&i| load::group(&queries[i].agent) == agent).take(args.recall_sample).collect();
        let t0 = Instant::now();
        let mut truth = Vec::with_capacity(sample.len());
        let mut exact_ms = Vec::with_capacity(sample.len());
        for &i in &sample {
            let t = Instant::now();
            truth.push(sql::vector_hits(&exact, &probe(i), &scope(&queries[i].agent), SEARCH_PER_LEG).await?);
            exact_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        for &ef in &args.ef_search {
            let search = SearchConfig { ef_search: ef, ..SearchConfig::default() };
            let ann_ef = engram::store::postgres::connect_lazy(&db_config, &search)?;
            let (mut by_id, mut ties, mut ann_ms, mut short_ann, mut short_exact) =
                (Vec::new(), Vec::new(), Vec::new(), 0, 0);
            for (&i, e) in sample.iter().zip(&truth) {
                let t = Instant::now();
                let a = sql::vector_hits(&ann_ef, &probe(i), &scope(&queries[i].agent), SEARCH_PER_LEG).await?;
                ann_ms.push(t.elapsed().as_secs_f64() * 1e3);
                let r = sql::recall_at(&a, e, client::TOP_K);
                by_id.push(r.by_id);
                ties.push(r.with_ties);
                short_ann += usize::from(r.ann_returned < client::TOP_K);
                short_exact += usize::from(r.exact_returned < client::TOP_K);
            }
            ann_ef.close().await;
            recall_rows.push(RecallRow {
                agent,
                ef,
                queries: sample.len(),
                by_id: mean(&by_id),
                ties: mean(&ties),
                p5: percentile(&by_id, 5.0),
                ann_p50: percentile(&ann_ms, 50.0),
                ann_p95: percentile(&ann_ms, 95.0),
                exact_p50: percentile(&exact_ms, 50.0),
                short_ann,
                short_exact,
            });
        }
        eprintln!("sql: recall of {agent} over {} queries in {:.0} s", sample.len(), t0.elapsed().as_secs_f64());
    }

    // Plans: the first queries of agent A (both legs) and one of the small agent (vector leg).
    let mut plans = Vec::new();
    for &i in a_idx.iter().take(args.explain) {
        let s = scope(AGENT_A);
        let p = "EXPLAIN (ANALYZE, BUFFERS) ";
        plans.push((
            format!("vector leg, {AGENT_A}, LIMIT {SEARCH_PER_LEG}, query {i}"),
            sql::explain(&ann, sql::vector_leg(p, &probe(i), &s, SEARCH_PER_LEG)).await?,
        ));
        if !lexemes[i].is_empty() {
            plans.push((
                format!("text leg, {AGENT_A}, LIMIT {SEARCH_PER_LEG}, query {i}"),
                sql::explain(&ann, sql::text_leg(p, &probe(i), &s, SEARCH_PER_LEG)).await?,
            ));
        }
    }
    for &g in &groups[1..] {
        let Some(i) = (0..queries.len()).find(|&i| load::group(&queries[i].agent) == g) else { continue };
        let (p, agent) = ("EXPLAIN (ANALYZE, BUFFERS) ", queries[i].agent.as_str());
        plans.push((
            format!("vector leg, {agent}, LIMIT {SEARCH_PER_LEG}, query {i}"),
            sql::explain(&ann, sql::vector_leg(p, &probe(i), &scope(agent), SEARCH_PER_LEG)).await?,
        ));
        if !lexemes[i].is_empty() {
            plans.push((
                format!("text leg, {agent}, LIMIT {SEARCH_PER_LEG}, query {i}"),
                sql::explain(&ann, sql::text_leg(p, &probe(i), &scope(agent), SEARCH_PER_LEG)).await?,
            ));
        }
    }
    plans.push((
        "vector leg as a generic (prepared) plan".into(),
        sql::generic_plan(&ann, &probe(a_idx[0]), &scope(AGENT_A), SEARCH_PER_LEG).await?,
    ));

    let find = |e: Endpoint, c: usize| runs.iter().find(|r| r.endpoint == e && r.concurrency == c);
    println!();
    println!(
        "### The legs straight in SQL, {AGENT_A}, concurrency 1 ({} queries, query vector precomputed)",
        a_idx.len()
    );
    println!();
    println!("| statement | p50 ms | p95 ms | p99 ms | mean ms |");
    println!("|---|---:|---:|---:|---:|");
    for (name, v) in [
        (format!("vector leg, LIMIT {SEARCH_PER_LEG} per tier (search)"), &vec40),
        (format!("vector leg, LIMIT {CONTEXT_PER_LEG} per tier (context)"), &vec200),
        (format!("text leg, LIMIT {SEARCH_PER_LEG} per tier (the words the server searches)"), &text40),
        (format!("text leg, LIMIT {CONTEXT_PER_LEG} per tier (the words the server searches)"), &text200),
    ] {
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.2} |",
            percentile(v, 50.0),
            percentile(v, 95.0),
            percentile(v, 99.0),
            mean(v)
        );
    }
    println!();
    if let Some((hnsw, seq, requests)) = scans_api {
        println!(
            "HNSW index scans during the search run at concurrency 1: {hnsw} for {requests} requests; sequential scans of the memory tables: {seq}."
        );
    }
    let (hnsw, seq, requests) = scans_sql;
    println!(
        "HNSW index scans during the SQL vector-leg timing: {hnsw} for {requests} queries; sequential scans: {seq}."
    );
    println!();
    println!(
        "### ANN recall@20 of the vector leg (iterative relaxed_order, max_scan_tuples 20000; the server runs ef_search {}) against exact search",
        SearchConfig::default().ef_search
    );
    println!();
    println!(
        "| agent | ef_search | queries | recall@20 (ids) | recall@20 (ties at the 20th distance count) | 5th percentile | ANN p50 ms | ANN p95 ms | exact p50 ms | ANN < 20 rows | exact < 20 rows |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &recall_rows {
        println!(
            "| {} | {} | {} | {:.3} | {:.3} | {:.2} | {:.1} | {:.1} | {:.1} | {} | {} |",
            r.agent,
            r.ef,
            r.queries,
            r.by_id,
            r.ties,
            r.p5,
            r.ann_p50,
            r.ann_p95,
            r.exact_p50,
            r.short_ann,
            r.short_exact
        );
    }

    let search1 = find(Endpoint::Search, 1);
    let context1 = find(Endpoint::Context, 1);
    let p =
        |r: Option<&Run>, q: f64| r.map_or(f64::NAN, |r| percentile(&latencies(r, &agent_of(r, &queries, AGENT_A)), q));
    let embed_p50 = search1.map_or(f64::NAN, |r| percentile(&leg(r, &agent_of(r, &queries, AGENT_A), 0), 50.0));
    let sql_p50 = percentile(&vec40, 50.0);
    let ratio = (p(search1, 50.0) - embed_p50) / sql_p50;
    let server_ef = SearchConfig::default().ef_search;
    let recall_a = recall_rows.iter().find(|r| r.agent == AGENT_A && r.ef == server_ef).map_or(f64::NAN, |r| r.by_id);
    println!();
    println!("### Aims ({AGENT_A}, 100K memories, concurrency 1)");
    println!();
    println!("| aim | target | measured | met |");
    println!("|---|---:|---:|---|");
    let met = |ok: bool| if ok { "yes" } else { "**no**" };
    let s95 = p(search1, 95.0);
    let c95 = p(context1, 95.0);
    println!("| search p95 | ≤ {AIM_SEARCH_P95_MS} ms | {s95:.1} ms | {} |", met(s95 <= AIM_SEARCH_P95_MS));
    println!(
        "| context p95 (query embedding included) | ≤ {AIM_CONTEXT_P95_MS} ms | {c95:.1} ms | {} |",
        met(c95 <= AIM_CONTEXT_P95_MS)
    );
    println!("| ANN recall@20 (ids) | ≥ {AIM_RECALL} | {recall_a:.3} | {} |", met(recall_a >= AIM_RECALL));
    println!(
        "| (API search p50 − embedding p50) / SQL vector-leg p50 | ≤ {AIM_OVERHEAD_RATIO} | ({:.2} − {embed_p50:.3}) / {sql_p50:.2} = {ratio:.2} | {} |",
        p(search1, 50.0),
        met(ratio <= AIM_OVERHEAD_RATIO)
    );
    println!();
    println!("### Plans (EXPLAIN (ANALYZE, BUFFERS); the server's connection settings)");
    for (title, lines) in &plans {
        println!();
        println!("{title}:");
        println!("```");
        for l in lines {
            println!("{l}");
        }
        println!("```");
    }

    let errors: usize = runs.iter().map(|r| r.errors).sum();
    let short: usize = runs
        .iter()
        .filter(|r| r.endpoint == Endpoint::Search)
        .map(|r| agent_of(r, &queries, AGENT_A).iter().filter(|&&i| r.samples[i].items < client::TOP_K).count())
        .sum();
    if short > 0 {
        eprintln!("WARNING: {short} searches of {AGENT_A} returned fewer than {} results", client::TOP_K);
    }
    if errors > 0 {
        bail!("{errors} requests failed; see above");
    }
    Ok(())
}
