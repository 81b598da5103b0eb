//! Moving a tenant between backends: `engram export` writes every memory of
//! a tenant as JSON Lines, `engram import` reads such a file into whichever
//! backend is configured. Rows are copied as they are (ids, timestamps,
//! counters, superseded facts), never replayed through the write rules.
//!
//! The format, one JSON object per line, each with a `kind`:
//! - line 1, `header`: `format` ("engram-export"), `version` (1), `tenant`,
//!   `exported_at`, `vectors` (whether records carry their vectors).
//! - `memory`: every field of the memory as the API returns it (`tier` says
//!   which), plus what the API leaves out: `content_hash` (persistent tiers),
//!   `reward_count` (procedural), `consolidated_at` (episodic, once
//!   consolidation took it) and, with `--vectors`, `vector` (its model is
//!   `embedding_model`). Working memory first (session by session, oldest
//!   first), then episodic, semantic and procedural, each oldest first.
//! - last line, `end`: `counts`, records per tier. Its absence means the file
//!   was cut short.
//!
//! Import rules: a memory whose id the tenant already has is skipped (so an
//! import can be run again, or resumed); a memory that has expired is
//! skipped; a memory without a vector is stored without one, and the
//! server's re-embed job (which embeds every row whose `embedding_model` is
//! not the configured model) embeds it. Records go in batches, each
//! persistent batch one transaction; a bad line stops the import before
//! anything of its batch is written.
//!
//! Must not: apply dedup, supersede or upsert rules, or embed anything.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::content::content_hash;
use crate::domain::validate::{self, FieldError};
use crate::domain::{Memory, Tier};
use crate::store::{Cursor, Embedding, Storage, StoredMemory, TransferRow};

pub const FORMAT: &str = "engram-export";
pub const VERSION: u32 = 1;

/// Records read from a backend per query, and written per transaction.
pub const BATCH: usize = 500;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub format: String,
    pub version: u32,
    pub tenant: String,
    pub exported_at: DateTime<Utc>,
    pub vectors: bool,
}

/// One memory of any tier, with the stored fields `Memory` has no place for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryRecord {
    #[serde(flatten)]
    pub memory: Memory,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_count: Option<i32>,
    /// The vector of `embedding_model`, with `--vectors`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vector: Option<Vec<f32>>,
    /// Episodic: when consolidation took it (it is not consolidated again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consolidated_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct End {
    pub counts: BTreeMap<Tier, u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Line {
    Header(Header),
    Memory(Box<MemoryRecord>),
    End(End),
}

fn write_line(out: &mut impl Write, line: &Line) -> anyhow::Result<()> {
    serde_json::to_writer(&mut *out, line).context("encoding a record")?;
    out.write_all(b"\n").context("writing the export")
}

/// Writes every live memory of `tenant` to `out`; returns the counts per tier.
pub async fn export(
    storage: &Storage,
    tenant: &str,
    vectors: bool,
    out: &mut impl Write,
    now: DateTime<Utc>,
) -> anyhow::Result<BTreeMap<Tier, u64>> {
    let header = Header { format: FORMAT.into(), version: VERSION, tenant: tenant.into(), exported_at: now, vectors };
    write_line(out, &Line::Header(header))?;
    let mut counts: BTreeMap<Tier, u64> = Tier::ALL.into_iter().map(|t| (t, 0)).collect();
    let working = storage.transfer.working_entries(tenant).await.context("reading working memory")?;
    let working: Vec<_> = working.into_iter().filter(|m| !m.is_expired(now)).collect();
    // The total, for the bar's time left; rows written meanwhile may make
    // the export a little longer.
    let mut total = working.len() as u64;
    for tier in [Tier::Episodic, Tier::Semantic, Tier::Procedural] {
        total += storage.transfer.export_count(tenant, tier, now).await.context("counting memories")?;
    }
    let bar = crate::progress::items("export", Some(total));
    for memory in working {
        let record =
            MemoryRecord { memory, content_hash: None, reward_count: None, vector: None, consolidated_at: None };
        write_line(out, &Line::Memory(Box::new(record)))?;
        *counts.entry(Tier::Working).or_default() += 1;
        bar.inc(1);
    }
    for tier in [Tier::Episodic, Tier::Semantic, Tier::Procedural] {
        let mut after = None;
        loop {
            let page = storage
                .transfer
                .export_page(tenant, tier, after, BATCH, vectors, now)
                .await
                .with_context(|| format!("reading {} memories", tier.as_str()))?;
            let Some(last) = page.last() else { break };
            after = Some(Cursor { created_at: last.stored.memory.created_at, id: last.stored.memory.id });
            let full = page.len() == BATCH;
            for TransferRow { stored, consolidated_at } in page {
                let record = MemoryRecord {
                    memory: stored.memory,
                    content_hash: Some(stored.content_hash),
                    reward_count: stored.reward_count,
                    vector: stored.embedding.map(|e| e.vector),
                    consolidated_at,
                };
                write_line(out, &Line::Memory(Box::new(record)))?;
                *counts.entry(tier).or_default() += 1;
                bar.inc(1);
            }
            if !full {
                break;
            }
        }
    }
    write_line(out, &Line::End(End { counts: counts.clone() }))?;
    out.flush().context("writing the export")?;
    bar.finish_and_clear();
    Ok(counts)
}

/// What an import did, per tier.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierSummary {
    pub imported: u64,
    pub skipped_existing: u64,
    pub skipped_expired: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportSummary {
    pub tenant: String,
    pub tiers: BTreeMap<Tier, TierSummary>,
    /// Whether the file ended with its `end` record.
    pub complete: bool,
}

impl std::fmt::Display for ImportSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "tenant {}", self.tenant)?;
        writeln!(f, "{:<12}{:>10}{:>18}{:>18}", "tier", "imported", "skipped existing", "skipped expired")?;
        for tier in Tier::ALL {
            let s = self.tiers.get(&tier).cloned().unwrap_or_default();
            writeln!(f, "{:<12}{:>10}{:>18}{:>18}", tier.as_str(), s.imported, s.skipped_existing, s.skipped_expired)?;
        }
        if !self.complete {
            writeln!(f, "warning: the file has no end record; it may have been cut short")?;
        }
        Ok(())
    }
}

/// Checks a record and turns it into what the store takes; `Err` says what
/// is wrong (the caller adds the line number).
fn prepare(record: MemoryRecord) -> anyhow::Result<Result<TransferRow, Memory>> {
    let m = &record.memory;
    anyhow::ensure!((0.0..=1.0).contains(&m.importance), "importance {} is not between 0 and 1", m.importance);
    if let Some(c) = m.confidence {
        anyhow::ensure!((0.0..=1.0).contains(&c), "confidence {c} is not between 0 and 1");
    }
    storable(m).map_err(|e| anyhow::anyhow!("{}: {}", e.field, e.message))?;
    match m.tier {
        Tier::Working => return Ok(Err(record.memory)),
        Tier::Episodic => anyhow::ensure!(m.event_type.is_some(), "an episodic memory needs event_type"),
        Tier::Semantic => anyhow::ensure!(m.valid_from.is_some(), "a semantic memory needs valid_from"),
        Tier::Procedural => anyhow::ensure!(
            m.skill_name.is_some()
                && m.success_count.is_some()
                && m.failure_count.is_some()
                && m.avg_reward.is_some()
                && m.version.is_some(),
            "a procedural memory needs skill_name, success_count, failure_count, avg_reward and version"
        ),
    }
    let embedding = match record.vector {
        Some(vector) => {
            let model = m.embedding_model.clone().context("a vector needs its embedding_model")?;
            anyhow::ensure!(!vector.is_empty(), "the vector is empty");
            anyhow::ensure!(vector.iter().all(|x| x.is_finite()), "the vector has a value that is not a number");
            Some(Embedding { model, vector })
        }
        None => None,
    };
    let mut memory = record.memory;
    // Stored without a vector, a memory names no model: the re-embed job
    // gives it the configured model's vector.
    if embedding.is_none() {
        memory.embedding_model = None;
    }
    let content_hash = record.content_hash.unwrap_or_else(|| content_hash(&memory.content));
    let consolidated_at = record.consolidated_at.filter(|_| memory.tier == Tier::Episodic);
    let stored = StoredMemory { memory, content_hash, reward_count: record.reward_count, embedding };
    Ok(Ok(TransferRow { stored, consolidated_at }))
}

/// The API's rule for stored text: no NUL, which Postgres cannot hold. A
/// file from a server that took it (the embedded backend once did) stops
/// here, naming the field, on either backend, instead of in the database.
fn storable(m: &Memory) -> Result<(), FieldError> {
    let texts = [
        ("/agent_id", Some(&m.agent_id)),
        ("/user_id", m.user_id.as_ref()),
        ("/session_id", m.session_id.as_ref()),
        ("/content", Some(&m.content)),
        ("/subject", m.subject.as_ref()),
        ("/predicate", m.predicate.as_ref()),
        ("/object", m.object.as_ref()),
        ("/skill_name", m.skill_name.as_ref()),
        ("/trigger_pattern", m.trigger_pattern.as_ref()),
    ];
    for (field, text) in texts {
        text.map_or(Ok(()), |t| validate::storable(field, t))?;
    }
    for (key, value) in &m.metadata {
        validate::storable("/metadata", key)?;
        validate::storable_json(&format!("/metadata/{}", key.replace('~', "~0").replace('/', "~1")), value)?;
    }
    for (field, value) in [("/policy", &m.policy), ("/tool_sequence", &m.tool_sequence)] {
        value.as_ref().map_or(Ok(()), |v| validate::storable_json(field, v))?;
    }
    Ok(())
}

/// One batch of parsed records, not yet written.
#[derive(Default)]
struct Batch {
    persistent: Vec<TransferRow>,
    working: Vec<Memory>,
}

impl Batch {
    fn len(&self) -> usize {
        self.persistent.len() + self.working.len()
    }
}

/// Reads an export from `input` into `storage`, for `tenant` (else the
/// header's tenant).
pub async fn import(
    storage: &Storage,
    tenant: Option<&str>,
    input: impl BufRead,
    now: DateTime<Utc>,
) -> anyhow::Result<ImportSummary> {
    let mut summary = ImportSummary::default();
    let lines = input.lines().enumerate().map(|(i, l)| (i + 1, l));
    let mut batch = Batch::default();
    let mut header_seen = false;
    let mut seen: BTreeMap<Tier, u64> = BTreeMap::new();
    for (n, line) in lines {
        let line = line.with_context(|| format!("reading line {n}"))?;
        if line.trim().is_empty() {
            continue;
        }
        anyhow::ensure!(!summary.complete, "line {n}: records after the end record");
        let parsed: Line = serde_json::from_str(&line).with_context(|| format!("line {n}: not an export record"))?;
        match parsed {
            Line::Header(h) => {
                anyhow::ensure!(!header_seen, "line {n}: a second header");
                anyhow::ensure!(
                    h.format == FORMAT && h.version == VERSION,
                    "line {n}: format {:?} version {} is not {FORMAT:?} version {VERSION}",
                    h.format,
                    h.version
                );
                header_seen = true;
                summary.tenant = tenant.unwrap_or(&h.tenant).to_string();
                for t in Tier::ALL {
                    summary.tiers.insert(t, TierSummary::default());
                }
            }
            _ if !header_seen => anyhow::bail!("line {n}: not an engram export (the first record must be the header)"),
            Line::Memory(record) => {
                let tier = record.memory.tier;
                *seen.entry(tier).or_default() += 1;
                if record.memory.is_expired(now) {
                    summary.tiers.entry(tier).or_default().skipped_expired += 1;
                    continue;
                }
                match prepare(*record).with_context(|| format!("line {n}"))? {
                    Ok(stored) => batch.persistent.push(stored),
                    Err(working) => batch.working.push(working),
                }
                if batch.len() >= BATCH {
                    write_batch(storage, &mut summary, std::mem::take(&mut batch), now).await?;
                }
            }
            Line::End(end) => {
                for t in Tier::ALL {
                    let (expected, got) =
                        (end.counts.get(&t).copied().unwrap_or(0), seen.get(&t).copied().unwrap_or(0));
                    anyhow::ensure!(
                        expected == got,
                        "line {n}: the end record counts {expected} {} memories but the file holds {got}",
                        t.as_str()
                    );
                }
                summary.complete = true;
            }
        }
    }
    anyhow::ensure!(header_seen, "the input is empty: not an engram export");
    write_batch(storage, &mut summary, batch, now).await?;
    Ok(summary)
}

async fn write_batch(
    storage: &Storage,
    summary: &mut ImportSummary,
    batch: Batch,
    now: DateTime<Utc>,
) -> anyhow::Result<()> {
    let tenant = summary.tenant.clone();
    if !batch.persistent.is_empty() {
        let inserted = storage.transfer.import_batch(&tenant, &batch.persistent).await?;
        for (row, inserted) in batch.persistent.iter().zip(inserted) {
            let s = summary.tiers.entry(row.stored.memory.tier).or_default();
            if inserted {
                s.imported += 1;
            } else {
                s.skipped_existing += 1;
            }
        }
    }
    if !batch.working.is_empty() {
        // Working memory has no transactions across entries (Redis); an entry
        // whose id is present is skipped, so a failed batch can be re-run.
        let working = &storage.working;
        let mut fresh = Vec::with_capacity(batch.working.len());
        for m in batch.working {
            if working.get(&tenant, m.id).await.context("reading working memory")?.is_some() {
                summary.tiers.entry(Tier::Working).or_default().skipped_existing += 1;
            } else {
                fresh.push(m);
            }
        }
        if !fresh.is_empty() {
            working.append(&tenant, &fresh, now).await.context("writing working memory")?;
        }
        summary.tiers.entry(Tier::Working).or_default().imported += fresh.len() as u64;
    }
    Ok(())
}
