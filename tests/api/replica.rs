//! A streaming read replica (`database.read_url`), on the pair of servers
//! `scripts/services.sh` starts: a real hot standby fed by its primary's
//! WAL. Lag is made, not hoped for: the tests pause the standby's replay
//! (`pg_wal_replay_pause`), so what the replica serves while it is behind is
//! certain. Reads go there; a deletion or an erasure never comes back from
//! it; writes, idempotency and dedup hold on the primary while it lags; an
//! erasure is verified on the replica too; a replica that cannot be reached
//! leaves reads on the primary. Each test has a database of its own on the
//! pair, and the tests that use the pair take turns (`PAIR`): one pauses the
//! standby's replay, which would hold up the others' databases and waits.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::erasure::wait_for;
use crate::helpers::{TestApp, embedded, post_json, spawn_app_with};

/// Held by the test using the pair (see the top of the file).
static PAIR: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A database of its own on the primary, its name seen on the replica.
struct Pair {
    _turn: tokio::sync::MutexGuard<'static, ()>,
    primary: sqlx::PgPool,
    replica: sqlx::PgPool,
    primary_url: String,
    replica_url: String,
}

impl Pair {
    /// None (with a note) on the embedded backend.
    async fn new() -> Option<Pair> {
        if embedded() {
            eprintln!("skipped on the embedded backend: read replicas are Postgres-only");
            return None;
        }
        let var = |name: &str| {
            std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run the tests with scripts/test.sh"))
        };
        let (primary_admin, replica_admin) = (var("ENGRAM_TEST_PRIMARY_URL"), var("ENGRAM_TEST_REPLICA_URL"));
        let turn = PAIR.lock().await;
        let name = format!("engram_replica_{}", Uuid::new_v4().simple());
        let admin = sqlx::PgPool::connect(&primary_admin).await.expect("the replica pair's primary answers");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&admin).await.unwrap();
        let on = |url: &str| format!("{}/{name}", url.rsplit_once('/').unwrap().0);
        let (primary_url, replica_url) = (on(&primary_admin), on(&replica_admin));
        let primary = sqlx::PgPool::connect(&primary_url).await.unwrap();
        // The new database reaches the standby with the WAL that made it.
        let mut replica = None;
        for _ in 0..100 {
            if let Ok(pool) = sqlx::PgPool::connect(&replica_url).await {
                replica = Some(pool);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let replica = replica.expect("the new database reached the replica within 10 s");
        let in_recovery: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()").fetch_one(&replica).await.unwrap();
        assert!(in_recovery, "ENGRAM_TEST_REPLICA_URL must be a standby");
        // A run that failed while replay was paused may have left it so.
        sqlx::query("SELECT pg_wal_replay_resume()").execute(&replica).await.unwrap();
        Some(Pair { _turn: turn, primary, replica, primary_url, replica_url })
    }

    async fn app(&self) -> TestApp {
        let (url, read_url) = (self.primary_url.clone(), self.replica_url.clone());
        spawn_app_with(move |c| {
            c.database.url = url;
            c.database.read_url = read_url;
            c.database.read_retry_secs = 1;
            c.erasure.poll_interval_secs = 1;
        })
        .await
    }

    /// Waits until the replica has replayed everything the primary has
    /// written so far.
    async fn caught_up(&self) {
        let lsn: String =
            sqlx::query_scalar("SELECT pg_current_wal_lsn()::text").fetch_one(&self.primary).await.unwrap();
        for _ in 0..200 {
            let done: bool = sqlx::query_scalar("SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn")
                .bind(&lsn)
                .fetch_one(&self.replica)
                .await
                .unwrap();
            if done {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the replica did not replay up to {lsn} within 10 s");
    }

    async fn pause(&self) {
        sqlx::query("SELECT pg_wal_replay_pause()").execute(&self.replica).await.unwrap();
    }

    async fn resume(&self) {
        sqlx::query("SELECT pg_wal_replay_resume()").execute(&self.replica).await.unwrap();
    }
}

/// (served by the replica, sent to the primary because it was behind, failed
/// there, left alone).
fn counts(app: &TestApp) -> (u64, u64, u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    let c = app.storage.pg().unwrap().replica_counts().expect("the app has a replica");
    (c.served.load(Relaxed), c.behind.load(Relaxed), c.failed.load(Relaxed), c.resting.load(Relaxed))
}

async fn search(app: &TestApp, query: &str) -> Vec<String> {
    let (status, body) =
        post_json(app, "/v1/memories/search", &json!({"agent_id": "a", "query": query, "top_k": 20})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["results"].as_array().unwrap().iter().map(|r| r["memory"]["content"].as_str().unwrap().to_string()).collect()
}

async fn write_with_key(app: &TestApp, key: &str, body: &Value) -> (StatusCode, Value) {
    let r = app
        .client
        .post(format!("{}/v1/memories", app.base))
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap())
}

#[tokio::test]
async fn a_lagging_replica_serves_reads_but_never_a_deleted_or_erased_memory() {
    let Some(pair) = Pair::new().await else { return };
    let app = pair.app().await;
    let tea = app
        .write_one(json!({"memories": [{"agent_id": "a", "user_id": "ann", "tier": "semantic",
            "content": "Ann drinks green tea every morning"}]}))
        .await;
    let boat = app
        .write_one(json!({"memories": [{"agent_id": "a", "user_id": "bo", "tier": "episodic",
            "content": "Bo sailed the red boat to the island"}]}))
        .await;
    app.write_one(json!({"memories": [{"agent_id": "a", "user_id": "cy", "tier": "semantic",
        "content": "Cy keeps bees on the roof"}]}))
        .await;
    pair.caught_up().await;

    // Caught up: reads are the replica's.
    let before = counts(&app);
    assert!(search(&app, "green tea").await.contains(&"Ann drinks green tea every morning".to_string()));
    let (status, _) = app.get_json(&format!("/v1/memories/{}", tea["id"].as_str().unwrap())).await;
    assert_eq!(status, StatusCode::OK);
    let (_, listed) = app.get_json("/v1/memories?agent_id=a").await;
    assert_eq!(listed["memories"].as_array().unwrap().len(), 3, "{listed}");
    let after = counts(&app);
    assert!(after.0 >= before.0 + 3, "search, get and list served by the replica: {before:?} -> {after:?}");

    // Behind, with nothing deleted: still the replica's, and a new memory is
    // not there yet (the lag this mode accepts) ...
    pair.pause().await;
    let fresh = app
        .write_one(
            json!({"memories": [{"agent_id": "a", "tier": "semantic", "content": "Dee paints violet lighthouses"}]}),
        )
        .await;
    let before = counts(&app);
    assert!(!search(&app, "violet lighthouses").await.iter().any(|c| c.contains("Dee")));
    assert!(counts(&app).0 > before.0, "served by the paused replica");
    // ... but a get by id finds it (a miss on the replica asks the primary).
    let (status, body) = app.get_json(&format!("/v1/memories/{}", fresh["id"].as_str().unwrap())).await;
    assert_eq!((status, body["content"].as_str()), (StatusCode::OK, Some("Dee paints violet lighthouses")));

    // Writes decide on the primary: an idempotent retry replays the first
    // response, and the same fact again is the same fact.
    let body = json!({"memories": [{"agent_id": "a", "tier": "semantic", "content": "Eli fixes old clocks"}]});
    let (s1, first) = write_with_key(&app, "k-replica-1", &body).await;
    let (s2, again) = write_with_key(&app, "k-replica-1", &body).await;
    assert_eq!((s1, s2), (StatusCode::CREATED, StatusCode::CREATED), "{first} {again}");
    assert_eq!(first, again, "the retry replays the first response");
    let dup = app.write_one(body.clone()).await;
    assert_eq!((dup["id"].clone(), dup["deduplicated"].clone()), (first["memories"][0]["id"].clone(), json!(true)));

    // A deletion while it is behind: the tenant's reads go to the primary
    // until the replica has replayed it, so the memory does not come back.
    let r = app.delete(&format!("/v1/memories/{}", tea["id"].as_str().unwrap())).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let before = counts(&app);
    assert!(!search(&app, "green tea").await.iter().any(|c| c.contains("Ann")));
    let (status, _) = app.get_json(&format!("/v1/memories/{}", tea["id"].as_str().unwrap())).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let after = counts(&app);
    assert!(after.1 >= before.1 + 2 && after.0 == before.0, "sent to the primary: {before:?} -> {after:?}");
    // The replica itself still holds the row: it is the fence that hides it.
    let on_replica: i64 = sqlx::query_scalar("SELECT count(*) FROM semantic_memory WHERE id = $1")
        .bind(Uuid::parse_str(tea["id"].as_str().unwrap()).unwrap())
        .fetch_one(&pair.replica)
        .await
        .unwrap();
    assert_eq!(on_replica, 1, "replay is paused");

    // An erasure likewise, and its verification waits for the replica.
    let (status, accepted) = post_json(&app, "/v1/erasure", &json!({"user_id": "bo"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let erasure = accepted["id"].as_str().unwrap().to_string();
    assert!(!search(&app, "red boat island").await.iter().any(|c| c.contains("Bo sailed")));
    let (_, listed) = app.get_json("/v1/memories?agent_id=a&user_id=bo").await;
    assert_eq!(listed["memories"], json!([]), "{listed}");
    let (status, _) = app.get_json(&format!("/v1/memories/{}", boat["id"].as_str().unwrap())).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let pending = wait_for(&app, &erasure, "retrying").await;
    assert!(pending["verified_at"].is_null(), "not verified while the replica is behind: {pending}");

    pair.resume().await;
    pair.caught_up().await;
    let receipt = wait_for(&app, &erasure, "completed").await;
    let replica_checks = receipt["verification"]["postgres_replica"].as_object().expect("checked on the replica");
    assert!(!replica_checks.is_empty(), "{receipt}");
    for (check, n) in replica_checks {
        assert_eq!(n, 0, "postgres_replica.{check}: {receipt}");
    }

    // Caught up again: the replica serves, without what was deleted.
    let before = counts(&app);
    let found = search(&app, "green tea red boat violet lighthouses").await;
    assert!(found.iter().any(|c| c.contains("Dee")), "{found:?}");
    assert!(!found.iter().any(|c| c.contains("Ann") || c.contains("Bo sailed")), "{found:?}");
    assert!(counts(&app).0 > before.0);
}

#[tokio::test]
async fn reads_stay_on_the_primary_while_the_replica_cannot_be_reached() {
    if embedded() {
        eprintln!("skipped on the embedded backend: read replicas are Postgres-only");
        return;
    }
    let db = crate::helpers::fresh_database().await;
    // Nothing listens on port 1 of loopback: every connection is refused.
    let unreachable = format!("postgres://engram@127.0.0.1:1/{}", db.rsplit('/').next().unwrap());
    let app = spawn_app_with(move |c| {
        c.database.url = db;
        c.database.read_url = unreachable;
        c.database.read_retry_secs = 3600;
    })
    .await;
    let m = app
        .write_one(json!({"memories": [{"agent_id": "a", "tier": "semantic", "content": "Fay grows chilli peppers"}]}))
        .await;
    assert!(search(&app, "chilli peppers").await.iter().any(|c| c.contains("Fay")));
    let (status, _) = app.get_json(&format!("/v1/memories/{}", m["id"].as_str().unwrap())).await;
    assert_eq!(status, StatusCode::OK);
    let (served, _, failed, resting) = counts(&app);
    assert_eq!(served, 0);
    // The first read found it down; the next ones left it alone.
    assert!(failed >= 1 && resting >= 1, "failed {failed}, left alone {resting}");
}

/// Forwards every connection to `127.0.0.1:port` on `to`, for as long as the
/// returned task runs.
async fn forward(listener: tokio::net::TcpListener, to: u16) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    })
}

#[tokio::test]
async fn a_replica_that_comes_back_is_found_by_the_probe_not_by_client_reads() {
    let Some(pair) = Pair::new().await else { return };
    // The replica is reached through a port where, at first, nothing listens.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut through = reqwest::Url::parse(&pair.replica_url).unwrap();
    let standby = through.port().expect("the replica URL names its port");
    through.set_port(Some(port)).unwrap();
    let (url, read_url) = (pair.primary_url.clone(), through.to_string());
    let app = spawn_app_with(move |c| {
        c.database.url = url;
        c.database.read_url = read_url;
        c.database.read_retry_secs = 1;
    })
    .await;
    app.write_one(json!({"memories": [{"agent_id": "a", "tier": "semantic", "content": "Gus restores canoes"}]})).await;
    assert!(search(&app, "canoes").await.iter().any(|c| c.contains("Gus")));
    let (served, _, failed, _) = counts(&app);
    assert_eq!(served, 0);
    assert!(failed >= 1, "the first read found the replica down");

    // Down past several rest periods: each one ends in a probe, and no
    // client read tries the replica again.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert!(search(&app, "canoes").await.iter().any(|c| c.contains("Gus")));
    }
    let now = counts(&app);
    assert_eq!((now.0, now.2), (0, failed), "reads left the replica alone: {now:?}");
    assert!(now.3 >= 3, "{now:?}");

    // The replica is reachable again: a probe finds it, and reads go there.
    pair.caught_up().await;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let forwarder = forward(listener, standby).await;
    let mut served = false;
    for _ in 0..100 {
        assert!(search(&app, "canoes").await.iter().any(|c| c.contains("Gus")));
        if counts(&app).0 > 0 {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    forwarder.abort();
    assert!(served, "the replica serves again within 10 s: {:?}", counts(&app));
    assert_eq!(counts(&app).2, failed, "no read failed on the way back");
}
