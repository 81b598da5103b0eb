//! A consolidation killed with `kill -9` in the middle of its groups loses
//! nothing and repeats nothing: each group's summary is written with its
//! episodes' mark in one transaction, so after a restart a new run takes
//! exactly the episodes the killed one had not reached. Both backends.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

use crate::server::{OwnDatabase, ServerEnv, ServerProcess, free_port, service_url};

const EPISODES: usize = 1_200;
/// Episodes per session; a session's episodes are summarised two by two.
const SESSION: usize = 40;
const BATCH: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consolidation_killed_mid_run_resumes_each_episode_once_on_postgres() {
    let db = OwnDatabase::create().await;
    kill_mid_consolidation(db.url.clone()).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consolidation_killed_mid_run_resumes_each_episode_once_on_the_embedded_backend() {
    kill_mid_consolidation(String::new()).await;
}

/// (episodes marked consolidated, summaries, source ids the summaries list,
/// distinct source ids among them), read in the store itself.
async fn progress(env: &ServerEnv) -> (i64, i64, i64, i64) {
    if env.database_url.is_empty() {
        let file = std::path::Path::new(&env.data_dir).join("engram.db");
        let options = sqlx::sqlite::SqliteConnectOptions::new().filename(file).read_only(true);
        let db = sqlx::SqlitePool::connect_with(options).await.unwrap();
        let marked: (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE consolidated_at IS NOT NULL AND json_extract(metadata, '$.consolidation') IS NULL), \
                    count(*) FILTER (WHERE json_extract(metadata, '$.consolidation') IS NOT NULL) \
             FROM memories WHERE tenant_id = ?1 AND tier = 'episodic'",
        )
        .bind(&env.tenant)
        .fetch_one(&db)
        .await
        .unwrap();
        let listed: (i64, i64) = sqlx::query_as(
            "SELECT count(s.value), count(DISTINCT s.value) FROM memories m, \
                    json_each(json_extract(m.metadata, '$.consolidation.source_episode_ids')) s \
             WHERE m.tenant_id = ?1 AND m.tier = 'episodic'",
        )
        .bind(&env.tenant)
        .fetch_one(&db)
        .await
        .unwrap();
        db.close().await;
        (marked.0, marked.1, listed.0, listed.1)
    } else {
        let db = sqlx::PgPool::connect(&env.database_url).await.unwrap();
        // One statement, so one snapshot: the killed server's Postgres backend
        // may still commit its last transaction (an episode marked with its
        // summary) until it notices the closed socket, and two reads could
        // fall on either side of that commit.
        let counts: (i64, i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM episodic_memory WHERE tenant_id = $1 \
                        AND consolidated_at IS NOT NULL AND NOT metadata ? 'consolidation'), \
                    (SELECT count(*) FROM episodic_memory WHERE tenant_id = $1 AND metadata ? 'consolidation'), \
                    l.n, l.d \
             FROM (SELECT count(s) AS n, count(DISTINCT s) AS d FROM episodic_memory m, \
                          jsonb_array_elements_text(m.metadata -> 'consolidation' -> 'source_episode_ids') s \
                   WHERE m.tenant_id = $1) AS l",
        )
        .bind(&env.tenant)
        .fetch_one(&db)
        .await
        .unwrap();
        db.close().await;
        counts
    }
}

async fn consolidate(client: &reqwest::Client, base: &str) -> String {
    let r = client.post(format!("{base}/v1/consolidation")).json(&json!({"agent_id": "crash-c"})).send().await.unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::ACCEPTED);
    r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string()
}

async fn kill_mid_consolidation(database_url: String) {
    let redis_url = service_url("ENGRAM_TEST_REDIS_URL");
    let run = Uuid::new_v4().simple().to_string();
    let data_dir =
        std::env::temp_dir().join(format!("engram-crash-consolidation-{run}")).to_string_lossy().into_owned();
    let env = ServerEnv {
        database_url,
        data_dir: data_dir.clone(),
        redis_url,
        listen: format!("127.0.0.1:{}", free_port()),
        tenant: format!("t-crash-consolidation-{run}"),
        key_prefix: format!("engram-crash-consolidation-{run}"),
        extra: vec![
            ("ENGRAM_CONSOLIDATION__MIN_AGE_SECS", "0".into()),
            ("ENGRAM_CONSOLIDATION__GROUP_SIZE", "2".into()),
            // One batch: a session is never split between batches, so its
            // episodes pair up the same way before and after the kill.
            ("ENGRAM_CONSOLIDATION__BATCH_SIZE", "5000".into()),
        ],
    };
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let mut server = ServerProcess::start(&env).unwrap();
    server.wait_ready(&client).await.unwrap();
    for from in (0..EPISODES).step_by(BATCH) {
        let memories: Vec<Value> = (from..from + BATCH)
            .map(|i| {
                json!({"agent_id": "crash-c", "session_id": format!("s{}", i / SESSION), "tier": "episodic",
                       "content": format!("Step {i}: we decided to retry the deploy of build {i} after the timeout.")})
            })
            .collect();
        let r = client.post(format!("{}/v1/memories", server.base)).json(&json!({"memories": memories})).send().await;
        assert_eq!(r.unwrap().status(), reqwest::StatusCode::CREATED);
    }

    consolidate(&client, &server.base).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while progress(&env).await.0 == 0 {
        assert!(Instant::now() < deadline, "the run consolidated nothing");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    server.kill_9();
    let (marked, summaries, listed, distinct) = progress(&env).await;
    eprintln!("crash: killed with {marked} of {EPISODES} episodes consolidated into {summaries} summaries");
    assert!((marked as usize) < EPISODES, "the kill came after the run");
    assert_eq!((listed, distinct), (marked, marked), "a summary for every marked episode, and only for those");

    // The killed job is left running until it is stale; a new one takes
    // what the first had not reached.
    let mut restarted = ServerProcess::start(&env).unwrap();
    restarted.wait_ready(&client).await.unwrap();
    let id = consolidate(&client, &restarted.base).await;
    let deadline = Instant::now() + Duration::from_secs(300);
    let job = loop {
        let got: Value =
            client.get(format!("{}/v1/consolidation/{id}", restarted.base)).send().await.unwrap().json().await.unwrap();
        if got["state"] == "completed" {
            break got;
        }
        assert_ne!(got["state"], "failed", "{got}");
        assert!(Instant::now() < deadline, "the second run did not complete: {got}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(job["report"]["episodes"], json!(EPISODES as i64 - marked), "{job}");
    drop(restarted);
    let (marked, summaries, listed, distinct) = progress(&env).await;
    assert_eq!(marked, EPISODES as i64, "every episode consolidated");
    assert_eq!((listed, distinct), (marked, marked), "each episode in exactly one summary");
    assert_eq!(summaries, EPISODES as i64 / 2, "two episodes a summary");
    let _ = std::fs::remove_dir_all(&data_dir);
}
