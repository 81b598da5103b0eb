//! The cost of a share: `POST /v1/share` of 20 memories to one agent, end to
//! end through a running server (grant check, reading the memories,
//! redaction, embedding and writing the 20 copies in one transaction).
//!
//! A load generator, not a test: it prints numbers and asserts nothing.
//! `scripts/bench-share.sh` starts the server and runs it:
//!
//!   cargo bench --bench share -- --url URL [--shares 200] [--memories 20]
//!
//! The sender's memories are conversational episodes, each with an e-mail
//! address or a phone number to redact. Each share goes to an agent of its
//! own (`target-<i>`), so no copy deduplicates onto an earlier one: every
//! share writes all its copies. Sequential, one share at a time.

use std::time::Instant;

use anyhow::{Context, bail};
use clap::Parser;
use serde_json::{Value, json};

#[derive(Parser, Debug)]
#[command(about = "Share benchmark")]
struct Args {
    #[arg(long)]
    url: String,
    /// Shares measured (after 10 to warm up).
    #[arg(long, default_value_t = 200)]
    shares: usize,
    /// Memories per share.
    #[arg(long, default_value_t = 20)]
    memories: usize,
    /// `cargo bench` passes this to every bench binary; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

const WARMUP: usize = 10;

fn episode(i: usize) -> String {
    let people = ["Ana", "Bilal", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana"];
    let p = people[i % people.len()];
    match i % 4 {
        0 => format!("{p} asked for the invoice to go to {}.{i}@example.org before Friday.", p.to_lowercase()),
        1 => format!("{p} said to call +44 20 7946 {:04} after 3 pm about the delivery window.", i % 10_000),
        2 => format!("Met {p} about the quarterly plan; agreed to send the draft to {}@example.com.", p.to_lowercase()),
        _ => format!("{p} prefers the morning slot and wants the summary by e-mail, no calls (ticket {i})."),
    }
}

async fn post(http: &reqwest::Client, url: &str, body: &Value) -> anyhow::Result<(u16, Value)> {
    let r = http.post(url).json(body).send().await?;
    let status = r.status().as_u16();
    Ok((status, r.json().await.unwrap_or(Value::Null)))
}

fn percentile(ms: &[f64], p: f64) -> f64 {
    let mut v = ms.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let http = reqwest::Client::new();
    let memories: Vec<Value> = (0..args.memories)
        .map(|i| {
            json!({"agent_id": "sender", "user_id": format!("user-{}", i % 5), "tier": "episodic",
                        "content": episode(i)})
        })
        .collect();
    let (status, written) = post(&http, &format!("{}/v1/memories", args.url), &json!({"memories": memories})).await?;
    if status != 201 {
        bail!("writing the sender's memories: {status} {written}");
    }
    let ids: Vec<Value> =
        written["memories"].as_array().context("written memories")?.iter().map(|m| m["id"].clone()).collect();
    let total = WARMUP + args.shares;
    let targets: Vec<String> = (0..total).map(|i| format!("target-{i}")).collect();
    for chunk in targets.chunks(100) {
        let (status, g) = post(
            &http,
            &format!("{}/v1/share/grants", args.url),
            &json!({"from_agent_id": "sender", "to_agent_ids": chunk}),
        )
        .await?;
        if status != 201 {
            bail!("granting: {status} {g}");
        }
    }
    let mut ms = Vec::with_capacity(args.shares);
    let mut redactions = 0u64;
    for (i, target) in targets.iter().enumerate() {
        let body = json!({"from_agent_id": "sender", "to_agent_ids": [target], "memory_ids": ids});
        let started = Instant::now();
        let (status, out) = post(&http, &format!("{}/v1/share", args.url), &body).await?;
        let took = started.elapsed().as_secs_f64() * 1e3;
        if status != 200 || out["shared"].as_array().map(Vec::len) != Some(args.memories) {
            bail!("share {i}: {status} {out}");
        }
        if i >= WARMUP {
            ms.push(took);
            redactions += out["shared"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|c| c["redactions"].as_object().into_iter().flatten().filter_map(|(_, n)| n.as_u64()))
                .sum::<u64>();
        }
    }
    println!("| shares | memories each | p50 ms | p95 ms | p99 ms | max ms | redactions per share |");
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
        args.shares,
        args.memories,
        percentile(&ms, 50.0),
        percentile(&ms, 95.0),
        percentile(&ms, 99.0),
        percentile(&ms, 100.0),
        redactions as f64 / args.shares as f64
    );
    Ok(())
}
