//! Conversational recall of a running engram server on LoCoMo, measured from a
//! client through the public HTTP API.
//!
//! A measuring program, not a test: it prints tables and asserts nothing.
//! `scripts/bench-locomo.sh` starts a release server and runs this against
//! it; results go to `bench/RESULTS.md` by hand.
//!
//!   cargo bench --bench locomo -- --data conversations.json --url http://127.0.0.1:18080
//!       [--api-key K] [--conversations conv-26,conv-30] [--diagnose 10] [--dump answers.jsonl]
//!       [--context-budgets 1000,4000]
//!
//! The data is a LoCoMo JSON file (snap-research, CC BY-NC 4.0; read, never
//! copied): a list of samples with `sample_id`, `conversation` (`session_N` =
//! list of turns `{speaker, dia_id, text, [blip_caption]}`,
//! `session_N_date_time` like "1:56 pm on 8 May, 2023") and `qa`.
//!
//! Loading, deliberately plain (a held-out file is scored with the same
//! loader): one episodic memory per turn, content "Speaker: text" plus
//! " [shares CAPTION]" when the turn has `blip_caption`, `occurred_at` the
//! session's date (read as UTC), `metadata.dia_id` the turn id; one agent
//! (`locomo-{sample_id}-{run}`, a new run suffix each time) and one user
//! (`sample_id`) per conversation. Written in batches of 100.
//!
//! Then every question of categories 1-4 (5, adversarial, is left out) with
//! at least one evidence turn left after normalisation is searched with the
//! server's defaults: agent_id, user_id, query and top_k 50, nothing else.
//! recall@k = share of the question's evidence turns among the first k
//! results, averaged over questions; per category and overall, for the
//! tuning conversations, the reporting conversations and all of them.
//! Latency is the client's (send to last body byte) at concurrency 1; the
//! mean of each leg of the response's `timings` is shown next to it.
//!
//! Searches count as accesses: the server raises the access count of every
//! memory it returns, and the frequency component of the default score grows
//! with it. Questions are therefore asked in file order, once each, so that
//! runs are comparable.
//!
//! `--context-budgets B,...` asks `/v1/context` for every question after the
//! searches (so their figures are unaffected), once per budget of B tokens
//! (`output_reserve_tokens` 0, no system prompt), and reports the share of
//! evidence turns the packed context holds, averaged over questions like
//! recall@k, with the context's latency.
//!
//! `--diagnose N` asks every question again after the measurement (so the
//! numbers above are unaffected) with other weights: the defaults without
//! frequency, relevance alone, and relevance alone with top_k 200 (what the
//! legs reach at all); prints their recall, and shows the first N questions
//! whose evidence the default search missed in its top 10: where the
//! evidence ranked in each, and its score components.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::{DateTime, NaiveDateTime, Utc};
use clap::Parser;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use uuid::Uuid;

#[derive(Parser, Debug)]
#[command(about = "LoCoMo conversational-recall benchmark for a running engram server")]
struct Args {
    /// The LoCoMo JSON file (e.g. conversations-dev.json).
    #[arg(long)]
    data: PathBuf,
    /// Base URL of the server, e.g. http://127.0.0.1:18080
    #[arg(long)]
    url: String,
    /// Sent as `Authorization: Bearer <key>` when the server has API keys.
    #[arg(long)]
    api_key: Option<String>,
    /// Only these conversations (sample ids), comma-separated; default all.
    #[arg(long, value_delimiter = ',')]
    conversations: Vec<String>,
    /// After the measurement: recall with relevance as the only weight, and
    /// the first N questions the default search missed in its top 10.
    #[arg(long, value_name = "N")]
    diagnose: Option<usize>,
    /// Write one JSON line per question (evidence, ranked dia_ids, scores) here.
    #[arg(long, value_name = "PATH")]
    dump: Option<PathBuf>,
    /// After writing, consolidate each conversation's agent (`POST
    /// /v1/consolidation`; run the server with
    /// `ENGRAM_CONSOLIDATION__MIN_AGE_SECS=0`) and report its throughput.
    /// Summaries and facts found by a search count as misses: they are not
    /// evidence turns, so this measures what they cost recall.
    #[arg(long)]
    consolidate: bool,
    /// Queue a consolidation of every conversation's agent and search at
    /// once, without waiting: reports search latency while the jobs run
    /// against after them. Recall from such a run mixes both states.
    #[arg(long, conflicts_with = "consolidate")]
    consolidate_during: bool,
    /// After the searches: for every question, `/v1/context` at each of these
    /// budgets (tokens), and the share of its evidence turns packed.
    #[arg(long, value_delimiter = ',', value_name = "TOKENS")]
    context_budgets: Vec<i64>,
    /// `cargo bench` passes this to every bench binary; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// The conversations tuned on, and the ones kept for reporting.
const TUNING: &[&str] = &["conv-26", "conv-30", "conv-41"];
const REPORTING: &[&str] = &["conv-42", "conv-43"];
const KS: [usize; 5] = [1, 5, 10, 20, 50];
const TOP_K: usize = 50;
const BATCH: usize = 100;
/// The server's largest top_k, for the diagnosis.
const DIAGNOSE_TOP_K: usize = 200;
const CATEGORIES: [(u8, &str); 4] = [(1, "multi-hop"), (2, "temporal"), (3, "open-domain"), (4, "single-hop")];

// --- Loading ----------------------------------------------------------------------------

#[derive(Deserialize)]
struct Sample {
    sample_id: String,
    conversation: Map<String, Value>,
    qa: Vec<Value>,
}

#[derive(Deserialize)]
struct Turn {
    speaker: String,
    dia_id: String,
    text: String,
    #[serde(default)]
    blip_caption: Option<String>,
}

struct Memory {
    dia_id: String,
    content: String,
    occurred_at: DateTime<Utc>,
}

struct Question {
    conversation: usize,
    category: u8,
    text: String,
    /// Normalised, deduplicated, all present in the conversation.
    evidence: Vec<String>,
}

struct Conversation {
    sample_id: String,
    agent_id: String,
    memories: Vec<Memory>,
}

/// "1:56 pm on 8 May, 2023" as UTC.
fn session_date(s: &str) -> anyhow::Result<DateTime<Utc>> {
    let naive = NaiveDateTime::parse_from_str(s.trim(), "%I:%M %p on %d %B, %Y")
        .with_context(|| format!("session date {s:?} is not like \"1:56 pm on 8 May, 2023\""))?;
    Ok(naive.and_utc())
}

/// Evidence ids as written, split on ';' and spaces, "D:11:26" read as
/// "D11:26", without duplicates and ids the conversation does not have.
fn normalise_evidence(raw: &[Value], known: &HashSet<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for piece in raw.iter().filter_map(Value::as_str).flat_map(|s| s.split(|c: char| c == ';' || c.is_whitespace())) {
        let id = match piece.strip_prefix("D:") {
            Some(rest) => format!("D{rest}"),
            None => piece.to_string(),
        };
        if known.contains(&id) && !out.contains(&id) {
            out.push(id);
        }
    }
    out
}

struct Loaded {
    conversations: Vec<Conversation>,
    questions: Vec<Question>,
    /// Questions of categories 1-4 left out for want of valid evidence.
    skipped: usize,
}

fn load(path: &PathBuf, only: &[String], run: &str) -> anyhow::Result<Loaded> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let samples: Vec<Sample> = serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", path.display()))?;
    let mut loaded = Loaded { conversations: Vec::new(), questions: Vec::new(), skipped: 0 };
    for sample in samples {
        if !only.is_empty() && !only.contains(&sample.sample_id) {
            continue;
        }
        let id = &sample.sample_id;
        // session_N in numeric order; the date keys are `session_N_date_time`.
        let mut sessions: Vec<(u32, &Vec<Value>)> = sample
            .conversation
            .iter()
            .filter_map(|(k, v)| {
                let n = k.strip_prefix("session_")?.parse::<u32>().ok()?;
                Some((n, v.as_array()?))
            })
            .collect();
        sessions.sort_by_key(|(n, _)| *n);
        let mut memories = Vec::new();
        let mut known = HashSet::new();
        for (n, turns) in sessions {
            let key = format!("session_{n}_date_time");
            let date =
                sample.conversation.get(&key).and_then(Value::as_str).with_context(|| format!("{id}: no {key}"))?;
            let occurred_at = session_date(date).with_context(|| format!("{id}: {key}"))?;
            for (i, turn) in turns.iter().enumerate() {
                let turn: Turn = serde_json::from_value(turn.clone())
                    .with_context(|| format!("{id}: session_{n} turn {i} is not {{speaker, dia_id, text}}"))?;
                let mut content = format!("{}: {}", turn.speaker, turn.text);
                if let Some(caption) = &turn.blip_caption {
                    content.push_str(&format!(" [shares {caption}]"));
                }
                if !known.insert(turn.dia_id.clone()) {
                    bail!("{id}: dia_id {} appears twice", turn.dia_id);
                }
                memories.push(Memory { dia_id: turn.dia_id, content, occurred_at });
            }
        }
        if memories.is_empty() {
            bail!("{id}: no turns");
        }
        let c = loaded.conversations.len();
        for qa in &sample.qa {
            let category = qa.get("category").and_then(Value::as_u64).unwrap_or(0);
            if !(1..=4).contains(&category) {
                continue;
            }
            let evidence = normalise_evidence(
                qa.get("evidence").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]),
                &known,
            );
            let text = qa.get("question").and_then(Value::as_str).unwrap_or("").to_string();
            if evidence.is_empty() || text.trim().is_empty() {
                loaded.skipped += 1;
                continue;
            }
            loaded.questions.push(Question { conversation: c, category: category as u8, text, evidence });
        }
        loaded.conversations.push(Conversation {
            sample_id: id.clone(),
            agent_id: format!("locomo-{id}-{run}"),
            memories,
        });
    }
    for wanted in only {
        if !loaded.conversations.iter().any(|c| &c.sample_id == wanted) {
            bail!("--conversations: {wanted} is not in {}", path.display());
        }
    }
    if loaded.conversations.is_empty() {
        bail!("{} holds no conversations", path.display());
    }
    Ok(loaded)
}

// --- Talking to the server ----------------------------------------------------------------

struct Api {
    client: reqwest::Client,
    base: String,
}

impl Api {
    async fn post(&self, path: &str, body: &Value) -> anyhow::Result<(Value, Duration)> {
        let t0 = Instant::now();
        let r = self.client.post(format!("{}{path}", self.base)).json(body).send().await?;
        let status = r.status();
        let bytes = r.bytes().await?;
        let elapsed = t0.elapsed();
        if !status.is_success() {
            bail!("POST {path} answered {status}: {}", String::from_utf8_lossy(&bytes));
        }
        Ok((serde_json::from_slice(&bytes).with_context(|| format!("POST {path}: the answer is not JSON"))?, elapsed))
    }

    /// Writes every turn; returns each memory's dia_id by its id.
    async fn write(&self, loaded: &Loaded) -> anyhow::Result<HashMap<String, String>> {
        let total: usize = loaded.conversations.iter().map(|c| c.memories.len()).sum();
        let mut written = 0;
        let mut dia_ids = HashMap::with_capacity(total);
        let started = Instant::now();
        // A bar on a terminal; elsewhere a line per conversation.
        let bar = engram::progress::items("written", Some(total as u64));
        for c in &loaded.conversations {
            for chunk in c.memories.chunks(BATCH) {
                let memories: Vec<Value> = chunk
                    .iter()
                    .map(|m| {
                        json!({
                            "agent_id": c.agent_id,
                            "user_id": c.sample_id,
                            "tier": "episodic",
                            "content": m.content,
                            "occurred_at": m.occurred_at.to_rfc3339(),
                            "metadata": {"dia_id": m.dia_id},
                        })
                    })
                    .collect();
                let (answer, _) = self
                    .post("/v1/memories", &json!({ "memories": memories }))
                    .await
                    .with_context(|| format!("writing {}", c.sample_id))?;
                let written_now = answer.get("memories").and_then(Value::as_array).cloned().unwrap_or_default();
                let n = written_now.len();
                if n != chunk.len() {
                    bail!("writing {}: sent {} memories, the server answered {n}", c.sample_id, chunk.len());
                }
                for (m, sent) in written_now.iter().zip(chunk) {
                    let id = m.get("id").and_then(Value::as_str).context("a written memory has no id")?;
                    dia_ids.insert(id.to_string(), sent.dia_id.clone());
                }
                written += n;
                bar.inc(n as u64);
            }
            if bar.is_hidden() {
                eprintln!("  written {written}/{total} ({} {:.1} s)", c.sample_id, started.elapsed().as_secs_f64());
            }
        }
        bar.finish_and_clear();
        Ok(dia_ids)
    }

    /// The ids of the memories one context packed within `budget` tokens.
    async fn context(&self, c: &Conversation, query: &str, budget: i64) -> anyhow::Result<(Vec<String>, Duration)> {
        let body = json!({"agent_id": c.agent_id, "user_id": c.sample_id, "query": query,
            "max_context_tokens": budget, "output_reserve_tokens": 0});
        let (answer, latency) = self.post("/v1/context", &body).await?;
        let sections = answer.get("sections").and_then(Value::as_object).context("no sections in the answer")?;
        let ids = sections
            .values()
            .filter_map(Value::as_array)
            .flatten()
            .filter_map(|item| item.get("id").and_then(Value::as_str).map(str::to_string))
            .collect();
        Ok((ids, latency))
    }

    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let r = self.client.get(format!("{}{path}", self.base)).send().await?;
        let status = r.status();
        let body: Value = r.json().await.with_context(|| format!("GET {path}: the answer is not JSON"))?;
        if !status.is_success() {
            bail!("GET {path} answered {status}: {body}");
        }
        Ok(body)
    }

    /// Consolidates every conversation's agent, one after another, and
    /// returns (episodes, summaries, facts, groups left, seconds). A job that
    /// ended `failed` only because some groups' model answers stayed
    /// unusable counts: those groups are reported as left, as a server would
    /// leave them for its next run.
    async fn consolidate(&self, loaded: &Loaded) -> anyhow::Result<(u64, u64, u64, u64, f64)> {
        let started = Instant::now();
        let (mut episodes, mut summaries, mut facts, mut left) = (0, 0, 0, 0);
        for c in &loaded.conversations {
            let (job, _) = self.post("/v1/consolidation", &json!({"agent_id": c.agent_id})).await?;
            let path = format!("/v1/consolidation/{}", job["id"].as_str().context("no job id")?);
            let report = loop {
                let job = self.get(&path).await?;
                match job["state"].as_str() {
                    Some("completed") => break job["report"].clone(),
                    Some("failed") if job["report"]["groups_failed"].as_u64().unwrap_or(0) > 0 => {
                        let unusable = job["error"].as_str().unwrap_or("").contains("unusable");
                        anyhow::ensure!(unusable, "consolidating {} failed: {job}", c.sample_id);
                        break job["report"].clone();
                    }
                    Some("failed") => bail!("consolidating {} failed: {job}", c.sample_id),
                    _ => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            };
            let n = |k: &str| report[k].as_u64().unwrap_or(0);
            episodes += n("episodes");
            summaries += n("summaries");
            facts += n("facts") + n("facts_candidates");
            left += n("groups_failed");
            eprintln!("  consolidated {}: {report}", c.sample_id);
        }
        Ok((episodes, summaries, facts, left, started.elapsed().as_secs_f64()))
    }

    /// Queues a consolidation of every conversation's agent; returns the
    /// jobs' paths.
    async fn queue_consolidation(&self, loaded: &Loaded) -> anyhow::Result<Vec<String>> {
        let mut paths = Vec::new();
        for c in &loaded.conversations {
            let (job, _) = self.post("/v1/consolidation", &json!({"agent_id": c.agent_id})).await?;
            paths.push(format!("/v1/consolidation/{}", job["id"].as_str().context("no job id")?));
        }
        Ok(paths)
    }

    /// Waits until every job ended; returns when, and the episodes they took.
    async fn jobs_done(&self, paths: &[String]) -> anyhow::Result<(Instant, u64)> {
        let mut episodes = 0;
        for path in paths {
            loop {
                let job = self.get(path).await?;
                match job["state"].as_str() {
                    Some("completed") => {
                        episodes += job["report"]["episodes"].as_u64().unwrap_or(0);
                        break;
                    }
                    Some("failed") => bail!("a consolidation failed: {job}"),
                    _ => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }
        Ok((Instant::now(), episodes))
    }

    /// The ranked results of one search: dia_id (None when a result has none) and the raw result.
    async fn search(&self, c: &Conversation, query: &str, extra: Option<&Value>) -> anyhow::Result<Searched> {
        let mut body = json!({"agent_id": c.agent_id, "user_id": c.sample_id, "query": query, "top_k": TOP_K});
        if let (Some(Value::Object(extra)), Value::Object(b)) = (extra, &mut body) {
            b.extend(extra.clone());
        }
        let (answer, latency) = self.post("/v1/memories/search", &body).await?;
        let results = answer.get("results").and_then(Value::as_array).context("no results in the answer")?.clone();
        let ranked = results
            .iter()
            .map(|r| r.pointer("/memory/metadata/dia_id").and_then(Value::as_str).map(str::to_string))
            .collect();
        let timings = match answer.get("timings") {
            Some(Value::Object(t)) => t.iter().filter_map(|(k, v)| Some((k.clone(), v.as_f64()?))).collect(),
            _ => BTreeMap::new(),
        };
        Ok(Searched { ranked, results, latency, timings })
    }
}

struct Searched {
    ranked: Vec<Option<String>>,
    results: Vec<Value>,
    latency: Duration,
    timings: BTreeMap<String, f64>,
}

// --- Scoring ------------------------------------------------------------------------------

fn recall_at(evidence: &[String], ranked: &[Option<String>], k: usize) -> f64 {
    let top: HashSet<&str> = ranked.iter().take(k).filter_map(|d| d.as_deref()).collect();
    evidence.iter().filter(|e| top.contains(e.as_str())).count() as f64 / evidence.len() as f64
}

/// 0-based rank of `dia_id` among the results.
fn rank_of(dia_id: &str, ranked: &[Option<String>]) -> Option<usize> {
    ranked.iter().position(|d| d.as_deref() == Some(dia_id))
}

#[derive(Default, Clone)]
struct RecallSum {
    n: usize,
    sums: [f64; KS.len()],
}

impl RecallSum {
    fn add(&mut self, evidence: &[String], ranked: &[Option<String>]) {
        self.n += 1;
        for (s, k) in self.sums.iter_mut().zip(KS) {
            *s += recall_at(evidence, ranked, k);
        }
    }

    fn cells(&self) -> String {
        self.sums.iter().map(|s| format!(" {:.3} |", s / self.n.max(1) as f64)).collect()
    }
}

/// The subsets reported: (name, sample ids or None for all).
fn subsets() -> [(&'static str, Option<&'static [&'static str]>); 3] {
    [("tuning", Some(TUNING)), ("reporting", Some(REPORTING)), ("all", None)]
}

fn in_subset(sample_id: &str, ids: Option<&[&str]>) -> bool {
    ids.is_none_or(|ids| ids.contains(&sample_id))
}

fn recall_table(loaded: &Loaded, ranked: &[Vec<Option<String>>]) -> String {
    let mut out = String::from("| subset | category | questions | R@1 | R@5 | R@10 | R@20 | R@50 |\n");
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|\n");
    for (name, ids) in subsets() {
        let mut per_category: BTreeMap<u8, RecallSum> = BTreeMap::new();
        let mut overall = RecallSum::default();
        for (q, r) in loaded.questions.iter().zip(ranked) {
            if in_subset(&loaded.conversations[q.conversation].sample_id, ids) {
                per_category.entry(q.category).or_default().add(&q.evidence, r);
                overall.add(&q.evidence, r);
            }
        }
        if overall.n == 0 {
            continue;
        }
        for (category, label) in CATEGORIES {
            if let Some(s) = per_category.get(&category) {
                out.push_str(&format!("| {name} | {category} {label} | {} |{}\n", s.n, s.cells()));
            }
        }
        out.push_str(&format!("| **{name}** | **1-4** | **{}** |{}\n", overall.n, overall.cells()));
    }
    out
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// The legs of `timings` in the server's order, then any others it added.
fn timing_legs(searches: &[&Searched]) -> Vec<String> {
    const KNOWN: [&str; 7] =
        ["embedding_ms", "vector_ms", "text_ms", "neighbours_ms", "working_ms", "scoring_ms", "total_ms"];
    let mut legs: Vec<String> = KNOWN.iter().map(|s| s.to_string()).collect();
    for s in searches {
        for k in s.timings.keys() {
            if !legs.contains(k) {
                legs.push(k.clone());
            }
        }
    }
    legs.retain(|leg| searches.iter().any(|s| s.timings.contains_key(leg)));
    legs
}

fn latency_table(loaded: &Loaded, searched: &[Searched]) -> String {
    let legs = timing_legs(&searched.iter().collect::<Vec<_>>());
    let mut out = String::from("| subset | searches | p50 ms | p95 ms |");
    for leg in &legs {
        out.push_str(&format!(" mean {} |", leg.trim_end_matches("_ms").replace('_', " ")));
    }
    out.push_str(&format!("\n|---|---:|---:|---:|{}\n", "---:|".repeat(legs.len())));
    for (name, ids) in subsets() {
        let mine: Vec<&Searched> = loaded
            .questions
            .iter()
            .zip(searched)
            .filter(|(q, _)| in_subset(&loaded.conversations[q.conversation].sample_id, ids))
            .map(|(_, s)| s)
            .collect();
        if mine.is_empty() {
            continue;
        }
        let mut ms: Vec<f64> = mine.iter().map(|s| s.latency.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        out.push_str(&format!(
            "| {name} | {} | {:.2} | {:.2} |",
            mine.len(),
            percentile(&ms, 50.0),
            percentile(&ms, 95.0)
        ));
        for leg in &legs {
            let values: Vec<f64> = mine.iter().filter_map(|s| s.timings.get(leg).copied()).collect();
            out.push_str(&format!(" {:.2} |", values.iter().sum::<f64>() / values.len().max(1) as f64));
        }
        out.push('\n');
    }
    out
}

// --- Diagnosis ----------------------------------------------------------------------------

/// The score weights of the diagnosis passes, in the order of the API's `weights`.
struct Variant {
    name: &'static str,
    top_k: usize,
    /// relevance, recency, importance, frequency, tier_bonus
    weights: [f64; 5],
}

/// The default weights (domain::scoring::Weights::default) with frequency at 0; relevance
/// alone; relevance alone with the server's largest top_k (each leg then returns more
/// candidates: what the legs can reach at all).
const VARIANTS: [Variant; 3] = [
    Variant { name: "defaults, frequency 0", top_k: TOP_K, weights: [0.35, 0.20, 0.20, 0.0, 0.15] },
    Variant { name: "relevance only", top_k: TOP_K, weights: [1.0, 0.0, 0.0, 0.0, 0.0] },
    Variant { name: "relevance only, top_k 200", top_k: DIAGNOSE_TOP_K, weights: [1.0, 0.0, 0.0, 0.0, 0.0] },
];

fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max { s.to_string() } else { format!("{}…", s.chars().take(max).collect::<String>()) }
}

fn components(result: &Value) -> String {
    let c = |k: &str| result.pointer(&format!("/components/{k}")).and_then(Value::as_f64).unwrap_or(f64::NAN);
    format!(
        "score {:.3} = relevance {:.3}, importance {:.2}, frequency {:.3}, recency {:.3}",
        result.get("score").and_then(Value::as_f64).unwrap_or(f64::NAN),
        c("relevance"),
        c("importance"),
        c("frequency"),
        c("recency"),
    )
}

/// Asks every question again with each of [`VARIANTS`]; frequency has no weight in
/// any of them, so the passes do not depend on the accesses of earlier ones.
async fn diagnosis_passes(api: &Api, loaded: &Loaded) -> anyhow::Result<Vec<Vec<Searched>>> {
    let mut passes = Vec::new();
    for v in &VARIANTS {
        eprintln!("diagnose: asking {} questions again ({})", loaded.questions.len(), v.name);
        let [relevance, recency, importance, frequency, tier_bonus] = v.weights;
        let extra = json!({
            "top_k": v.top_k,
            "weights": {"relevance": relevance, "recency": recency, "importance": importance,
                        "frequency": frequency, "tier_bonus": tier_bonus},
        });
        let mut pass = Vec::with_capacity(loaded.questions.len());
        for q in &loaded.questions {
            pass.push(api.search(&loaded.conversations[q.conversation], &q.text, Some(&extra)).await?);
        }
        passes.push(pass);
    }
    Ok(passes)
}

fn diagnose(loaded: &Loaded, searched: &[Searched], passes: &[Vec<Searched>], show: usize) {
    println!();
    println!("Diagnosis: the same questions with other weights (asked after the measurement)");
    println!();
    println!("| weights | top_k | subset | R@1 | R@5 | R@10 | R@20 | R@50 |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    let rows = std::iter::once(("defaults (measured above)", TOP_K, searched))
        .chain(VARIANTS.iter().zip(passes).map(|(v, p)| (v.name, v.top_k, p.as_slice())));
    for (name, top_k, pass) in rows {
        for (subset, ids) in subsets() {
            let mut sum = RecallSum::default();
            for (q, s) in loaded.questions.iter().zip(pass) {
                if in_subset(&loaded.conversations[q.conversation].sample_id, ids) {
                    sum.add(&q.evidence, &s.ranked);
                }
            }
            if sum.n > 0 {
                println!("| {name} | {top_k} | {subset} |{}", sum.cells());
            }
        }
    }
    let reach = passes.last().expect("VARIANTS is not empty");
    let reach_all: f64 =
        loaded.questions.iter().zip(reach).map(|(q, s)| recall_at(&q.evidence, &s.ranked, DIAGNOSE_TOP_K)).sum();
    println!();
    println!(
        "all, relevance only: recall@{DIAGNOSE_TOP_K} {:.3} (evidence the legs return at all)",
        reach_all / loaded.questions.len().max(1) as f64
    );

    // Where the evidence of the default search's misses went.
    let relevance = &passes[1];
    let mut missed = 0;
    let mut absent_default = 0;
    let mut best_relevance = [0usize; 4]; // top 10, top 50, top 200, none
    let mut shown = 0;
    println!();
    println!("Questions with no evidence turn in the default top 10 (the first {show} shown; ranks 1-based):");
    for (i, q) in loaded.questions.iter().enumerate() {
        let default = &searched[i];
        if recall_at(&q.evidence, &default.ranked, 10) > 0.0 {
            continue;
        }
        missed += 1;
        let c = &loaded.conversations[q.conversation];
        let mut lines = Vec::new();
        let mut best = usize::MAX;
        let mut any_default = false;
        for e in &q.evidence {
            let d = rank_of(e, &default.ranked);
            let r = rank_of(e, &relevance[i].ranked);
            let r200 = rank_of(e, &reach[i].ranked);
            any_default |= d.is_some();
            best = best.min(r200.unwrap_or(usize::MAX));
            let content = c.memories.iter().find(|m| &m.dia_id == e).map_or("", |m| m.content.as_str());
            let fmt = |x: Option<usize>, n: usize| x.map_or(format!(">{n}"), |x| (x + 1).to_string());
            let detail = match (d, r200) {
                (Some(d), _) => components(&default.results[d]),
                (None, Some(r)) => format!("(relevance-only search) {}", components(&reach[i].results[r])),
                (None, None) => format!("not in the relevance-only top {DIAGNOSE_TOP_K}"),
            };
            lines.push(format!(
                "    {e}: default #{}, relevance only #{} (#{} with top_k {DIAGNOSE_TOP_K}): {}\n      {detail}",
                fmt(d, TOP_K),
                fmt(r, TOP_K),
                fmt(r200, DIAGNOSE_TOP_K),
                shorten(content, 140)
            ));
        }
        absent_default += usize::from(!any_default);
        best_relevance[match best {
            r if r < 10 => 0,
            r if r < TOP_K => 1,
            r if r < DIAGNOSE_TOP_K => 2,
            _ => 3,
        }] += 1;
        if shown < show {
            shown += 1;
            let label = CATEGORIES.iter().find(|(n, _)| *n == q.category).map_or("", |(_, l)| l);
            println!("- [{} {label}] {}", c.sample_id, q.text);
            if let Some(Some(top)) = default.ranked.first() {
                let content = c.memories.iter().find(|m| &m.dia_id == top).map_or("", |m| m.content.as_str());
                println!("    default #1 {top}: {}\n      {}", shorten(content, 140), components(&default.results[0]));
            }
            for l in lines {
                println!("{l}");
            }
        }
    }
    println!();
    println!(
        "{missed} of {} questions have no evidence turn in the default top 10; {absent_default} of them none in the \
         default top {TOP_K}.",
        loaded.questions.len()
    );
    println!(
        "Their best evidence turn ranked by relevance alone (top_k {DIAGNOSE_TOP_K}): top 10 {}, 11-{TOP_K} {}, \
         {}-{DIAGNOSE_TOP_K} {}, not returned {}.",
        best_relevance[0],
        best_relevance[1],
        TOP_K + 1,
        best_relevance[2],
        best_relevance[3]
    );
}

// --- Main ---------------------------------------------------------------------------------

fn dump(path: &PathBuf, loaded: &Loaded, searched: &[Searched], passes: &[Vec<Searched>]) -> anyhow::Result<()> {
    let mut out = String::new();
    for (i, (q, s)) in loaded.questions.iter().zip(searched).enumerate() {
        let variants: Map<String, Value> =
            VARIANTS.iter().zip(passes).map(|(v, p)| (v.name.to_string(), json!(p[i].ranked))).collect();
        let line = json!({
            "sample_id": loaded.conversations[q.conversation].sample_id,
            "category": q.category,
            "question": q.text,
            "evidence": q.evidence,
            "ranked": s.ranked,
            "scores": s.results.iter().map(|r| json!({"score": r.get("score"), "components": r.get("components")})).collect::<Vec<_>>(),
            "latency_ms": s.latency.as_secs_f64() * 1e3,
            "timings": s.timings,
            "diagnosis": variants,
        });
        out.push_str(&line.to_string());
        out.push('\n');
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let run = Uuid::new_v4().simple().to_string()[..8].to_string();
    let loaded = load(&args.data, &args.conversations, &run)?;
    let turns: usize = loaded.conversations.iter().map(|c| c.memories.len()).sum();
    let mut per_conversation: HashMap<usize, usize> = HashMap::new();
    for q in &loaded.questions {
        *per_conversation.entry(q.conversation).or_default() += 1;
    }
    eprintln!(
        "locomo benchmark: {} conversations ({}), {turns} turns, {} questions of categories 1-4 ({} skipped: no valid \
         evidence), run {run}",
        loaded.conversations.len(),
        loaded
            .conversations
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{} {}", c.sample_id, per_conversation.get(&i).copied().unwrap_or(0)))
            .collect::<Vec<_>>()
            .join(", "),
        loaded.questions.len(),
        loaded.skipped,
    );

    let base = args.url.trim_end_matches('/').to_string();
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(key) = &args.api_key {
        headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {key}").parse().context("--api-key")?);
    }
    let client = reqwest::Client::builder().default_headers(headers).timeout(Duration::from_secs(120)).build()?;
    let ready = client.get(format!("{base}/readyz")).send().await.with_context(|| format!("reaching {base}"))?;
    if !ready.status().is_success() {
        bail!("{base}/readyz answered {}: {}", ready.status(), ready.text().await.unwrap_or_default());
    }
    let api = Api { client, base };

    eprintln!("writing {turns} turns in batches of {BATCH}");
    let dia_ids = api.write(&loaded).await?;

    let consolidated = match args.consolidate {
        true => {
            eprintln!("consolidating {} agents", loaded.conversations.len());
            Some(api.consolidate(&loaded).await?)
        }
        false => None,
    };

    let api = std::sync::Arc::new(api);
    let during = match args.consolidate_during {
        true => {
            let paths = api.queue_consolidation(&loaded).await?;
            eprintln!("queued {} consolidations; searching while they run", paths.len());
            let api = api.clone();
            Some(tokio::spawn(async move { api.jobs_done(&paths).await }))
        }
        false => None,
    };
    let derived_allowed = args.consolidate || args.consolidate_during;

    eprintln!("searching {} questions (top_k {TOP_K}, server defaults)", loaded.questions.len());
    let started = Instant::now();
    let mut searched = Vec::with_capacity(loaded.questions.len());
    let mut began = Vec::with_capacity(loaded.questions.len());
    for (i, q) in loaded.questions.iter().enumerate() {
        let c = &loaded.conversations[q.conversation];
        began.push(Instant::now());
        let s =
            api.search(c, &q.text, None).await.with_context(|| format!("{}: searching {:?}", c.sample_id, q.text))?;
        if !derived_allowed && s.ranked.iter().any(Option::is_none) {
            bail!("{}: a search result has no metadata.dia_id", c.sample_id);
        }
        searched.push(s);
        if (i + 1) % 100 == 0 || i + 1 == loaded.questions.len() {
            eprintln!("  searched {}/{} ({:.1} s)", i + 1, loaded.questions.len(), started.elapsed().as_secs_f64());
        }
    }
    let ranked: Vec<Vec<Option<String>>> = searched.iter().map(|s| s.ranked.clone()).collect();

    println!();
    println!(
        "Recall@k on {} ({} conversations, {turns} turns, {} questions; run {run})",
        args.data.file_name().map_or_else(|| args.data.display().to_string(), |n| n.to_string_lossy().into_owned()),
        loaded.conversations.len(),
        loaded.questions.len()
    );
    println!();
    print!("{}", recall_table(&loaded, &ranked));
    println!();
    if let Some((episodes, summaries, facts, left, secs)) = consolidated {
        println!(
            "Consolidation: {episodes} episodes into {summaries} summaries and {facts} facts in {secs:.1} s \
             ({:.2} episodes/s, one agent at a time); {left} groups left for a later run (model answers unusable)",
            episodes as f64 / secs.max(1e-9)
        );
        println!();
    }
    println!("Search latency (client, concurrency 1) and the mean of the server's timings, ms");
    println!();
    print!("{}", latency_table(&loaded, &searched));
    if let Some(task) = during {
        let (done, episodes) = task.await??;
        let secs = done.duration_since(started).as_secs_f64();
        let split = |while_running: bool| {
            let mut ms: Vec<f64> = searched
                .iter()
                .zip(&began)
                .filter(|(_, b)| (**b < done) == while_running)
                .map(|(s, _)| s.latency.as_secs_f64() * 1e3)
                .collect();
            ms.sort_by(f64::total_cmp);
            (ms.len(), percentile(&ms, 50.0), percentile(&ms, 95.0))
        };
        println!();
        println!(
            "Search latency while consolidation ran ({episodes} episodes, done {secs:.1} s after the first search)"
        );
        println!();
        println!("| searches | n | p50 ms | p95 ms |");
        println!("|---|---:|---:|---:|");
        for (name, flag) in [("while consolidating", true), ("after", false)] {
            let (n, p50, p95) = split(flag);
            println!("| {name} | {n} | {p50:.1} | {p95:.1} |");
        }
    }

    if !args.context_budgets.is_empty() {
        let mut table = String::from(
            "| subset | budget tokens | questions | evidence packed | memories packed mean | p50 ms | p95 ms |\n\
             |---|---:|---:|---:|---:|---:|---:|\n",
        );
        for &budget in &args.context_budgets {
            eprintln!("asking {} questions for a context of {budget} tokens", loaded.questions.len());
            let mut asked = Vec::with_capacity(loaded.questions.len());
            for q in &loaded.questions {
                let c = &loaded.conversations[q.conversation];
                let (ids, latency) = api
                    .context(c, &q.text, budget)
                    .await
                    .with_context(|| format!("{}: context for {:?}", c.sample_id, q.text))?;
                let packed: HashSet<&str> = ids.iter().filter_map(|id| dia_ids.get(id)).map(String::as_str).collect();
                let share =
                    q.evidence.iter().filter(|e| packed.contains(e.as_str())).count() as f64 / q.evidence.len() as f64;
                asked.push((share, ids.len(), latency.as_secs_f64() * 1e3));
            }
            for (name, ids) in subsets() {
                let mine: Vec<&(f64, usize, f64)> = loaded
                    .questions
                    .iter()
                    .zip(&asked)
                    .filter(|(q, _)| in_subset(&loaded.conversations[q.conversation].sample_id, ids))
                    .map(|(_, a)| a)
                    .collect();
                if mine.is_empty() {
                    continue;
                }
                let n = mine.len() as f64;
                let mut ms: Vec<f64> = mine.iter().map(|a| a.2).collect();
                ms.sort_by(f64::total_cmp);
                table.push_str(&format!(
                    "| {name} | {budget} | {} | {:.3} | {:.1} | {:.1} | {:.1} |\n",
                    mine.len(),
                    mine.iter().map(|a| a.0).sum::<f64>() / n,
                    mine.iter().map(|a| a.1 as f64).sum::<f64>() / n,
                    percentile(&ms, 50.0),
                    percentile(&ms, 95.0)
                ));
            }
        }

        println!();
        println!("Context: share of evidence turns packed, and latency (client, concurrency 1)");
        println!();
        print!("{table}");
    }

    let passes = match args.diagnose {
        Some(_) => diagnosis_passes(&api, &loaded).await?,
        None => Vec::new(),
    };
    if let Some(show) = args.diagnose {
        diagnose(&loaded, &searched, &passes, show);
    }
    if let Some(path) = &args.dump {
        dump(path, &loaded, &searched, &passes)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
