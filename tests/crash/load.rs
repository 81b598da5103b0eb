//! A write the server acknowledged survives `kill -9` under load.
//!
//! Writers hammer the server with every kind of write, the server is
//! SIGKILLed while requests are in flight, restarted with the same
//! environment, and every id that came back in a 201 must be readable again.
//! Requests cut off by the kill were never acknowledged and prove nothing
//! either way, so they are only counted.
//!
//! It runs on both backends. With Postgres, working memory lives in Redis,
//! which is not killed here: this checks that the server answers 201 only
//! after Redis has the entry, not Redis's own persistence. With the embedded
//! backend every tier, working memory included, is in the SQLite file the
//! killed process had open.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

use crate::server::{ServerEnv, ServerProcess, free_port, service_url};

/// Concurrent writer tasks.
const WRITERS: usize = 8;
/// Acknowledged ids wanted before the kill.
const ACKED_BEFORE_KILL: usize = 1_000;
/// Upper bound of the random pause between reaching that count and the kill.
const MAX_KILL_DELAY_MS: u64 = 200;
/// The whole write phase, so that a server that stops acknowledging fails the
/// test instead of hanging it.
const WRITE_PHASE_TIMEOUT: Duration = Duration::from_secs(30);

/// Sentences for episodic content; a suffix makes each memory unique.
const EPISODES: &[&str] = &[
    "The user asked to move the dentist appointment from Tuesday to Thursday afternoon.",
    "Booked a table for four at the Italian place near the office for Friday at 7 pm.",
    "The user said the quarterly report draft is due to the finance team by the 15th.",
    "Ran the test suite after the dependency upgrade; two integration tests timed out.",
    "The user mentioned they will be travelling to Lisbon for a conference next month.",
    "Summarised the meeting notes and sent the action items to the project channel.",
];

/// A memory the server acknowledged.
#[derive(Clone)]
struct Acked {
    id: Uuid,
    tier: String,
}

/// What the writers saw, shared between them.
#[derive(Default)]
struct Tally {
    acked: Mutex<Vec<Acked>>,
    acked_count: AtomicUsize,
    requests: AtomicUsize,
    /// Requests that failed before the kill (should stay 0).
    failed_before_kill: AtomicUsize,
    /// Requests cut off by the kill: never acknowledged.
    failed_after_kill: AtomicUsize,
}

/// The body of the `i`-th request of writer `w`: rotates through a single
/// episode, a single fact with unique content, a batch of five episodes and a
/// working-memory entry.
fn request_body(run: &str, w: usize, i: usize) -> Value {
    let agent = format!("crash-{run}-w{w}");
    let sentence = EPISODES[(w + i) % EPISODES.len()];
    match i % 4 {
        0 => json!({"agent_id": agent, "tier": "episodic", "content": format!("{sentence} (#{w}-{i})")}),
        1 => json!({
            "agent_id": agent, "tier": "semantic",
            "content": format!("Fact {run}-{w}-{i}: the user's preferred meeting room is room {i}."),
            "subject": "user", "predicate": format!("preferred_room_{w}_{i}"),
        }),
        2 => json!({"memories": (0..5)
            .map(|k| json!({"agent_id": agent, "tier": "episodic", "user_id": format!("u-{w}"),
                "content": format!("{sentence} (#{w}-{i}.{k})")}))
            .collect::<Vec<_>>()}),
        _ => json!({"agent_id": agent, "tier": "working", "session_id": format!("s-{run}-{w}"),
            "content": format!("Scratch note {i} of writer {w}: {sentence}")}),
    }
}

async fn writer(
    client: reqwest::Client,
    url: String,
    run: String,
    w: usize,
    tally: Arc<Tally>,
    killed: Arc<AtomicBool>,
) {
    let mut i = 0;
    while !killed.load(Ordering::SeqCst) {
        let body = request_body(&run, w, i);
        i += 1;
        tally.requests.fetch_add(1, Ordering::SeqCst);
        // Only a complete 201 with its body counts as acknowledged.
        let answer = async {
            let r = client.post(&url).json(&body).send().await?;
            let status = r.status();
            let text = r.text().await?;
            anyhow::Ok((status, text))
        }
        .await;
        let (status, text) = match answer {
            Ok(a) => a,
            Err(_) if killed.load(Ordering::SeqCst) => {
                tally.failed_after_kill.fetch_add(1, Ordering::SeqCst);
                break;
            }
            Err(e) => {
                tally.failed_before_kill.fetch_add(1, Ordering::SeqCst);
                eprintln!("writer {w}: request failed before the kill: {e:#}");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        assert_eq!(status, reqwest::StatusCode::CREATED, "writer {w}: unexpected answer to {body}: {text}");
        let parsed: Value = serde_json::from_str(&text).expect("a 201 body is JSON");
        let memories = parsed["memories"].as_array().expect("a 201 body has `memories`");
        let acked: Vec<Acked> = memories
            .iter()
            .map(|m| Acked {
                id: m["id"].as_str().and_then(|s| s.parse().ok()).expect("each memory has a UUID id"),
                tier: m["tier"].as_str().expect("each memory has a tier").to_string(),
            })
            .collect();
        let n = acked.len();
        tally.acked.lock().unwrap().extend(acked);
        tally.acked_count.fetch_add(n, Ordering::SeqCst);
    }
}

/// GETs every acknowledged memory; returns those that did not come back
/// intact, each with what was wrong.
async fn missing_after_restart(client: &reqwest::Client, base: &str, acked: Vec<Acked>) -> Vec<(Uuid, String)> {
    let chunk = acked.len().div_ceil(WRITERS).max(1);
    let mut tasks = Vec::new();
    for part in acked.chunks(chunk).map(<[Acked]>::to_vec) {
        let client = client.clone();
        let base = base.to_string();
        tasks.push(tokio::spawn(async move {
            let mut bad = Vec::new();
            for a in part {
                let answer = async {
                    let r = client.get(format!("{base}/v1/memories/{}", a.id)).send().await?;
                    let status = r.status();
                    anyhow::Ok((status, r.text().await?))
                }
                .await;
                match answer {
                    Ok((status, text)) if status == reqwest::StatusCode::OK => {
                        let m: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                        if m["id"] != json!(a.id) || m["tier"] != json!(a.tier) {
                            bad.push((a.id, format!("200 but not the memory written ({} expected): {text}", a.tier)));
                        }
                    }
                    Ok((status, text)) => bad.push((a.id, format!("{status} ({} memory): {text}", a.tier))),
                    Err(e) => bad.push((a.id, format!("request failed: {e:#}"))),
                }
            }
            bad
        }));
    }
    let mut bad = Vec::new();
    for t in tasks {
        bad.extend(t.await.expect("a reader task panicked"));
    }
    bad
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_writes_survive_kill_9_of_the_server() {
    let database_url = service_url("ENGRAM_TEST_DATABASE_URL");
    kill_9_and_restart(database_url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_writes_survive_kill_9_of_the_embedded_server() {
    kill_9_and_restart(String::new()).await;
}

/// Writes until `ACKED_BEFORE_KILL` acknowledgements, kills the server with
/// SIGKILL, restarts it and reads every acknowledged id back.
async fn kill_9_and_restart(database_url: String) {
    let redis_url = service_url("ENGRAM_TEST_REDIS_URL");
    let run = Uuid::new_v4().simple().to_string();
    let data_dir = std::env::temp_dir().join(format!("engram-crash-{run}")).to_string_lossy().into_owned();
    let env = ServerEnv {
        database_url,
        data_dir,
        redis_url,
        listen: format!("127.0.0.1:{}", free_port()),
        tenant: format!("t-crash-{run}"),
        key_prefix: format!("engram-crash-{run}"),
        extra: Vec::new(),
    };
    let started = Instant::now();
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();

    let mut server = ServerProcess::start(&env).unwrap();
    server.wait_ready(&client).await.unwrap();

    let tally = Arc::new(Tally::default());
    let killed = Arc::new(AtomicBool::new(false));
    let url = format!("{}/v1/memories", server.base);
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| tokio::spawn(writer(client.clone(), url.clone(), run.clone(), w, tally.clone(), killed.clone())))
        .collect();

    let deadline = Instant::now() + WRITE_PHASE_TIMEOUT;
    while tally.acked_count.load(Ordering::SeqCst) < ACKED_BEFORE_KILL {
        assert!(
            Instant::now() < deadline,
            "only {} ids acknowledged in {WRITE_PHASE_TIMEOUT:?}",
            tally.acked_count.load(Ordering::SeqCst)
        );
        assert!(!writers.iter().all(|w| w.is_finished()), "every writer stopped before the kill; see above");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let delay = Duration::from_millis(rand::random_range(0..=MAX_KILL_DELAY_MS));
    tokio::time::sleep(delay).await;
    // The flag goes up first so that a writer whose request the kill cuts off
    // knows why; anything acknowledged before or during the kill still counts.
    killed.store(true, Ordering::SeqCst);
    server.kill_9();
    let requests_at_kill = tally.requests.load(Ordering::SeqCst);
    for w in writers {
        w.await.expect("a writer panicked");
    }

    let acked = std::mem::take(&mut *tally.acked.lock().unwrap());
    let mut by_tier = std::collections::BTreeMap::<&str, usize>::new();
    for a in &acked {
        *by_tier.entry(a.tier.as_str()).or_default() += 1;
    }
    eprintln!(
        "crash: killed after {delay:?} past {ACKED_BEFORE_KILL} acks; {requests_at_kill} requests sent, {} ids acknowledged {by_tier:?}, \
         {} requests cut off by the kill, {} failed before it",
        acked.len(),
        tally.failed_after_kill.load(Ordering::SeqCst),
        tally.failed_before_kill.load(Ordering::SeqCst),
    );
    assert_eq!(
        tally.failed_before_kill.load(Ordering::SeqCst),
        0,
        "requests failed while the server was up; see above"
    );

    // Same environment, same address: what a supervisor would do.
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let mut restarted = ServerProcess::start(&env).unwrap();
    restarted.wait_ready(&client).await.unwrap();
    let total = acked.len();
    let missing = missing_after_restart(&client, &restarted.base, acked).await;
    eprintln!(
        "crash: after restart {}/{total} acknowledged ids answer 200, {} do not; whole test {:?}",
        total - missing.len(),
        missing.len(),
        started.elapsed()
    );
    assert!(
        missing.is_empty(),
        "{} of {total} acknowledged memories are gone or changed after kill -9; first few:\n{}",
        missing.len(),
        missing.iter().take(5).map(|(id, why)| format!("  {id}: {why}")).collect::<Vec<_>>().join("\n")
    );
    drop(restarted);
}
