//! A skill changed while Redis was away is not served old by any replica
//! once Redis comes back with its data.
//!
//! Two `engram serve` processes (replicas A and B) share one Postgres
//! database and one Redis of the test's own. B reads a skill, which caches
//! it; Redis stops, saving its data; A changes the skill, and its eviction of
//! the cached copy fails; Redis starts again with the old copy. B never saw
//! Redis fail, so its own breaker gives it no reason to distrust the cache:
//! what removes the old copy is the eviction row A's write committed, which
//! the outbox job of either replica evicts once Redis answers.
//!
//! Postgres and Redis only: the embedded backend's skill cache is in the
//! process, and its evictions cannot fail.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

use crate::server::{OwnDatabase, OwnRedis, ServerEnv, ServerProcess, free_port};

/// The outbox job runs every second here (10 s by default).
const OUTBOX_INTERVAL_SECS: &str = "1";
/// Far below the cache's time to live (300 s): an old copy still there
/// after this was left to expire, not evicted.
const EVICTION_TIMEOUT: Duration = Duration::from_secs(20);

async fn get(client: &reqwest::Client, base: &str, id: &str) -> Value {
    let r = client.get(format!("{base}/v1/memories/{id}")).send().await.unwrap();
    assert_eq!(r.status(), 200, "GET {id} from {base}");
    r.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_skill_changed_during_a_redis_outage_is_not_served_old_by_another_replica_after_it() {
    if std::env::var("ENGRAM_TEST_BACKEND").as_deref() == Ok("embedded") {
        eprintln!("skipped on the embedded backend: its skill cache lives in the process");
        return;
    }
    // A database of its own: the outbox job of any server on a database
    // takes the eviction rows of every tenant there, and another test's
    // server would carry them out on its own Redis, not this one.
    let own = OwnDatabase::create().await;
    let database_url = own.url.clone();
    let mut redis = OwnRedis::start();
    let run = Uuid::new_v4().simple().to_string();
    let replica = |extra: Vec<(&'static str, String)>| ServerEnv {
        database_url: database_url.clone(),
        data_dir: String::new(),
        redis_url: redis.url(),
        listen: format!("127.0.0.1:{}", free_port()),
        tenant: format!("t-skills-{run}"),
        key_prefix: format!("engram-skills-{run}"),
        extra: [("ENGRAM_REDIS__OUTBOX_INTERVAL_SECS", OUTBOX_INTERVAL_SECS.to_string())]
            .into_iter()
            .chain(extra)
            .collect(),
    };
    let env_a = replica(vec![]);
    let env_b = replica(vec![]);
    let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let mut a = ServerProcess::start(&env_a).unwrap();
    let mut b = ServerProcess::start(&env_b).unwrap();
    a.wait_ready(&client).await.unwrap();
    b.wait_ready(&client).await.unwrap();

    // A writes the skill; B reads it, and so caches it.
    let r = client
        .post(format!("{}/v1/memories", a.base))
        .json(&json!({"memories": [{"agent_id": "ops", "tier": "procedural", "skill_name": "deploy",
            "content": "Deploy with the blue script."}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let id = r.json::<Value>().await.unwrap()["memories"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(get(&client, &b.base, &id).await["content"], "Deploy with the blue script.");
    let key = format!("{}:{}:skill:{id}", env_b.key_prefix, env_b.tenant);
    assert!(redis.cli(&["get", &key]).contains("blue script"), "B's read did not cache the skill");

    // Redis goes away with its data; A changes the skill meanwhile.
    redis.stop_saving();
    let r = client
        .patch(format!("{}/v1/memories/{id}", a.base))
        .json(&json!({"content": "Deploy with the green script."}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());

    // Redis is back with the old copy, which nobody could evict while it was away.
    redis.start_again();
    assert!(
        redis.cli(&["get", &key]).contains("blue script"),
        "Redis did not come back with the old copy: the outage did not happen as this test needs"
    );

    // The eviction row A committed with its change removes the old copy
    // within an outbox interval or two, not the cache's time to live.
    let started = Instant::now();
    while redis.cli(&["exists", &key]).trim() != "0" {
        assert!(
            started.elapsed() < EVICTION_TIMEOUT,
            "the old copy of the skill was still cached {EVICTION_TIMEOUT:?} after Redis came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("skill cache: the old copy was evicted {:?} after Redis came back", started.elapsed());
    assert_eq!(get(&client, &b.base, &id).await["content"], "Deploy with the green script.");
    assert_eq!(get(&client, &a.base, &id).await["content"], "Deploy with the green script.");

    // Every eviction row is taken out once done.
    let db = sqlx::PgPool::connect(&database_url).await.unwrap();
    let started = Instant::now();
    loop {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM skill_evictions WHERE tenant_id = $1")
            .bind(&env_a.tenant)
            .fetch_one(&db)
            .await
            .unwrap();
        if left == 0 {
            break;
        }
        assert!(started.elapsed() < EVICTION_TIMEOUT, "{left} eviction rows left");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    db.close().await;
    drop((a, b));
    own.drop().await;
}
