//! Retrieval quality and speed of the local embedder on BEIR SciFact.
//!
//! A check that the bundled model is wired correctly, not a test: with
//! all-MiniLM-L6-v2 the 300 test claims retrieve their cited abstracts among
//! 5,183 with nDCG@10 = 0.649 ± 0.005 (shared/MODELS.md; published 0.645). A
//! tokenizer, pooling or padding mistake shows up here as a clear drop.
//!
//!   cargo bench --bench scifact -- --zip /work/shared/bench/scifact.zip --model-dir DIR
//!
//! Everything goes through the crate's own `Embedder` (`LocalEmbedder`, with
//! its batching worker and its long-text rule: overlapping 256-token windows,
//! averaged). `--recipe truncate` (or `both`) scores the reference recipe of
//! sentence-transformers (first 256 tokens only) through `MiniLm` directly, to
//! tell a wiring fault from the effect of the long-text rule. Retrieval is an
//! exact cosine scan; relevance is binary (a claim's `cited_doc_ids`).
//!
//! It also measures what the server will see: the latency of one text embedded
//! alone, the throughput of concurrent single-text callers (which the worker
//! batches), and the throughput of whole batches.
//!
//! The zip is read with `unzip -p` (or Python's zipfile), so the crate needs
//! no zip or CSV dependency for a benchmark.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use engram::config::{LocalConfig, LocalRuntime};
use engram::embed::local::{LocalEmbedder, MiniLm};
use engram::embed::{Embedder, Lane};

#[derive(Parser, Debug)]
#[command(about = "SciFact nDCG@10 and speed of the local embedder")]
struct Args {
    /// The SciFact zip (corpus_train.csv, claims_validation.csv).
    #[arg(long)]
    zip: PathBuf,
    /// The model directory (scripts/fetch-model.sh).
    #[arg(long, env = "ENGRAM_MODEL_DIR", default_value = "data/models/all-MiniLM-L6-v2")]
    model_dir: String,
    /// embedding.local.runtime: onnx-int8 or candle.
    #[arg(long, value_enum, default_value_t = Runtime::OnnxInt8)]
    runtime: Runtime,
    /// embedding.local.threads
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Queries (the claims) with the f32 products, as stored texts are
    /// embedded (`embedding.local.int8_queries = false`).
    #[arg(long)]
    f32_queries: bool,
    /// embedding.local.max_batch
    #[arg(long, default_value_t = 32)]
    max_batch: usize,
    /// embedding.local.batch_window_ms
    #[arg(long, default_value_t = 2)]
    batch_window_ms: u64,
    /// Texts per `embed` call while indexing the corpus.
    #[arg(long, default_value_t = 64)]
    call_size: usize,
    /// Score only the first N documents (plus every cited one), for a quick look.
    #[arg(long)]
    limit_docs: Option<usize>,
    /// What to score: `windows` (the Embedder's rule), `truncate` (each text cut
    /// at 256 tokens, the reference recipe) or `both`.
    #[arg(long, value_enum, default_value_t = Recipe::Windows)]
    recipe: Recipe,
    /// Texts for the latency measurements (0: none).
    #[arg(long, default_value_t = 200)]
    latency_texts: usize,
    /// Measure latency and throughput only; skip the retrieval score.
    #[arg(long)]
    latency_only: bool,
    /// `cargo bench` passes this to every bench binary; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, clap::ValueEnum)]
enum Runtime {
    OnnxInt8,
    Candle,
}

impl From<Runtime> for LocalRuntime {
    fn from(r: Runtime) -> LocalRuntime {
        match r {
            Runtime::OnnxInt8 => LocalRuntime::OnnxInt8,
            Runtime::Candle => LocalRuntime::Candle,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, clap::ValueEnum)]
enum Recipe {
    Windows,
    Truncate,
    Both,
}

struct Doc {
    id: String,
    text: String,
}

struct Claim {
    text: String,
    relevant: Vec<String>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // As the server should: pin candle's own threads while this is the only thread.
    // SAFETY: no other thread exists yet.
    unsafe { engram::embed::local::pin_candle_threads(args.threads) };
    tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let (mut docs, claims) = load_scifact(&args.zip)?;
    if let Some(n) = args.limit_docs {
        let cited: std::collections::HashSet<&String> = claims.iter().flat_map(|c| &c.relevant).collect();
        let mut i = 0;
        docs.retain(|d| {
            i += 1;
            i <= n || cited.contains(&d.id)
        });
    }
    println!("SciFact: {} documents, {} claims, {} relevant pairs", docs.len(), claims.len(), {
        claims.iter().map(|c| c.relevant.len()).sum::<usize>()
    });

    let config = LocalConfig {
        model_dir: args.model_dir.clone(),
        runtime: args.runtime.into(),
        threads: args.threads,
        int8_queries: !args.f32_queries,
        batch_window_ms: args.batch_window_ms,
        max_batch: args.max_batch,
        ..LocalConfig::default()
    };
    let t = Instant::now();
    let embedder = Arc::new(LocalEmbedder::new(&config)?);
    println!(
        "model {} loaded and verified in {:.2} s (threads {}, int8 queries {}, max_batch {}, batch_window_ms {})",
        embedder.model_id(),
        t.elapsed().as_secs_f64(),
        args.threads,
        !args.f32_queries,
        args.max_batch,
        args.batch_window_ms
    );

    if args.latency_texts > 0 {
        latency(&embedder, &claims, args.latency_texts).await?;
    }
    if args.latency_only {
        return Ok(());
    }
    let texts: Vec<String> = docs.iter().map(|d| d.text.clone()).collect();
    let claim_texts: Vec<String> = claims.iter().map(|c| c.text.clone()).collect();
    if args.recipe != Recipe::Truncate {
        score_embedder(&embedder, &args, &docs, &texts, &claims, &claim_texts).await?;
    }
    if args.recipe != Recipe::Windows {
        drop(embedder);
        let model = MiniLm::load(Path::new(&args.model_dir), args.runtime.into(), args.threads)?;
        let pool = rayon::ThreadPoolBuilder::new().num_threads(args.threads).build()?;
        let t = Instant::now();
        let (doc_vectors, claim_vectors) = pool.install(|| -> anyhow::Result<_> {
            let docs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let claims: Vec<&str> = claim_texts.iter().map(String::as_str).collect();
            Ok((model.embed_truncated(&docs, args.max_batch)?, model.embed_truncated(&claims, args.max_batch)?))
        })?;
        let secs = t.elapsed().as_secs_f64();
        let n = texts.len() + claims.len();
        println!("truncated recipe: {n} texts in {secs:.1} s ({:.2} ms/text)", secs * 1000.0 / n as f64);
        let score = ndcg_at_10(&docs, &doc_vectors, &claims, &claim_vectors);
        println!("nDCG@10 ({}, each text cut at 256 tokens) = {score:.4}", model.model_id());
    }
    println!("reference for all-MiniLM-L6-v2 (first 256 tokens): 0.649 ± 0.005");
    Ok(())
}

/// Indexes the corpus through the `Embedder` in calls of `call_size` texts, one
/// after another, then embeds all claims in one call, and scores.
async fn score_embedder(
    embedder: &LocalEmbedder,
    args: &Args,
    docs: &[Doc],
    texts: &[String],
    claims: &[Claim],
    claim_texts: &[String],
) -> anyhow::Result<()> {
    let t = Instant::now();
    let mut doc_vectors = Vec::with_capacity(texts.len());
    for chunk in texts.chunks(args.call_size.max(1)) {
        // Documents as the server stores memories; the claims as its queries.
        doc_vectors.extend(embedder.embed_in(chunk, Lane::Background).await?);
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "corpus: {} documents in {secs:.1} s = {:.1} docs/s ({:.2} ms/doc; abstracts average {} chars)",
        texts.len(),
        texts.len() as f64 / secs,
        secs * 1000.0 / texts.len() as f64,
        texts.iter().map(String::len).sum::<usize>() / texts.len().max(1)
    );
    let t = Instant::now();
    let claim_vectors = embedder.embed(claim_texts).await?;
    let secs = t.elapsed().as_secs_f64();
    println!(
        "claims: {} in one call in {secs:.2} s = {:.0} texts/s ({:.2} ms/text)",
        claims.len(),
        claims.len() as f64 / secs,
        secs * 1000.0 / claims.len() as f64
    );
    let score = ndcg_at_10(docs, &doc_vectors, claims, &claim_vectors);
    println!("nDCG@10 (LocalEmbedder, long texts as averaged 256-token windows) = {score:.4}");
    Ok(())
}

/// One text at a time, then many single-text callers at once, then batches.
async fn latency(embedder: &Arc<LocalEmbedder>, claims: &[Claim], n: usize) -> anyhow::Result<()> {
    let texts: Vec<String> = claims.iter().cycle().take(n.max(1)).map(|c| c.text.clone()).collect();
    // Warm up (first calls allocate and fault in the weights).
    for t in texts.iter().take(5) {
        embedder.embed(std::slice::from_ref(t)).await?;
    }
    let mut times = Vec::with_capacity(texts.len());
    for t in &texts {
        let start = Instant::now();
        embedder.embed(std::slice::from_ref(t)).await?;
        times.push(start.elapsed());
    }
    times.sort();
    let pct = |p: f64| times[((times.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1000.0;
    println!(
        "single text, one caller: p50 {:.2} ms, p95 {:.2} ms, max {:.2} ms over {} claims (~{} words each)",
        pct(0.5),
        pct(0.95),
        pct(1.0),
        times.len(),
        texts.iter().map(|t| t.split_whitespace().count()).sum::<usize>() / texts.len()
    );
    for callers in [8usize, 32] {
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for c in 0..callers {
            let embedder = embedder.clone();
            let mine: Vec<String> = texts.iter().skip(c).step_by(callers).cloned().collect();
            tasks.spawn(async move {
                let mut worst = Duration::ZERO;
                for t in &mine {
                    let s = Instant::now();
                    embedder.embed(std::slice::from_ref(t)).await?;
                    worst = worst.max(s.elapsed());
                }
                anyhow::Ok(worst)
            });
        }
        let mut worst = Duration::ZERO;
        while let Some(r) = tasks.join_next().await {
            worst = worst.max(r??);
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "single text, {callers} concurrent callers (batched by the worker): {:.0} texts/s, worst call {:.1} ms",
            texts.len() as f64 / secs,
            worst.as_secs_f64() * 1000.0
        );
    }
    for size in [8usize, 32] {
        let start = Instant::now();
        for chunk in texts.chunks(size) {
            embedder.embed(chunk).await?;
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "batches of {size}: {:.0} texts/s ({:.2} ms/text)",
            texts.len() as f64 / secs,
            secs * 1000.0 / texts.len() as f64
        );
    }
    Ok(())
}

/// nDCG@10 with binary relevance, averaged over claims, by exact cosine search
/// (vectors are unit length, so a dot product).
fn ndcg_at_10(docs: &[Doc], doc_vectors: &[Vec<f32>], claims: &[Claim], claim_vectors: &[Vec<f32>]) -> f64 {
    let mut total = 0.0;
    for (claim, q) in claims.iter().zip(claim_vectors) {
        let mut scored: Vec<(f32, usize)> =
            doc_vectors.iter().enumerate().map(|(i, d)| (d.iter().zip(q).map(|(a, b)| a * b).sum(), i)).collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let dcg: f64 = scored
            .iter()
            .take(10)
            .enumerate()
            .filter(|(_, (_, i))| claim.relevant.contains(&docs[*i].id))
            .map(|(rank, _)| 1.0 / (rank as f64 + 2.0).log2())
            .sum();
        let ideal: f64 = (0..claim.relevant.len().min(10)).map(|rank| 1.0 / (rank as f64 + 2.0).log2()).sum();
        if ideal > 0.0 {
            total += dcg / ideal;
        }
    }
    total / claims.len() as f64
}

fn load_scifact(zip: &Path) -> anyhow::Result<(Vec<Doc>, Vec<Claim>)> {
    let corpus = read_csv(&unzip(zip, "corpus_train.csv")?)?;
    let header = &corpus[0];
    let col = |rows: &[Vec<String>], name: &str| rows[0].iter().position(|h| h == name).context(name.to_string());
    let (id, title, abstract_) = (col(&corpus, "doc_id")?, col(&corpus, "title")?, col(&corpus, "abstract")?);
    anyhow::ensure!(header.len() >= 3, "corpus_train.csv: unexpected header {header:?}");
    let mut docs = Vec::new();
    for row in &corpus[1..] {
        let sentences =
            parse_sentence_list(&row[abstract_]).with_context(|| format!("doc {}: unreadable abstract", row[id]))?;
        docs.push(Doc { id: row[id].clone(), text: format!("{} {}", row[title], sentences.join(" ")) });
    }

    let rows = read_csv(&unzip(zip, "claims_validation.csv")?)?;
    let (cid, text, cited) = (col(&rows, "id")?, col(&rows, "claim")?, col(&rows, "cited_doc_ids")?);
    // One row per (claim, evidence document): merge them by claim id, in first-seen order.
    let mut claims: Vec<(String, Claim)> = Vec::new();
    for row in &rows[1..] {
        let ids = row[cited].trim_matches(|c| c == '[' || c == ']').split([' ', ',']).filter(|s| !s.is_empty());
        let i = match claims.iter().position(|(k, _)| *k == row[cid]) {
            Some(i) => i,
            None => {
                claims.push((row[cid].clone(), Claim { text: row[text].clone(), relevant: Vec::new() }));
                claims.len() - 1
            }
        };
        for d in ids {
            if !claims[i].1.relevant.iter().any(|r| r == d) {
                claims[i].1.relevant.push(d.to_string());
            }
        }
    }
    Ok((docs, claims.into_iter().map(|(_, c)| c).filter(|c| !c.relevant.is_empty()).collect()))
}

fn unzip(zip: &Path, member: &str) -> anyhow::Result<String> {
    let out = match std::process::Command::new("unzip").arg("-p").arg(zip).arg(member).output() {
        Ok(out) if out.status.success() => out,
        _ => std::process::Command::new("python3")
            .args([
                "-c",
                "import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))",
            ])
            .arg(zip)
            .arg(member)
            .output()
            .context("neither unzip nor python3 could be run")?,
    };
    if !out.status.success() {
        bail!("cannot read {member} from {}: {}", zip.display(), String::from_utf8_lossy(&out.stderr));
    }
    String::from_utf8(out.stdout).with_context(|| format!("{member} is not UTF-8"))
}

/// RFC 4180 CSV: quoted fields may hold commas, newlines and doubled quotes.
fn read_csv(text: &str) -> anyhow::Result<Vec<Vec<String>>> {
    let mut rows = Vec::new();
    let (mut row, mut field) = (Vec::new(), String::new());
    let mut chars = text.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut field)),
            (false, '\r') => {}
            (false, '\n') => {
                row.push(std::mem::take(&mut field));
                rows.push(std::mem::take(&mut row));
            }
            (false, c) => field.push(c),
        }
    }
    if quoted {
        bail!("unterminated quoted field");
    }
    if !field.is_empty() || !row.is_empty() {
        row.push(field);
        rows.push(row);
    }
    anyhow::ensure!(!rows.is_empty(), "empty CSV");
    Ok(rows)
}

/// The abstracts are NumPy's repr of an array of strings: `['first.'\n 'it's "x"']`,
/// each element a Python string literal ('…' or "…", backslash escapes).
fn parse_sentence_list(s: &str) -> anyhow::Result<Vec<String>> {
    let inner = s.trim().strip_prefix('[').and_then(|s| s.strip_suffix(']')).context("not a [...] list")?;
    let mut out = Vec::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c.is_whitespace() || c == ',' {
            continue;
        }
        if c != '\'' && c != '"' {
            bail!("expected a string literal, found {c:?}");
        }
        let mut lit = String::new();
        loop {
            match chars.next().context("unterminated string literal")? {
                q if q == c => break,
                '\\' => match chars.next().context("dangling backslash")? {
                    'n' | 't' | 'r' => lit.push(' '),
                    'x' => {
                        let hex: String = chars.by_ref().take(2).collect();
                        lit.push(u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32).unwrap_or(' '));
                    }
                    'u' => {
                        let hex: String = chars.by_ref().take(4).collect();
                        lit.push(u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32).unwrap_or(' '));
                    }
                    other => lit.push(other),
                },
                ch => lit.push(ch),
            }
        }
        out.push(lit);
    }
    Ok(out)
}
