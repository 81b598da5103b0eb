//! Retention: configured lifetimes, the sweep that deletes what expired or
//! decayed from every store, and the dry run that shows it coming. Stores are
//! checked directly (SQL, Redis keys, in-process index sizes), not only
//! through the API; the sweep is run with `run_once` on the test clock.

use chrono::{DateTime, Duration, Utc};
use engram::domain::retention::Reason;
use engram::domain::{Period, Tier};
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::*;

fn expires_at(m: &Value) -> DateTime<Utc> {
    m["expires_at"].as_str().unwrap().parse().unwrap()
}

fn created_at(m: &Value) -> DateTime<Utc> {
    m["created_at"].as_str().unwrap().parse().unwrap()
}

#[tokio::test]
async fn configured_durations_set_the_expiry_of_writes_and_patches_from_ingestion() {
    let app = spawn_app_with(|c| {
        c.retention.transient = Period::secs(90);
        c.retention.short_term = Period::hours(36);
        c.retention.session = Period::hours(2);
    })
    .await;
    // occurred_at a week back: the expiry still counts from ingestion.
    let occurred = (Utc::now() - Duration::days(7)).to_rfc3339();
    let e = app
        .write_one(json!({"agent_id": "r", "tier": "episodic", "content": "left early", "retention": "short_term",
            "occurred_at": occurred}))
        .await;
    assert_eq!(expires_at(&e) - created_at(&e), Duration::hours(36));
    let w = app.write_one(json!({"agent_id": "r", "session_id": "s", "tier": "working", "content": "scratch"})).await;
    assert_eq!(expires_at(&w) - created_at(&w), Duration::hours(2));

    app.clock.advance(Duration::minutes(5));
    for m in [&e, &w] {
        let r =
            app.patch(&format!("/v1/memories/{}", m["id"].as_str().unwrap()), &json!({"retention": "transient"})).await;
        assert_eq!(r.status(), StatusCode::OK);
        let patched: Value = r.json().await.unwrap();
        // 90 s after ingestion, not after the patch: both are already past it.
        assert_eq!(expires_at(&patched) - created_at(&patched), Duration::seconds(90));
    }
}

/// An app sweeping a database of its own (on Postgres): a sweep deletes
/// every tenant's expired rows, and other tests' rows expire by their own
/// clocks. Returns the app and the database to drop (None when embedded).
pub(crate) async fn sweeping_app(tweak: impl FnOnce(&mut engram::config::Config)) -> (TestApp, Option<String>) {
    let db = if embedded() { None } else { Some(fresh_database().await) };
    let url = db.clone();
    let app = spawn_app_with(|c| {
        if let Some(url) = url {
            c.database.url = url;
        }
        // The job's own timer never fires during a test: tests call run_once.
        c.retention.sweep_interval_secs = 0;
        tweak(c);
    })
    .await;
    (app, db)
}

pub(crate) async fn done(app: TestApp, db: Option<String>) {
    drop(app);
    if let Some(db) = db {
        drop_database(&db).await;
    }
}

pub(crate) fn id_of(m: &Value) -> Uuid {
    m["id"].as_str().unwrap().parse().unwrap()
}

/// Rows with this id in the backend's own tables (all tiers).
pub(crate) async fn stored_rows(app: &TestApp, id: Uuid) -> i64 {
    if let Some(pg) = app.storage.pg() {
        sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM episodic_memory WHERE id = $1) + (SELECT count(*) FROM semantic_memory \
             WHERE id = $1) + (SELECT count(*) FROM procedural_memory WHERE id = $1)",
        )
        .bind(id)
        .fetch_one(pg.pool())
        .await
        .unwrap()
    } else {
        let s = app.storage.sqlite().unwrap();
        sqlx::query_scalar(
            "select (select count(*) from memories where id = ?1) + (select count(*) from working_memory where id = ?1)",
        )
        .bind(id)
        .fetch_one(s.pool())
        .await
        .unwrap()
    }
}

fn index_sizes(app: &TestApp) -> std::collections::BTreeMap<&'static str, usize> {
    app.storage.sweep.index_sizes().into_iter().collect()
}

#[tokio::test]
async fn an_expired_memory_of_every_tier_is_gone_from_every_store_after_one_sweep() {
    use fred::prelude::*;
    let (app, db) = sweeping_app(|_| {}).await;
    let tenant = app.config.auth.default_tenant.clone();
    let prefix = app.config.redis.key_prefix.clone();
    let expiring = app
        .write(json!({"memories": [
            {"agent_id": "a", "session_id": "s", "tier": "working", "content": "scratch note", "retention": "transient"},
            {"agent_id": "a", "tier": "episodic", "content": "Called the airline", "retention": "transient"},
            {"agent_id": "a", "tier": "semantic", "content": "The gate is B12", "retention": "transient"},
            {"agent_id": "a", "skill_name": "rebook", "content": "Rebook on the next flight", "retention": "transient"},
        ]}))
        .await;
    let kept = app
        .write(json!({"memories": [
            {"agent_id": "a", "session_id": "s", "tier": "working", "content": "kept note"},
            {"agent_id": "a", "tier": "episodic", "content": "Landed in Lisbon"},
            {"agent_id": "a", "tier": "semantic", "content": "The user likes aisle seats"},
            {"agent_id": "a", "skill_name": "greet", "content": "Say hello"},
        ]}))
        .await;
    let skill = id_of(&expiring[3]);
    app.get_json(&format!("/v1/memories/{skill}")).await; // caches the skill
    let before = index_sizes(&app);
    if app.storage.pg().is_none() {
        // The three persistent memories of each batch have a vector and text.
        assert_eq!((before["vectors"], before["text"]), (6, 6));
    }

    app.clock.advance(Duration::hours(2));
    let preview = app.get_json("/v1/retention/preview").await.1;
    let report = app.retention.run_once().await.unwrap();
    assert!(report.ran && report.failed.is_empty(), "{report:?}");
    for (i, tier) in [Tier::Working, Tier::Episodic, Tier::Semantic, Tier::Procedural].into_iter().enumerate() {
        assert_eq!(report.deleted.get(&(tier, Reason::Expired)), Some(&1), "{tier:?}: {report:?}");
        assert_eq!(preview["tiers"][i]["expired"]["ids"], json!([expiring[i]["id"]]), "{preview}");
    }
    for m in &expiring {
        assert_eq!(stored_rows(&app, id_of(m)).await, 0, "{m}");
    }
    for m in &kept {
        let id = id_of(m);
        let rows = stored_rows(&app, id).await;
        // Postgres keeps working memory in Redis, checked below.
        let expected = if app.storage.pg().is_some() && m["tier"] == "working" { 0 } else { 1 };
        assert_eq!(rows, expected, "{m}");
        assert_eq!(app.get_json(&format!("/v1/memories/{id}")).await.0, StatusCode::OK);
    }
    if app.storage.pg().is_some() {
        let redis = app.redis().await;
        let gone = id_of(&expiring[0]);
        let tag = format!("{{{tenant}:a:s}}");
        // One key per call: on a cluster the pointer is on another slot.
        for key in [format!("{prefix}:{tenant}:wm:e:{tag}:{gone}"), format!("{prefix}:{tenant}:wm:p:{gone}")] {
            assert_eq!(redis.exists::<i64, _>(&key).await.unwrap(), 0, "{key}");
        }
        let listed: Vec<String> = redis.lrange(format!("{prefix}:{tenant}:wm:l:{tag}"), 0, -1).await.unwrap();
        assert_eq!(listed, [kept[0]["id"].as_str().unwrap()], "the session list names the live entry only");
        assert_eq!(redis.exists::<i64, _>(format!("{prefix}:{tenant}:skill:{skill}")).await.unwrap(), 0);
    } else {
        let after = index_sizes(&app);
        assert_eq!((after["vectors"], after["text"]), (3, 3), "the in-process indexes lost the deleted rows");
    }
    // A second sweep finds nothing; the backlog is empty.
    let again = app.retention.run_once().await.unwrap();
    assert!(again.deleted.is_empty(), "{again:?}");
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(metrics.contains("engram_retention_deleted_total{tier=\"semantic\",reason=\"expired\"}"), "{metrics}");
    assert!(metrics.contains("engram_retention_backlog{tier=\"episodic\"} 0"), "{metrics}");
    if app.storage.pg().is_none() {
        assert!(metrics.contains("engram_index_entries{index=\"vectors\"}"), "{metrics}");
    }
    done(app, db).await;
}

#[tokio::test]
async fn decay_deletes_exactly_what_the_dry_run_listed() {
    let (app, db) = sweeping_app(|_| {}).await;
    let written = app
        .write(json!({"memories": [
            // 0.05 + 0.35 · 2^(−20/7) = 0.0986 after 20 days unread: decays.
            {"agent_id": "d", "tier": "episodic", "content": "Checked the weather", "importance": 0.1},
            {"agent_id": "d", "tier": "episodic", "content": "Chose a window seat", "importance": 0.05},
            // 0.15 + 0.0486: kept.
            {"agent_id": "d", "tier": "episodic", "content": "Paid the deposit", "importance": 0.3},
            // Permanent never decays; semantic is off by default.
            {"agent_id": "d", "tier": "episodic", "content": "Signed the lease", "importance": 0.0, "retention": "permanent"},
            {"agent_id": "d", "tier": "semantic", "content": "The flat has two rooms", "importance": 0.0},
        ]}))
        .await;
    // Young: nothing decays before the minimum age (7 days), whatever the score.
    app.clock.advance(Duration::days(6));
    let young = app.get_json("/v1/retention/preview").await.1;
    assert_eq!(young["tiers"][1]["decayed"]["count"], 0, "{young}");

    app.clock.advance(Duration::days(14));
    let (status, preview) = app.get_json("/v1/retention/preview?limit=1").await;
    assert_eq!(status, StatusCode::OK);
    let episodic = &preview["tiers"][1];
    assert_eq!(episodic["tier"], "episodic");
    assert_eq!(episodic["decayed"]["count"], 2, "{preview}");
    assert_eq!(episodic["decayed"]["truncated"], true);
    let full = app.get_json("/v1/retention/preview").await.1;
    let listed: Vec<Uuid> = full["tiers"][1]["decayed"]["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().parse().unwrap())
        .collect();
    let mut expected = vec![id_of(&written[0]), id_of(&written[1])];
    expected.sort();
    let mut got = listed.clone();
    got.sort();
    assert_eq!(got, expected);
    for t in [0, 2, 3] {
        assert_eq!(full["tiers"][t]["decayed"]["count"], 0, "{full}");
    }
    // Nothing was deleted by looking.
    for m in &written {
        assert_eq!(stored_rows(&app, id_of(m)).await, 1);
    }

    let report = app.retention.run_once().await.unwrap();
    assert_eq!(report.deleted.get(&(Tier::Episodic, Reason::Decayed)), Some(&2), "{report:?}");
    assert_eq!(report.deleted.len(), 1, "{report:?}");
    for m in &written {
        let id = id_of(m);
        let expected = if listed.contains(&id) { 0 } else { 1 };
        assert_eq!(stored_rows(&app, id).await, expected, "{m}");
    }
    done(app, db).await;
}

#[tokio::test]
async fn one_sweeper_at_a_time() {
    let (app, db) = sweeping_app(|_| {}).await;
    let lease = app.storage.sweep.try_begin().await.unwrap().expect("the first sweeper gets the lock");
    assert!(app.storage.sweep.try_begin().await.unwrap().is_none());
    assert!(!app.retention.run_once().await.unwrap().ran, "a sweep waits for the other one");
    drop(lease);
    // On Postgres the lock goes with its connection, closed in the background.
    let mut ran = false;
    for _ in 0..50 {
        if app.retention.run_once().await.unwrap().ran {
            ran = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(ran, "the lock is released with its lease");
    done(app, db).await;
}

#[tokio::test]
async fn one_sweep_works_through_many_small_batches() {
    let (app, db) = sweeping_app(|c| c.retention.sweep_batch = 2).await;
    let mut memories = Vec::new();
    for i in 0..5 {
        memories.push(
            json!({"agent_id": "b", "tier": "episodic", "content": format!("Episode {i}"), "retention": "transient"}),
        );
        memories.push(json!({"agent_id": "b", "session_id": "s", "tier": "working", "content": format!("Note {i}"),
            "retention": "transient"}));
        memories.push(
            json!({"agent_id": "b", "tier": "episodic", "content": format!("Dull episode {i}"), "importance": 0.0}),
        );
    }
    // A fact and the fact that supersedes it, both expiring: the superseded
    // one leaves the in-process indexes too.
    memories
        .push(json!({"agent_id": "b", "tier": "semantic", "content": "The office is on floor 2", "subject": "office",
        "predicate": "floor", "retention": "transient"}));
    let written = app.write(json!({ "memories": memories })).await;
    app.write_one(
        json!({"agent_id": "b", "tier": "semantic", "content": "The office is on floor 3", "subject": "office",
        "predicate": "floor", "retention": "transient"}),
    )
    .await;

    app.clock.advance(Duration::days(30));
    let preview = app.get_json("/v1/retention/preview").await.1;
    assert_eq!(preview["tiers"][0]["expired"]["count"], 5, "{preview}");
    assert_eq!(preview["tiers"][1]["expired"]["count"], 5, "{preview}");
    assert_eq!(preview["tiers"][1]["decayed"]["count"], 5, "{preview}");
    assert_eq!(preview["tiers"][2]["expired"]["count"], 2, "{preview}");
    let report = app.retention.run_once().await.unwrap();
    assert_eq!(report.deleted.get(&(Tier::Working, Reason::Expired)), Some(&5), "{report:?}");
    assert_eq!(report.deleted.get(&(Tier::Episodic, Reason::Expired)), Some(&5), "{report:?}");
    assert_eq!(report.deleted.get(&(Tier::Episodic, Reason::Decayed)), Some(&5), "{report:?}");
    assert_eq!(report.deleted.get(&(Tier::Semantic, Reason::Expired)), Some(&2), "{report:?}");
    for m in &written {
        assert_eq!(stored_rows(&app, id_of(m)).await, 0, "{m}");
    }
    if app.storage.pg().is_none() {
        let sizes = index_sizes(&app);
        assert_eq!((sizes["vectors"], sizes["text"]), (0, 0));
    }
    done(app, db).await;
}

#[tokio::test]
async fn with_redis_down_the_persistent_tiers_are_still_swept() {
    let (app, db) = sweeping_app(|c| c.redis.url = "redis://127.0.0.1:1".into()).await;
    if app.postgres_only("working memory in Redis").is_none() {
        return done(app, db).await;
    }
    let m = app
        .write_one(json!({"agent_id": "r", "tier": "episodic", "content": "Went offline", "retention": "transient"}))
        .await;
    app.clock.advance(Duration::hours(2));
    let report = app.retention.run_once().await.unwrap();
    assert_eq!(report.failed, [(Tier::Working, Reason::Expired)], "{report:?}");
    assert_eq!(report.deleted.get(&(Tier::Episodic, Reason::Expired)), Some(&1), "{report:?}");
    assert_eq!(stored_rows(&app, id_of(&m)).await, 0);
    done(app, db).await;
}

#[tokio::test]
async fn a_sweep_dropped_midway_leaves_the_indexes_matching_the_database() {
    let (app, db) = sweeping_app(|c| c.retention.sweep_batch = 2).await;
    let Some(sqlite) = app.storage.sqlite().cloned() else {
        eprintln!("skipped on the Postgres backend: the in-process indexes are the embedded backend's");
        return done(app, db).await;
    };
    let memories: Vec<Value> = (0..40)
        .map(|i| json!({"agent_id": "c", "tier": "episodic", "content": format!("Step {i}"), "retention": "transient"}))
        .collect();
    app.write(json!({ "memories": memories })).await;
    app.clock.advance(Duration::hours(2));
    let rows = || async {
        let n: i64 = sqlx::query_scalar("select count(*) from memories").fetch_one(sqlite.pool()).await.unwrap();
        n as usize
    };
    for micros in [50, 200, 500, 1_000, 2_000, 5_000] {
        // The caller stops waiting mid-sweep; a batch already begun finishes.
        let _ = tokio::time::timeout(std::time::Duration::from_micros(micros), app.retention.run_once()).await;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let sizes = index_sizes(&app);
        let n = rows().await;
        assert_eq!((sizes["vectors"], sizes["text"]), (n, n), "after a sweep dropped at {micros} µs");
    }
    app.retention.run_once().await.unwrap();
    assert_eq!(rows().await, 0);
    done(app, db).await;
}
