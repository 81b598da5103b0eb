//! Erasure: a data subject's memories hidden at once and then gone from
//! every store (checked with each store's own queries and, on the embedded
//! backend, by searching the data directory's bytes), the receipt, the
//! audit log and its verification, and erasures that outlive a Redis outage
//! or a restart.

use std::time::Duration;

use engram::config::{ApiKeyConfig, Scope};
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::{OwnRedis, TestApp, expect_error, post_json, spawn_app_with};

/// A server on a database of its own (on Postgres): the erasure worker of
/// any server on a database works on every erasure there, with its own
/// Redis, so tests whose servers use different Redis prefixes (or Redis
/// servers) on one database would check each other's working memory.
pub(crate) async fn spawn_isolated(tweak: impl FnOnce(&mut engram::config::Config)) -> TestApp {
    let db = if crate::helpers::embedded() { None } else { Some(crate::helpers::fresh_database().await) };
    spawn_app_with(move |c| {
        if let Some(url) = db {
            c.database.url = url;
        }
        tweak(c);
    })
    .await
}

/// Polls an erasure's receipt until its state is `want` (or 30 s pass).
pub(crate) async fn wait_for(app: &TestApp, id: &str, want: &str) -> Value {
    let mut last = Value::Null;
    for _ in 0..300 {
        let (status, body) = app.get_json(&format!("/v1/erasure/{id}")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        if body["state"] == want {
            return body;
        }
        last = body;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("erasure {id} never reached {want}: {last}");
}

/// Every file of a directory whose bytes contain `needle`.
fn files_containing(dir: &std::path::Path, needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            let bytes = std::fs::read(&path).unwrap();
            if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                out.push(path.display().to_string());
            }
        }
    }
    out
}

/// Redis keys of this app whose value holds `needle` (strings only; the
/// session lists hold ids).
fn redis_values_containing(app: &TestApp, needle: &str) -> usize {
    let url = &app.config.redis.url;
    let keys = std::process::Command::new("redis-cli")
        .args(["-u", url, "--scan", "--pattern", &format!("{}*", app.config.redis.key_prefix)])
        .output()
        .expect("redis-cli on PATH");
    String::from_utf8_lossy(&keys.stdout)
        .lines()
        .filter(|key| {
            let value = std::process::Command::new("redis-cli").args(["-u", url, "GET", key]).output().unwrap();
            String::from_utf8_lossy(&value.stdout).contains(needle)
        })
        .count()
}

/// Rows of the app's Postgres tables (memories, remembered responses, the
/// outbox) that hold `needle`.
async fn postgres_rows_containing(pool: &sqlx::PgPool, needle: &str) -> i64 {
    let like = format!("%{needle}%");
    sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM episodic_memory WHERE content LIKE $1) \
              + (SELECT count(*) FROM semantic_memory WHERE content LIKE $1) \
              + (SELECT count(*) FROM procedural_memory WHERE content LIKE $1 OR skill_name LIKE $1) \
              + (SELECT count(*) FROM idempotency_keys WHERE response::text LIKE $1) \
              + (SELECT count(*) FROM working_outbox WHERE entry LIKE $1)",
    )
    .bind(like)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Planner statistics of the memory tables and their indexes' expressions
/// (values sampled from their rows: histograms, most common values and
/// words) that hold `needle`.
async fn planner_statistics_containing(pool: &sqlx::PgPool, needle: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stats WHERE schemaname = current_schema() \
           AND tablename IN (SELECT c.relname FROM pg_class c LEFT JOIN pg_index i ON i.indexrelid = c.oid \
                WHERE coalesce(i.indrelid, c.oid) IN \
                  ('episodic_memory'::regclass, 'semantic_memory'::regclass, 'procedural_memory'::regclass)) \
           AND concat(histogram_bounds::text, most_common_vals::text, most_common_elems::text) LIKE $1",
    )
    .bind(format!("%{needle}%"))
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_users_memories_are_hidden_at_once_then_gone_from_every_store_with_a_receipt() {
    let app = spawn_isolated(|_| {}).await;
    let marker = format!("zq{}", Uuid::new_v4().simple());
    let say = |what: &str| format!("{what} {marker}");

    // Alice: every tier, a superseded fact, a fact derived from her episode,
    // a cached skill and a remembered response.
    let r = app
        .client
        .post(format!("{}/v1/memories", app.base))
        .header("idempotency-key", format!("k-{marker}"))
        .json(&json!({"memories": [
            {"agent_id": "a", "user_id": "alice", "session_id": "s1", "tier": "episodic",
             "content": say("Alice told me she moved to Rome")},
            {"agent_id": "a", "user_id": "alice", "session_id": "s1", "tier": "working",
             "content": say("Alice is planning her trip")},
        ]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let batch: Value = r.json().await.unwrap();
    let episode = batch["memories"][0]["id"].as_str().unwrap().to_string();
    let working = batch["memories"][1]["id"].as_str().unwrap().to_string();
    let old = app
        .write_one(json!({"agent_id": "a", "user_id": "alice", "tier": "semantic", "subject": "alice",
            "predicate": "lives_in", "object": "Paris", "content": say("Alice lives in Paris")}))
        .await;
    let new = app
        .write_one(json!({"agent_id": "a", "user_id": "alice", "tier": "semantic", "subject": "alice",
            "predicate": "lives_in", "object": "Rome", "content": say("Alice lives in Rome")}))
        .await;
    assert_eq!(new["supersedes"], old["id"]);
    let derived = app
        .write_one(json!({"agent_id": "a", "tier": "semantic", "source_episode_id": episode,
            "content": say("Someone on the team lives in Rome")}))
        .await;
    let skill = app
        .write_one(json!({"agent_id": "a", "user_id": "alice", "tier": "procedural", "skill_name": say("book"),
            "content": say("Book Alice's trains in the morning")}))
        .await;
    let skill_path = format!("/v1/memories/{}", skill["id"].as_str().unwrap());
    assert_eq!(app.get_json(&skill_path).await.0, StatusCode::OK, "cached now");

    // Bob, same agent: untouched.
    let bob = app
        .write(json!({"memories": [
            {"agent_id": "a", "user_id": "bob", "session_id": "s1", "tier": "episodic", "content": "Bob likes tea"},
            {"agent_id": "a", "user_id": "bob", "session_id": "s1", "tier": "working", "content": "Bob is here"},
            {"agent_id": "a", "user_id": "bob", "tier": "semantic", "content": "Bob lives in Oslo"},
        ]}))
        .await;
    if let Some(store) = app.storage.sqlite() {
        assert!(!files_containing(store.dir(), &marker).is_empty(), "the test writes the marker to disk");
    }
    if let Some(pg) = app.storage.pg() {
        sqlx::query("ANALYZE episodic_memory, semantic_memory, procedural_memory").execute(pg.pool()).await.unwrap();
        assert!(planner_statistics_containing(pg.pool(), &marker).await > 0, "the statistics sample the marker");
    }

    let (status, accepted) = post_json(&app, "/v1/erasure", &json!({"user_id": "alice"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let id = accepted["id"].as_str().unwrap().to_string();
    assert_eq!(accepted["selector"], json!({"user_id": "alice"}));
    assert_eq!(accepted["requested_by"], "keyless");

    // Hidden from the moment of the 202, whatever the worker has done yet.
    let ids = [&episode, &working, old["id"].as_str().unwrap(), new["id"].as_str().unwrap()];
    for id in ids.iter().copied().chain([derived["id"].as_str().unwrap(), skill["id"].as_str().unwrap()]) {
        let (status, body) = app.get_json(&format!("/v1/memories/{id}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{id}: {body}");
    }
    let (_, found) = post_json(
        &app,
        "/v1/memories/search",
        &json!({"agent_id": "a", "session_id": "s1", "query": marker, "top_k": 50}),
    )
    .await;
    assert!(!found.to_string().contains(&marker), "{found}");
    let (_, listed) = app.get_json("/v1/memories?agent_id=a&session_id=s1").await;
    assert!(!listed.to_string().contains(&marker), "{listed}");
    assert_eq!(listed["memories"].as_array().unwrap().len(), 2, "Bob's episode and working entry: {listed}");
    let (_, context) = post_json(
        &app,
        "/v1/context",
        &json!({"agent_id": "a", "session_id": "s1", "query": marker, "max_context_tokens": 4000}),
    )
    .await;
    assert!(!context.to_string().contains(&marker), "{context}");

    let receipt = wait_for(&app, &id, "completed").await;
    let (store, working_store) = if app.storage.pg().is_some() { ("postgres", "redis") } else { ("sqlite", "sqlite") };
    let deleted = &receipt["deleted"];
    assert_eq!(deleted[store]["episodic"], 1, "{receipt}");
    assert_eq!(deleted[store]["semantic"], 3, "both versions and the derived fact: {receipt}");
    assert_eq!(deleted[store]["procedural"], 1, "{receipt}");
    assert_eq!(deleted[store]["idempotency_records"], 1, "{receipt}");
    assert_eq!(deleted[working_store]["working"], 1, "{receipt}");
    let verification = receipt["verification"].as_object().unwrap();
    assert!(!verification.is_empty(), "{receipt}");
    for (store, checks) in verification {
        for (check, n) in checks.as_object().unwrap() {
            assert_eq!(n, 0, "{store}.{check}: {receipt}");
        }
    }
    assert!(receipt["completed_at"].is_string() && receipt["verified_at"].is_string(), "{receipt}");
    assert!(!receipt["purge"].as_object().unwrap().is_empty(), "{receipt}");

    // The audit entry: the erasure, its actor and counts, no content.
    let (_, audit) = app.get_json("/v1/audit").await;
    let entry = audit["entries"].as_array().unwrap().iter().find(|e| e["operation"] == "erasure").unwrap().clone();
    assert_eq!(entry["hash"], receipt["audit_hash"]);
    assert_eq!(entry["actor"], "keyless");
    assert_eq!(entry["target"]["erasure_id"], id.as_str());
    assert!(!entry.to_string().contains(&marker), "{entry}");
    let (_, verified) = app.get_json("/v1/audit/verify").await;
    assert_eq!(verified["valid"], true, "{verified}");

    // Direct looks at every store.
    if let Some(pg) = app.storage.pg() {
        assert_eq!(postgres_rows_containing(pg.pool(), &marker).await, 0);
        assert_eq!(planner_statistics_containing(pg.pool(), &marker).await, 0, "sampled again after the purge");
        assert_eq!(redis_values_containing(&app, &marker), 0);
        // The claims and the vectors kept for the verification end with it.
        let left: (i64, i64) =
            sqlx::query_as("SELECT (SELECT count(*) FROM erasure_items), (SELECT count(*) FROM erasure_probes)")
                .fetch_one(pg.pool())
                .await
                .unwrap();
        assert_eq!(left, (0, 0));
    }
    if let Some(sqlite) = app.storage.sqlite() {
        assert_eq!(files_containing(sqlite.dir(), &marker), Vec::<String>::new(), "no byte of it in the data dir");
    }
    // Bob is all there.
    for m in &bob {
        let (status, _) = app.get_json(&format!("/v1/memories/{}", m["id"].as_str().unwrap())).await;
        assert_eq!(status, StatusCode::OK);
    }
}

#[tokio::test]
async fn an_erasure_by_ids_takes_the_older_versions_but_not_another_users_facts() {
    let app = spawn_isolated(|_| {}).await;
    let old = app
        .write_one(json!({"agent_id": "a", "user_id": "carol", "tier": "semantic", "subject": "carol",
            "predicate": "works_at", "object": "Acme", "content": "Carol works at Acme"}))
        .await;
    let new = app
        .write_one(json!({"agent_id": "a", "user_id": "carol", "tier": "semantic", "subject": "carol",
            "predicate": "works_at", "object": "Initech", "content": "Carol works at Initech"}))
        .await;
    let episode = app.write_one(json!({"agent_id": "a", "tier": "episodic", "content": "Carol and Dan met"})).await;
    let dans = app
        .write_one(json!({"agent_id": "a", "user_id": "dan", "tier": "semantic", "source_episode_id": episode["id"],
            "content": "Dan met Carol"}))
        .await;
    let (status, accepted) =
        post_json(&app, "/v1/erasure", &json!({"memory_ids": [new["id"], episode["id"], Uuid::new_v4()]})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let receipt = wait_for(&app, accepted["id"].as_str().unwrap(), "completed").await;
    let store = if app.storage.pg().is_some() { "postgres" } else { "sqlite" };
    assert_eq!(receipt["deleted"][store]["semantic"], 2, "the fact and the version it superseded: {receipt}");
    assert_eq!(receipt["deleted"][store]["episodic"], 1, "{receipt}");
    assert_eq!(app.get_json(&format!("/v1/memories/{}", old["id"].as_str().unwrap())).await.0, StatusCode::NOT_FOUND);
    assert_eq!(app.get_json(&format!("/v1/memories/{}", dans["id"].as_str().unwrap())).await.0, StatusCode::OK);
}

#[tokio::test]
async fn erasure_is_an_admin_operation_scoped_to_the_tenant_and_unknown_users_complete_empty() {
    let (t1, t2) = (format!("e-{}", Uuid::new_v4().simple()), format!("e-{}", Uuid::new_v4().simple()));
    let server = spawn_isolated(|c| {
        c.auth.keys = vec![
            ApiKeyConfig::from_plain(&t1, "writer-1", Scope::ReadWrite),
            ApiKeyConfig { id: "ops-1".into(), ..ApiKeyConfig::from_plain(&t1, "admin-1", Scope::Admin) },
            ApiKeyConfig::from_plain(&t2, "admin-2", Scope::Admin),
        ];
    })
    .await;
    let (writer, admin, other) = (server.as_key("writer-1"), server.as_key("admin-1"), server.as_key("admin-2"));
    let r = writer.post("/v1/erasure", &json!({"user_id": "u"})).await;
    expect_error(r, StatusCode::FORBIDDEN, "insufficient_scope").await;

    let (status, accepted) = post_json(&admin, "/v1/erasure", &json!({"user_id": "nobody-at-all"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "existence does not leak: {accepted}");
    assert_eq!(accepted["requested_by"], "ops-1");
    let id = accepted["id"].as_str().unwrap();
    let receipt = wait_for(&admin, id, "completed").await;
    let total: u64 = receipt["deleted"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|m| m.as_object().unwrap().values())
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(total, 0, "{receipt}");
    let r = other.get(&format!("/v1/erasure/{id}")).await;
    expect_error(r, StatusCode::NOT_FOUND, "erasure_not_found").await;
    let (_, audit) = admin.get_json("/v1/audit").await;
    assert_eq!(audit["entries"][0]["actor"], "ops-1", "{audit}");
    let (_, audit) = other.get_json("/v1/audit").await;
    assert_eq!(audit["entries"], json!([]), "another tenant's log is its own");

    for (body, field) in [
        (json!({}), "/user_id"),
        (json!({"user_id": "u", "memory_ids": [Uuid::new_v4()]}), "/memory_ids"),
        (json!({"memory_ids": []}), "/memory_ids"),
        (json!({"memory_ids": [Uuid::new_v4()], "agent_id": "a"}), "/agent_id"),
        (json!({"user_id": "u\u{202e}"}), "/user_id"),
        (json!({"user": "u"}), "/user"),
    ] {
        let r = admin.post("/v1/erasure", &body).await;
        let e = expect_error(r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field").await;
        assert_eq!(e["error"]["field"], field, "{body}: {e}");
    }
}

#[tokio::test]
async fn an_erasure_waits_out_a_redis_outage_and_completes_when_it_is_back() {
    let mut redis = OwnRedis::start();
    let url = redis.url();
    let app = spawn_isolated(|c| {
        c.redis.url = url;
        c.erasure.poll_interval_secs = 1;
    })
    .await;
    if app.postgres_only("an erasure across a Redis outage").is_none() {
        return;
    }
    let w = app
        .write(json!({"memories": [
            {"agent_id": "a", "user_id": "erin", "session_id": "s", "tier": "working", "content": "Erin's draft"},
            {"agent_id": "a", "user_id": "erin", "session_id": "s", "tier": "episodic", "content": "Erin called"},
        ]}))
        .await;
    redis.save();
    redis.stop();
    let (status, accepted) = post_json(&app, "/v1/erasure", &json!({"user_id": "erin"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let id = accepted["id"].as_str().unwrap();
    let retrying = wait_for(&app, id, "retrying").await;
    assert!(retrying["last_error"].as_str().is_some_and(|e| !e.is_empty()), "{retrying}");
    // Hidden in the database already (a lookup by id answers 503 while
    // Redis, which might hold it, is down).
    let id1 = w[1]["id"].as_str().unwrap().parse().unwrap();
    assert!(
        app.store
            .get(&app.config.auth.default_tenant, id1, app.clock.now_plus(chrono::Duration::zero()))
            .await
            .is_err()
    );

    // Redis comes back with Erin's working entry (the snapshot).
    redis.resume();
    let receipt = wait_for(&app, id, "completed").await;
    assert_eq!(receipt["deleted"]["redis"]["working"], 1, "{receipt}");
    assert_eq!(receipt["verification"]["redis"]["working"], 0, "{receipt}");
    assert_eq!(app.get_json(&format!("/v1/memories/{}", w[0]["id"].as_str().unwrap())).await.0, StatusCode::NOT_FOUND);
    assert_eq!(redis_values_containing(&app, "Erin"), 0);
}

#[tokio::test]
async fn an_accepted_erasure_survives_a_restart_and_completes() {
    let first = spawn_isolated(|c| c.erasure.poll_interval_secs = 3600).await;
    let m = first
        .write_one(json!({"agent_id": "a", "user_id": "fay", "tier": "episodic", "content": "Fay's secret plan"}))
        .await;
    // Accepted (stored and hidden) as the route does, with no worker woken:
    // what a crash right after the 202 leaves behind.
    let subject = engram::domain::erasure::Subject::User { user_id: "fay".into(), agent_id: None };
    let record = engram::domain::erasure::ErasureRecord {
        id: Uuid::now_v7(),
        tenant: first.config.auth.default_tenant.clone(),
        subject,
        requested_by: "keyless".into(),
        state: engram::domain::erasure::ErasureState::Pending,
        attempts: 0,
        last_error: None,
        receipt: Default::default(),
        requested_at: first.clock.now_plus(chrono::Duration::zero()),
        completed_at: None,
        updated_at: first.clock.now_plus(chrono::Duration::zero()),
    };
    let store = if first.storage.pg().is_some() { "postgres" } else { "sqlite" };
    let tx = first.storage.erasure.begin_erasure().await.unwrap();
    let accepted = engram::store::erasure::accept(tx, record, store).await.unwrap();
    let id = accepted.record.id.to_string();
    assert_eq!(first.get_json(&format!("/v1/memories/{}", m["id"].as_str().unwrap())).await.0, StatusCode::NOT_FOUND);
    let pending = first.get_json(&format!("/v1/erasure/{id}")).await.1;
    assert_eq!(pending["state"], "pending", "{pending}");

    // The server goes away; another starts on the same data and finishes it.
    let config = first.config.clone();
    drop(first);
    let mut second = None;
    for _ in 0..100 {
        let c = config.clone();
        match tokio::spawn(async move { spawn_app_with(move |x| *x = c).await }).await {
            Ok(app) => {
                second = Some(app);
                break;
            }
            // The embedded data directory is still locked by the first one.
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let second = second.expect("a second server starts on the same data");
    let receipt = wait_for(&second, &id, "completed").await;
    assert_eq!(receipt["deleted"][store]["episodic"], 1, "{receipt}");
}

#[tokio::test]
async fn an_edited_audit_entry_is_named_by_the_api_and_by_engram_audit_verify() {
    let db = if crate::helpers::embedded() { None } else { Some(crate::helpers::fresh_database().await) };
    let url = db.clone();
    let app = spawn_app_with(|c| {
        if let Some(url) = url {
            c.database.url = url;
        }
    })
    .await;
    for user in ["g1", "g2", "g3"] {
        let (status, body) = post_json(&app, "/v1/erasure", &json!({"user_id": user})).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        wait_for(&app, body["id"].as_str().unwrap(), "completed").await;
    }
    let (_, audit) = app.get_json("/v1/audit").await;
    let second = audit["entries"][1]["seq"].as_i64().unwrap();

    // Append-only: the application cannot change an entry ...
    let tamper = "{\"state\":\"completed\",\"deleted\":{},\"survivors\":0,\"edited\":true}";
    if let Some(pg) = app.storage.pg() {
        let refused = sqlx::query("UPDATE audit_log SET counts = $1 WHERE seq = $2")
            .bind(tamper)
            .bind(second)
            .execute(pg.pool())
            .await;
        assert!(refused.unwrap_err().to_string().contains("append-only"));
        // ... someone with the owner's rights can; the chain shows it.
        let mut tx = pg.pool().begin().await.unwrap();
        for sql in [
            "ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only",
            "UPDATE audit_log SET counts = $1 WHERE seq = $2",
            "ALTER TABLE audit_log ENABLE TRIGGER audit_log_append_only",
        ] {
            sqlx::query(sql).bind(tamper).bind(second).execute(&mut *tx).await.unwrap();
        }
        tx.commit().await.unwrap();
    }
    if let Some(sqlite) = app.storage.sqlite() {
        let pool = sqlite.pool();
        let refused =
            sqlx::query("update audit_log set counts = ? where seq = ?").bind(tamper).bind(second).execute(pool).await;
        assert!(refused.unwrap_err().to_string().contains("append-only"));
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("drop trigger audit_log_no_update").execute(&mut *tx).await.unwrap();
        sqlx::query("update audit_log set counts = ? where seq = ?")
            .bind(tamper)
            .bind(second)
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    let (_, verified) = app.get_json("/v1/audit/verify").await;
    assert_eq!(verified["valid"], false, "{verified}");
    assert_eq!(verified["first_broken_seq"], second, "{verified}");
    assert_eq!(verified["checked"], 1, "{verified}");

    // The command line, on the same data once the server is gone.
    let config = app.config.clone();
    drop(app);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_engram"));
    cmd.env_clear().env("PATH", std::env::var("PATH").unwrap_or_default());
    match &db {
        Some(url) => cmd.env("DATABASE_URL", url),
        None => cmd.arg("--data-dir").arg(&config.embedded.data_dir),
    };
    cmd.args(["audit", "verify"]);
    let mut output = cmd.output().unwrap();
    for _ in 0..100 {
        // The embedded data directory stays locked until the server is gone.
        if !String::from_utf8_lossy(&output.stderr).contains("in use by another engram process") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        output = cmd.output().unwrap();
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("broken at entry seq {second}")), "{stderr}");
    if let Some(url) = db {
        crate::helpers::drop_database(&url).await;
    }
}

#[tokio::test]
async fn a_data_subjects_export_lists_every_tier_of_that_user_only_and_is_audited() {
    let app = spawn_isolated(|_| {}).await;
    app.write(json!({"memories": [
        {"agent_id": "a", "user_id": "hal", "session_id": "s", "tier": "working", "content": "Hal is typing"},
        {"agent_id": "a", "user_id": "hal", "tier": "episodic", "content": "Hal asked for a refund"},
        {"agent_id": "b", "user_id": "hal", "tier": "semantic", "content": "Hal prefers e-mail"},
        {"agent_id": "a", "user_id": "hal", "tier": "procedural", "skill_name": "refund", "content": "Refund Hal"},
        {"agent_id": "a", "user_id": "ivy", "tier": "episodic", "content": "Ivy asked for a refund"},
    ]}))
    .await;
    let r = app.get("/v1/subjects/hal/export").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    let text = r.text().await.unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let mut tiers: Vec<&str> = lines.iter().map(|m| m["tier"].as_str().unwrap()).collect();
    tiers.sort_unstable();
    assert_eq!(tiers, ["episodic", "procedural", "semantic", "working"], "{text}");
    assert!(lines.iter().all(|m| m["user_id"] == "hal"), "{text}");
    let (_, audit) = app.get_json("/v1/audit").await;
    let entry = &audit["entries"][0];
    assert_eq!(entry["operation"], "subject_export", "{audit}");
    assert_eq!(entry["target"], json!({"user_id": "hal"}));
    assert_eq!(entry["counts"]["working"], 1, "{audit}");
    let r = app.get("/v1/subjects/h%E2%80%AEal/export").await;
    expect_error(r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field").await;
}
