//! The cost of packing a context (src/domain/context.rs) with the server's
//! token counter (`bpe-openai`) against `tiktoken-rs`, on the same candidates
//! in the same run, and whether the two packs are the same.
//!
//!   cargo bench --bench pack -- --data conversations-dev.json [--packs 300] [--budget 3880]
//!
//! The data is a LoCoMo JSON file (read, never copied). Each pack takes the
//! shape of a context at the recall benchmark's 1M shape: the session's 500
//! working-memory entries (a conversation's turns in order) and 200 recalled
//! memories of each persistent tier (turns of every conversation drawn at
//! random), with random scores, packed into `--budget` tokens (3,880: what an
//! 8,000-token context with the default 4,096 reserved for the answer leaves)
//! with the default shares, query a question of the file. The two counters
//! alternate pack by pack. Prints a table, asserts nothing but equality.

use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use chrono::{TimeZone, Utc};
use engram::domain::Tier;
use engram::domain::context::{self, Allocation, Candidate, Packed, Tokenizer};
use engram::domain::tokens::{Bpe, Encoding};
use rand::{Rng, SeedableRng};
use serde_json::Value;
use uuid::Uuid;

/// `tiktoken-rs` behind the packing's trait, as the server counted before;
/// it also counts the texts it is asked to count.
struct Tiktoken(tiktoken_rs::CoreBPE, AtomicUsize);

impl Tokenizer for Tiktoken {
    fn count(&self, text: &str) -> usize {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.0.encode_ordinary(text).len()
    }

    fn at_least(&self, text: &str) -> usize {
        text.split_whitespace().count()
    }

    fn truncate(&self, text: &str, max_tokens: usize) -> String {
        let tokens = self.0.encode_ordinary(text);
        if tokens.len() <= max_tokens {
            return text.to_string();
        }
        let mut n = max_tokens;
        loop {
            if let Ok(s) = self.0.decode(&tokens[..n]) {
                return s;
            }
            if n == 0 {
                return String::new();
            }
            n -= 1;
        }
    }
}

fn main() {
    let (mut data, mut packs, mut budget) = (None, 300usize, 3_880usize);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--data" => data = args.next(),
            "--packs" => packs = args.next().and_then(|v| v.parse().ok()).expect("--packs N"),
            "--budget" => budget = args.next().and_then(|v| v.parse().ok()).expect("--budget N"),
            // cargo bench passes --bench to every bench target.
            _ => {}
        }
    }
    let data = data.expect("--data conversations.json (LoCoMo)");
    let samples: Vec<Value> =
        serde_json::from_slice(&std::fs::read(&data).expect("reading --data")).expect("LoCoMo JSON");

    // Each conversation's turns in order, and every question.
    let mut conversations: Vec<Vec<String>> = Vec::new();
    let mut questions: Vec<String> = Vec::new();
    for sample in &samples {
        let conversation = sample["conversation"].as_object().expect("conversation");
        let mut turns = Vec::new();
        for n in 1.. {
            let Some(session) = conversation.get(&format!("session_{n}")).and_then(Value::as_array) else { break };
            for turn in session {
                turns.push(format!(
                    "{}: {}",
                    turn["speaker"].as_str().unwrap_or(""),
                    turn["text"].as_str().unwrap_or("")
                ));
            }
        }
        conversations.push(turns);
        for qa in sample["qa"].as_array().into_iter().flatten() {
            if let Some(q) = qa["question"].as_str() {
                questions.push(q.to_string());
            }
        }
    }
    let all: Vec<&String> = conversations.iter().flatten().collect();

    let tiktoken = Tiktoken(tiktoken_rs::cl100k_base().expect("cl100k_base"), AtomicUsize::new(0));
    let bpe = Bpe::new(Encoding::Cl100kBase);
    // Load both tables before timing.
    tiktoken.count("warm up");
    bpe.count("warm up");
    tiktoken.1.store(0, Ordering::Relaxed);

    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let epoch = Utc.with_ymd_and_hms(2023, 5, 8, 13, 56, 0).unwrap();
    let (mut old, mut new) = (Vec::with_capacity(packs), Vec::with_capacity(packs));
    let (mut items, mut tokens) = (0usize, 0usize);
    for p in 0..packs {
        let turns = &conversations[p % conversations.len()];
        let query = &questions[rng.random_range(0..questions.len())];
        let mut candidates: Vec<Candidate> = Vec::new();
        let start = rng.random_range(0..turns.len().saturating_sub(500).max(1));
        for (i, turn) in turns.iter().skip(start).take(500).enumerate() {
            candidates.push(candidate(Tier::Working, turn, rng.random(), epoch + chrono::Duration::seconds(i as i64)));
        }
        for tier in [Tier::Episodic, Tier::Semantic, Tier::Procedural] {
            for _ in 0..200 {
                candidates.push(candidate(tier, all[rng.random_range(0..all.len())], rng.random(), epoch));
            }
        }
        let allocation = Allocation::default();
        let time = |tok: &dyn Tokenizer| -> (Packed, Duration) {
            let started = Instant::now();
            let packed = context::pack(&candidates, query, budget, &allocation, tok);
            (packed, started.elapsed())
        };
        // Alternate which goes first.
        let ((a, ta), (b, tb)) = if p % 2 == 0 {
            let a = time(&tiktoken);
            (a, time(&bpe))
        } else {
            let b = time(&bpe);
            (time(&tiktoken), b)
        };
        assert_eq!(a.rendered, b.rendered, "pack {p}: the counters packed differently");
        assert_eq!((a.tokens_used, &a.dropped_ids), (b.tokens_used, &b.dropped_ids), "pack {p}");
        items += b.items.len();
        tokens += b.tokens_used;
        old.push(ta);
        new.push(tb);
    }
    println!(
        "{packs} packs of {} candidates into {budget} tokens; per pack {:.1} memories and {:.0} tokens packed, \
         {:.0} texts counted; identical packs: yes\n",
        500 + 3 * 200,
        items as f64 / packs as f64,
        tokens as f64 / packs as f64,
        tiktoken.1.load(Ordering::Relaxed) as f64 / packs as f64
    );
    println!("| counter | mean ms | p50 ms | p95 ms |");
    println!("|---|---:|---:|---:|");
    for (name, mut times) in [("tiktoken-rs 0.12", old), ("bpe-openai 0.3 (the server's)", new)] {
        times.sort_unstable();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let mean = times.iter().map(|d| ms(*d)).sum::<f64>() / times.len() as f64;
        let at = |q: f64| ms(times[((times.len() as f64 * q) as usize).min(times.len() - 1)]);
        println!("| {name} | {mean:.2} | {:.2} | {:.2} |", at(0.5), at(0.95));
    }
}

fn candidate(tier: Tier, content: &str, score: f64, created_at: chrono::DateTime<Utc>) -> Candidate<'_> {
    Candidate { id: Uuid::new_v4(), tier, content: Cow::Borrowed(content), score, created_at }
}
