//! The data set for the embedded backend, as an `engram import` file: the
//! same rows as the Postgres load (`load::rows_of`: ids, timestamps,
//! retentions, tiers) of the agents given, each with its vector of the
//! server's model, and the agents' working memory (the newest `WORKING_CAP`
//! of a session, live for a week). `scripts/bench-recall.sh --data-dir`
//! writes it once, imports it with `engram import` into the data directory
//! before the server starts, and reuses the directory after.
//!
//! Texts are embedded in order of length, so a batch pads little.

use std::io::{BufWriter, Write};
use std::time::Instant;

use anyhow::Context;
use chrono::{DateTime, Duration, Utc};
use engram::domain::Tier;
use engram::domain::memory::namespace;
use engram::embed::{Embedder, Lane};
use engram::transfer::{FORMAT, VERSION};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::load::{Planned, WORKING_CAP, rows_of, session_of};

/// Texts per call to the embedder (it batches them `max_batch` at a time).
const EMBED_CHUNK: usize = 512;

pub async fn write(
    path: &str,
    tenant: &str,
    planned: &[Planned],
    embedder: &dyn Embedder,
    now: DateTime<Utc>,
) -> anyhow::Result<()> {
    let model = embedder.model_id().to_string();
    let mut records: Vec<Value> = Vec::new();
    let mut counts = serde_json::Map::new();
    for tier in [Tier::Episodic, Tier::Semantic, Tier::Procedural] {
        let rows = rows_of(planned, tier, now);
        counts.insert(tier.as_str().into(), json!(rows.len()));
        for r in rows {
            let mut m = json!({
                "kind": "memory", "id": r.id, "tier": tier.as_str(), "agent_id": r.agent, "user_id": null,
                "session_id": null, "content": r.content, "importance": r.importance, "retention": r.retention.as_str(),
                "metadata": {}, "private": false, "occurred_at": r.occurred_at, "created_at": r.created_at,
                "updated_at": r.created_at, "expires_at": r.expires_at, "access_count": 0, "last_accessed_at": null,
                "embedding_model": model, "content_hash": r.hash,
            });
            match tier {
                Tier::Episodic => {
                    m["session_id"] = json!(r.session_id);
                    m["event_type"] = json!(r.event_type);
                    m["outcome"] = json!(r.outcome);
                }
                Tier::Semantic => {
                    m["namespace"] = json!(namespace(&r.agent, None));
                    m["confidence"] = json!(0.7);
                    m["valid_from"] = json!(r.created_at);
                }
                _ => {
                    let total = r.success_count + r.failure_count;
                    m["skill_name"] = json!(r.skill_name);
                    m["success_count"] = json!(r.success_count);
                    m["failure_count"] = json!(r.failure_count);
                    m["success_rate"] = json!(if total > 0 { r.success_count as f32 / total as f32 } else { 0.0 });
                    m["avg_reward"] = json!(0.0);
                    m["reward_count"] = json!(0);
                    m["version"] = json!(1);
                }
            }
            records.push(m);
        }
    }

    // Vectors, shortest texts first.
    let mut order: Vec<usize> = (0..records.len()).collect();
    order.sort_by_key(|&i| records[i]["content"].as_str().map_or(0, str::len));
    let started = Instant::now();
    let bar = engram::progress::items("export: embedding", Some(records.len() as u64));
    for (done, chunk) in order.chunks(EMBED_CHUNK).enumerate() {
        let texts: Vec<String> =
            chunk.iter().map(|&i| records[i]["content"].as_str().unwrap_or_default().to_string()).collect();
        let vectors = embedder.embed_in(&texts, Lane::Background).await.context("embedding the data set")?;
        for (&i, v) in chunk.iter().zip(vectors) {
            records[i]["vector"] = json!(v);
        }
        let n = ((done + 1) * EMBED_CHUNK).min(records.len());
        bar.inc(chunk.len() as u64);
        if bar.is_hidden() && (done % 20 == 0 || n == records.len()) {
            eprintln!("export: {n} of {} texts embedded in {:.0} s", records.len(), started.elapsed().as_secs_f64());
        }
    }
    bar.finish_and_clear();

    // Working memory: each agent's session keeps its newest WORKING_CAP.
    let mut working = 0;
    let agents: std::collections::BTreeSet<&str> = planned.iter().map(|p| p.agent.as_str()).collect();
    for agent in agents {
        let texts: Vec<&str> =
            planned.iter().filter(|p| p.agent == agent && p.tier == Tier::Working).map(|p| p.text.as_str()).collect();
        let skip = texts.len().saturating_sub(WORKING_CAP);
        for (k, text) in texts.iter().enumerate().skip(skip) {
            let at = now - Duration::seconds((texts.len() - k) as i64);
            records.push(json!({
                "kind": "memory", "id": Uuid::now_v7(), "tier": "working", "agent_id": agent, "user_id": null,
                "session_id": session_of(agent), "content": text, "importance": 0.5, "retention": "session",
                "metadata": {}, "private": false, "occurred_at": at, "created_at": at, "updated_at": at,
                "expires_at": now + Duration::days(7), "access_count": 0, "last_accessed_at": null,
                "embedding_model": null,
            }));
            working += 1;
        }
    }
    counts.insert("working".into(), json!(working));

    let file = std::fs::File::create(path).with_context(|| format!("creating {path}"))?;
    let mut out = BufWriter::new(file);
    let header = json!({"kind": "header", "format": FORMAT, "version": VERSION, "tenant": tenant, "exported_at": now, "vectors": true});
    for line in
        std::iter::once(&header).chain(&records).chain(std::iter::once(&json!({"kind": "end", "counts": counts})))
    {
        serde_json::to_writer(&mut out, line)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    eprintln!("export: {} memories written to {path} ({:?})", records.len(), counts);
    Ok(())
}
