//! A batch committed to Postgres whose working entry never reached Redis,
//! because the server was killed in between, ends up whole and once.
//!
//! Made deterministic without fault injection in the server: the server gets
//! a Redis of its own, which the test freezes with SIGSTOP. A batch then
//! commits to Postgres and its working-memory write waits on the frozen Redis
//! (the Redis timeout is set far beyond the test's steps, so the server is
//! still waiting when it is killed); the test sees the commit in Postgres,
//! kills the server with SIGKILL, thaws Redis and restarts the server on the
//! same database and Redis. A thawed Redis may still run what the killed
//! server had already sent (the entry without its session list): that is the
//! half-written state a real crash can leave too, and the retry and the
//! outbox job must complete it without writing anything twice.
//!
//! Postgres and Redis only: with the embedded backend working memory is in
//! the same SQLite file, and `load` covers its crashes.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::server::{OwnDatabase, OwnRedis, ServerEnv, ServerProcess, free_port};

/// How long the test waits for something it polls (a commit, the outbox job).
const POLL_TIMEOUT: Duration = Duration::from_secs(30);
/// The outbox job runs every second here (10 s by default) and writes
/// entries at least 5 s old.
const OUTBOX_INTERVAL_SECS: &str = "1";

/// Batch `n`: one working entry and three persistent memories.
fn batch(run: &str, n: &str) -> Value {
    let m = |tier: &str, text: String| json!({"agent_id": "outbox", "session_id": "s", "tier": tier, "content": text});
    json!({"memories": [
        m("working", format!("Working note {n} of run {run}.")),
        m("episodic", format!("Episode one of batch {n}, run {run}.")),
        m("episodic", format!("Episode two of batch {n}, run {run}.")),
        {"agent_id": "outbox", "tier": "semantic", "content": format!("Batch {n} of run {run} was written once."),
            "subject": "batch", "predicate": format!("written_{n}")},
    ]})
}

async fn count(db: &PgPool, sql: &'static str, tenant: &str) -> i64 {
    sqlx::query_scalar(sql).bind(tenant).fetch_one(db).await.unwrap()
}

/// Rows of a tenant per table that a batch writes.
async fn rows(db: &PgPool, tenant: &str) -> [i64; 4] {
    [
        count(db, "SELECT count(*) FROM episodic_memory WHERE tenant_id = $1", tenant).await,
        count(db, "SELECT count(*) FROM semantic_memory WHERE tenant_id = $1", tenant).await,
        count(db, "SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1", tenant).await,
        count(db, "SELECT count(*) FROM working_outbox WHERE tenant_id = $1", tenant).await,
    ]
}

async fn outbox_of(db: &PgPool, tenant: &str, key: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM working_outbox WHERE tenant_id = $1 AND idempotency_key = $2")
        .bind(tenant)
        .bind(key)
        .fetch_one(db)
        .await
        .unwrap()
}

/// The response the server remembered for a key when it committed the batch.
async fn remembered(db: &PgPool, tenant: &str, key: &str) -> (i16, Value) {
    sqlx::query_as("SELECT status, response FROM idempotency_keys WHERE tenant_id = $1 AND key = $2")
        .bind(tenant)
        .bind(key)
        .fetch_one(db)
        .await
        .unwrap()
}

/// The ids of a write response's memories of one tier.
fn ids_of(body: &Value, tier: &str) -> Vec<String> {
    body["memories"]
        .as_array()
        .expect("a write response has `memories`")
        .iter()
        .filter(|m| m["tier"] == tier)
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect()
}

/// POSTs batch `n` with its key; returns the status, whether the answer says
/// it is a replay, and the body.
async fn send(client: &reqwest::Client, base: &str, run: &str, n: &str) -> anyhow::Result<(u16, bool, Value)> {
    let r = client
        .post(format!("{base}/v1/memories"))
        .header("idempotency-key", format!("key-{n}"))
        .json(&batch(run, n))
        .send()
        .await?;
    let status = r.status().as_u16();
    let replayed = r.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
    Ok((status, replayed, r.json().await?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_committed_before_a_kill_9_gets_its_working_entry_once_from_the_retry_or_the_outbox() {
    if std::env::var("ENGRAM_TEST_BACKEND").as_deref() == Ok("embedded") {
        eprintln!("skipped on the embedded backend: the outbox between Postgres and Redis is Postgres-only");
        return;
    }
    // A database of its own: the outbox job of any server on a database
    // takes the entries of every tenant there, and another test's server
    // would write them to its own Redis, not this one.
    let own = OwnDatabase::create().await;
    let database_url = own.url.clone();
    let redis = OwnRedis::start();
    let run = Uuid::new_v4().simple().to_string();
    let env = ServerEnv {
        database_url: database_url.clone(),
        data_dir: String::new(),
        redis_url: redis.url(),
        listen: format!("127.0.0.1:{}", free_port()),
        tenant: format!("t-outbox-{run}"),
        key_prefix: format!("engram-outbox-{run}"),
        extra: vec![
            // A frozen Redis answers nothing: the working-memory write must
            // still be waiting when the server is killed.
            ("ENGRAM_REDIS__TIMEOUT_MS", "120000".into()),
            ("ENGRAM_REDIS__OUTBOX_INTERVAL_SECS", OUTBOX_INTERVAL_SECS.into()),
        ],
    };
    let tenant = env.tenant.clone();
    let db = PgPool::connect(&database_url).await.unwrap();
    let client = reqwest::Client::builder().timeout(Duration::from_secs(180)).build().unwrap();
    let mut server = ServerProcess::start(&env).unwrap();
    server.wait_ready(&client).await.unwrap();

    // Two batches commit and wait on the frozen Redis.
    redis.freeze();
    let requests: Vec<_> = ["a", "b"]
        .map(|n| {
            tokio::spawn({
                let (client, base, run) = (client.clone(), server.base.clone(), run.clone());
                async move { send(&client, &base, &run, n).await }
            })
        })
        .into();
    let deadline = Instant::now() + POLL_TIMEOUT;
    loop {
        let r = rows(&db, &tenant).await;
        if r == [4, 2, 2, 2] {
            break;
        }
        assert!(Instant::now() < deadline, "the batches did not commit: rows {r:?}");
        assert!(!requests.iter().any(|t| t.is_finished()), "a request was answered while Redis was frozen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Committed: outbox, memories and idempotency records in one transaction.
    let working_ids: BTreeSet<String> =
        sqlx::query_scalar::<_, Uuid>("SELECT id FROM working_outbox WHERE tenant_id = $1")
            .bind(&tenant)
            .fetch_all(&db)
            .await
            .unwrap()
            .into_iter()
            .map(|id| id.to_string())
            .collect();

    server.kill_9();
    for t in requests {
        let answer = t.await.expect("a request task panicked");
        assert!(answer.is_err(), "the kill came after an answer, not between commit and Redis: {answer:?}");
    }
    redis.thaw();
    tokio::time::sleep(Duration::from_millis(200)).await; // what the killed server sent, if anything, runs
    let prefix = format!("{}:{tenant}", env.key_prefix);
    let tag = format!("{{{tenant}:outbox:s}}");
    let session = format!("{prefix}:wm:l:{tag}");
    eprintln!(
        "crash: killed between commit and Redis; thawed, Redis held {} of 2 entries and {} session ids",
        redis.lines(&["--scan", "--pattern", &format!("{prefix}:wm:e:*")]).len(),
        redis.lines(&["lrange", &session, "0", "-1"]).len(),
    );

    let mut server = ServerProcess::start(&env).unwrap();
    server.wait_ready(&client).await.unwrap();

    // Batch a: its retry writes the working entry before it answers, and
    // answers what the first request would have.
    let (status, replayed, body) = send(&client, &server.base, &run, "a").await.unwrap();
    let (first_status, first_body) = remembered(&db, &tenant, "key-a").await;
    assert_eq!((status, replayed), (first_status as u16, true), "{body}");
    assert_eq!(status, 201);
    assert_eq!(body, first_body);
    assert_eq!(outbox_of(&db, &tenant, "key-a").await, 0, "the retry left its entry in the outbox");

    // Batch b: nobody retries; the outbox job writes its entry.
    let deadline = Instant::now() + POLL_TIMEOUT;
    while outbox_of(&db, &tenant, "key-b").await > 0 {
        assert!(Instant::now() < deadline, "the outbox job did not write batch b's entry within {POLL_TIMEOUT:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // And a late retry of either changes nothing.
    let mut persistent = BTreeSet::new();
    let mut replayed_working = BTreeSet::new();
    for n in ["a", "b", "a"] {
        let (status, replayed, body) = send(&client, &server.base, &run, n).await.unwrap();
        assert_eq!((status, replayed), (201, true), "{body}");
        assert_eq!(body, remembered(&db, &tenant, &format!("key-{n}")).await.1);
        persistent.extend(ids_of(&body, "episodic"));
        persistent.extend(ids_of(&body, "semantic"));
        replayed_working.extend(ids_of(&body, "working"));
    }
    assert_eq!(replayed_working, working_ids, "the responses name the entries the outbox held");

    // Postgres: each persistent memory once, both records, an empty outbox.
    assert_eq!(rows(&db, &tenant).await, [4, 2, 2, 0], "episodic, semantic, idempotency, outbox rows");
    let stored: BTreeSet<String> = sqlx::query_scalar::<_, Uuid>(
        "SELECT id FROM episodic_memory WHERE tenant_id = $1 \
         UNION ALL SELECT id FROM semantic_memory WHERE tenant_id = $1",
    )
    .bind(&tenant)
    .fetch_all(&db)
    .await
    .unwrap()
    .into_iter()
    .map(|id| id.to_string())
    .collect();
    assert_eq!(stored, persistent, "the stored memories are the ones the responses name");

    // Redis, read directly: each entry once, whole, and in its session once;
    // nothing else.
    let session_ids = redis.lines(&["lrange", &session, "0", "-1"]);
    let mut sorted = session_ids.clone();
    sorted.sort();
    assert_eq!(sorted, working_ids.iter().cloned().collect::<Vec<_>>(), "the session list: {session_ids:?}");
    let mut keys = redis.lines(&["--scan", "--pattern", "*"]);
    keys.sort();
    // Each entry, its pointer (for reads by id) and the session list.
    let mut expected: Vec<String> = working_ids
        .iter()
        .flat_map(|id| [format!("{prefix}:wm:e:{tag}:{id}"), format!("{prefix}:wm:p:{id}")])
        .collect();
    expected.push(session.clone());
    expected.sort();
    assert_eq!(keys, expected, "the keys in Redis");
    for n in ["a", "b"] {
        let want = format!("Working note {n} of run {run}.");
        let found: Vec<Value> = working_ids
            .iter()
            .map(|id| serde_json::from_str(&redis.cli(&["get", &format!("{prefix}:wm:e:{tag}:{id}")])).unwrap())
            .filter(|m: &Value| m["content"] == want)
            .collect();
        assert_eq!(found.len(), 1, "batch {n}'s working entry: {found:?}");
    }
    db.close().await;
    drop(server);
    own.drop().await;
}
