//! An erasure the server accepted survives `kill -9` in the middle of its
//! work, and ends `completed` with a receipt that counts every row once.
//!
//! Embedded backend: the worker deletes the subject's rows a few per
//! transaction (`erasure.batch = 5`); the test watches the database file and
//! kills the server as soon as the first rows are gone, so the kill lands
//! among the deletes. Postgres: the rows go in the accepting transaction, so
//! the kill lands in the worker's later steps (the purge's VACUUM, the
//! verification); the test checks in the database that the erasure was
//! unfinished at the kill. Either way it proves a resumption, not a fresh
//! start or a finished job.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

use crate::server::{OwnDatabase, ServerEnv, ServerProcess, free_port, service_url};

const SUBJECT_ROWS: usize = 2_000;
const OTHER_ROWS: usize = 50;
/// Memories per write request.
const BATCH: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_erasure_killed_mid_delete_resumes_and_completes_on_postgres() {
    // A database of its own: a server's erasure worker works on every
    // erasure in its database.
    let db = OwnDatabase::create().await;
    kill_mid_erasure(db.url.clone()).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_erasure_killed_mid_delete_resumes_and_completes_on_the_embedded_backend() {
    kill_mid_erasure(String::new()).await;
}

/// The subject's and the other user's rows, counted in the store itself.
async fn stored_rows(env: &ServerEnv) -> (i64, i64) {
    let sql = "SELECT count(*) FILTER (WHERE user_id = 'subject'), count(*) FILTER (WHERE user_id = 'other') ";
    if env.database_url.is_empty() {
        let file = std::path::Path::new(&env.data_dir).join("engram.db");
        let options = sqlx::sqlite::SqliteConnectOptions::new().filename(file).read_only(true);
        let db = sqlx::SqlitePool::connect_with(options).await.unwrap();
        let counts = sqlx::query_as(sqlx::AssertSqlSafe(format!("{sql} FROM memories WHERE tenant_id = ?1")))
            .bind(&env.tenant)
            .fetch_one(&db)
            .await
            .unwrap();
        db.close().await;
        counts
    } else {
        let db = sqlx::PgPool::connect(&env.database_url).await.unwrap();
        let counts = sqlx::query_as(sqlx::AssertSqlSafe(format!("{sql} FROM episodic_memory WHERE tenant_id = $1")))
            .bind(&env.tenant)
            .fetch_one(&db)
            .await
            .unwrap();
        db.close().await;
        counts
    }
}

async fn write(client: &reqwest::Client, base: &str, user: &str, from: usize, n: usize) {
    let memories: Vec<Value> = (from..from + n)
        .map(|i| {
            json!({"agent_id": "crash-erasure", "user_id": user, "tier": "episodic",
                   "content": format!("Episode {i} of {user}: walked to the bakery on Elm Street and bought rye bread.")})
        })
        .collect();
    let r = client.post(format!("{base}/v1/memories")).json(&json!({"memories": memories})).send().await.unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::CREATED, "{}", r.text().await.unwrap_or_default());
}

async fn erasure(client: &reqwest::Client, base: &str, id: &str) -> Value {
    let r = client.get(format!("{base}/v1/erasure/{id}")).send().await.unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::OK);
    r.json().await.unwrap()
}

async fn kill_mid_erasure(database_url: String) {
    let redis_url = service_url("ENGRAM_TEST_REDIS_URL");
    let run = Uuid::new_v4().simple().to_string();
    let data_dir = std::env::temp_dir().join(format!("engram-crash-erasure-{run}")).to_string_lossy().into_owned();
    let env = ServerEnv {
        database_url,
        data_dir: data_dir.clone(),
        redis_url,
        listen: format!("127.0.0.1:{}", free_port()),
        tenant: format!("t-crash-erasure-{run}"),
        key_prefix: format!("engram-crash-erasure-{run}"),
        extra: vec![("ENGRAM_ERASURE__BATCH", "5".into())],
    };
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let mut server = ServerProcess::start(&env).unwrap();
    server.wait_ready(&client).await.unwrap();
    for from in (0..SUBJECT_ROWS).step_by(BATCH) {
        write(&client, &server.base, "subject", from, BATCH).await;
    }
    write(&client, &server.base, "other", 0, OTHER_ROWS).await;
    assert_eq!(stored_rows(&env).await, (SUBJECT_ROWS as i64, OTHER_ROWS as i64));

    let r =
        client.post(format!("{}/v1/erasure", server.base)).json(&json!({"user_id": "subject"})).send().await.unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::ACCEPTED);
    let id = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    if env.database_url.is_empty() {
        // Kill as soon as the worker's deletes have begun.
        let deadline = Instant::now() + Duration::from_secs(60);
        while stored_rows(&env).await.0 == SUBJECT_ROWS as i64 {
            assert!(Instant::now() < deadline, "the worker deleted nothing");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        server.kill_9();
        let (left, other) = stored_rows(&env).await;
        eprintln!("crash: killed with {left} of the subject's {SUBJECT_ROWS} rows left");
        assert!(left > 0, "the kill came after the last delete");
        assert_eq!(other, OTHER_ROWS as i64);
    } else {
        assert_eq!(stored_rows(&env).await, (0, OTHER_ROWS as i64), "deleted in the accepting transaction");
        let deadline = Instant::now() + Duration::from_secs(30);
        while erasure(&client, &server.base, &id).await["state"] == "pending" {
            assert!(Instant::now() < deadline, "the erasure never started running");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        server.kill_9();
        let db = sqlx::PgPool::connect(&env.database_url).await.unwrap();
        let state: String = sqlx::query_scalar("SELECT state FROM erasures WHERE id = $1::uuid")
            .bind(&id)
            .fetch_one(&db)
            .await
            .unwrap();
        db.close().await;
        eprintln!("crash: killed with the erasure {state}");
        assert_eq!(state, "running", "the kill did not land in the worker's steps");
    }

    let mut restarted = ServerProcess::start(&env).unwrap();
    restarted.wait_ready(&client).await.unwrap();
    // Hidden right after the restart, before the worker is done.
    let listed: Value = client
        .get(format!("{}/v1/memories?agent_id=crash-erasure&user_id=subject", restarted.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["memories"], json!([]), "the subject is visible after the restart");
    let deadline = Instant::now() + Duration::from_secs(120);
    let receipt = loop {
        let got = erasure(&client, &restarted.base, &id).await;
        if got["state"] == "completed" {
            break got;
        }
        assert_ne!(got["state"], "failed", "{got}");
        assert!(Instant::now() < deadline, "the erasure did not complete after the restart: {got}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let store = if env.database_url.is_empty() { "sqlite" } else { "postgres" };
    assert_eq!(receipt["deleted"][store]["episodic"], json!(SUBJECT_ROWS), "{receipt}");
    let survivors: Vec<(String, String, u64)> = receipt["verification"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(s, checks)| {
            checks.as_object().unwrap().iter().map(move |(c, n)| (s.clone(), c.clone(), n.as_u64().unwrap()))
        })
        .filter(|(_, _, n)| *n > 0)
        .collect();
    assert!(survivors.is_empty(), "verification found survivors: {survivors:?}");
    drop(restarted);
    assert_eq!(stored_rows(&env).await, (0, OTHER_ROWS as i64));
    let _ = std::fs::remove_dir_all(&data_dir);
}
