//! Moving a tenant between backends with `engram export` and `engram
//! import` (the library functions the commands call): every tier and every
//! stored field survives a round trip through Postgres + Redis and the
//! embedded database, in both directions, and an import can be re-run.
//! These tests pick their backends themselves, whatever ENGRAM_TEST_BACKEND says.

use std::collections::BTreeMap;

use chrono::{Duration, Utc};
use engram::domain::Tier;
use engram::store::{Embedding, SearchQuery};
use engram::transfer::{self, ImportSummary, TierSummary};
use serde_json::{Value, json};

use crate::helpers::{TestApp, drop_database, fresh_database, spawn_app_with};

async fn embedded_app(tenant: Option<&str>) -> TestApp {
    spawn_app_with(|c| {
        c.database.url = String::new();
        if let Some(t) = tenant {
            c.auth.default_tenant = t.to_string();
        }
    })
    .await
}

async fn postgres_app(db: &str, tenant: Option<&str>) -> TestApp {
    spawn_app_with(|c| {
        c.database.url = db.to_string();
        if let Some(t) = tenant {
            c.auth.default_tenant = t.to_string();
        }
    })
    .await
}

fn tenant(app: &TestApp) -> String {
    app.config.auth.default_tenant.clone()
}

/// Writes one of everything through the API: episodes ingested two months
/// ago, a superseded fact, a skill with
/// outcomes and rewards, working memory, metadata, private memories, and
/// counted accesses.
async fn fill(app: &TestApp) {
    let now = Utc::now();
    app.clock.set(now - Duration::days(62));
    let episode = app
        .write_one(json!({"agent_id": "a", "user_id": "u1", "session_id": "s0", "tier": "episodic",
            "content": "We planned the Lisbon trip", "event_type": "conversation", "outcome": "success",
            "metadata": {"channel": "chat", "nested": {"n": 1}}, "occurred_at": "2025-01-02T03:04:05.123456Z"}))
        .await;
    app.write_one(json!({"agent_id": "a", "tier": "episodic", "content": "Ran the deploy script",
        "event_type": "action", "private": true, "importance": 0.9}))
        .await;
    app.clock.set(now - Duration::days(3));
    let paris = app
        .write_one(json!({"agent_id": "a", "user_id": "u1", "tier": "semantic", "content": "The user lives in Paris",
            "subject": "user", "predicate": "lives_in", "object": "Paris", "confidence": 0.6,
            "source_episode_id": episode["id"]}))
        .await;
    app.clock.set(now - Duration::days(1));
    app.write_one(json!({"agent_id": "a", "user_id": "u1", "tier": "semantic", "content": "The user lives in Berlin",
        "subject": "user", "predicate": "lives_in", "object": "Berlin", "confidence": 0.8,
        "metadata": {"source": "profile"}}))
        .await;
    let skill = json!({"agent_id": "a", "tier": "procedural", "skill_name": "deploy", "content": "Deploy with the script",
        "trigger_pattern": "deploy *", "policy": {"retries": 2}, "tool_sequence": [{"tool": "sh"}],
        "outcome": "success", "reward": 0.5});
    let deploy = app.write_one(skill.clone()).await;
    let mut failed = skill;
    failed["outcome"] = json!("failure");
    failed["reward"] = json!(-0.25);
    app.write_one(failed).await;
    app.clock.set(now);
    for i in 0..3 {
        app.write_one(json!({"agent_id": "a", "session_id": "s1", "tier": "working", "content": format!("turn {i}"),
            "metadata": {"i": i}}))
            .await;
    }
    app.write_one(json!({"agent_id": "b", "session_id": "s2", "tier": "working", "content": "elsewhere"})).await;

    let ids = [(Tier::Episodic, &episode), (Tier::Semantic, &paris), (Tier::Procedural, &deploy)]
        .map(|(tier, m)| (tier, m["id"].as_str().unwrap().parse().unwrap()));
    app.store.record_access(&tenant(app), &ids, now, now - Duration::hours(1)).await.unwrap();
    // Both episodes are consolidated (each alone in its group: no summary).
    assert_eq!(consolidate(app, "a").await["episodes"], 2);
}

/// Runs a consolidation of `agent` and returns its report.
async fn consolidate(app: &TestApp, agent: &str) -> Value {
    let r = app.post("/v1/consolidation", &json!({"agent_id": agent})).await;
    assert_eq!(r.status(), reqwest::StatusCode::ACCEPTED);
    let id = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    for _ in 0..300 {
        let (_, job) = app.get_json(&format!("/v1/consolidation/{id}")).await;
        match job["state"].as_str() {
            Some("completed") => return job["report"].clone(),
            Some("failed") => panic!("{job}"),
            _ => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
    panic!("the consolidation never ended");
}

async fn export(app: &TestApp, tenant: &str, vectors: bool) -> Vec<u8> {
    let mut out = Vec::new();
    transfer::export(&app.storage, tenant, vectors, &mut out, Utc::now()).await.unwrap();
    out
}

async fn import(app: &TestApp, file: &[u8]) -> ImportSummary {
    transfer::import(&app.storage, Some(&tenant(app)), file, Utc::now()).await.unwrap()
}

/// An export as (header without its time, records by id, end record).
fn parse(file: &[u8]) -> (Value, BTreeMap<String, Value>, Value) {
    let lines: Vec<Value> =
        std::str::from_utf8(file).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let mut header = lines[0].clone();
    assert_eq!(header["kind"], "header");
    header.as_object_mut().unwrap().remove("exported_at");
    let end = lines.last().unwrap().clone();
    assert_eq!(end["kind"], "end");
    let records =
        lines[1..lines.len() - 1].iter().map(|r| (r["id"].as_str().unwrap().to_string(), r.clone())).collect();
    (header, records, end)
}

/// The two exports hold the same memories, field by field.
fn assert_same_export(a: &[u8], b: &[u8]) {
    let (header_a, records_a, end_a) = parse(a);
    let (header_b, records_b, end_b) = parse(b);
    assert_eq!(header_a, header_b);
    assert_eq!(end_a, end_b);
    assert_eq!(records_a.keys().collect::<Vec<_>>(), records_b.keys().collect::<Vec<_>>());
    for (id, record) in &records_a {
        assert_eq!(record, &records_b[id], "memory {id} differs");
    }
}

fn counts(imported: [u64; 4], existing: [u64; 4], expired: [u64; 4]) -> BTreeMap<Tier, TierSummary> {
    Tier::ALL
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            (t, TierSummary { imported: imported[i], skipped_existing: existing[i], skipped_expired: expired[i] })
        })
        .collect()
}

/// The export of `fill`: what it must hold whatever the backend.
fn check_contents(file: &[u8]) {
    let (header, records, end) = parse(file);
    assert_eq!(header["vectors"], true);
    assert_eq!(end["counts"], json!({"working": 4, "episodic": 2, "semantic": 2, "procedural": 1}));
    let by_content = |c: &str| records.values().find(|r| r["content"] == c).unwrap().clone();
    let paris = by_content("The user lives in Paris");
    let berlin = by_content("The user lives in Berlin");
    assert!(paris["valid_until"].is_string(), "{paris}");
    assert_eq!(berlin["supersedes"], paris["id"]);
    assert_eq!(paris["access_count"], 1);
    let skill = by_content("Deploy with the script");
    assert_eq!((skill["success_count"].clone(), skill["failure_count"].clone()), (json!(1), json!(1)));
    assert_eq!((skill["reward_count"].clone(), skill["version"].clone()), (json!(2), json!(2)));
    assert_eq!(skill["avg_reward"], 0.125);
    let episode = by_content("We planned the Lisbon trip");
    assert_eq!(episode["metadata"], json!({"channel": "chat", "nested": {"n": 1}}));
    assert_eq!(episode["occurred_at"], "2025-01-02T03:04:05.123456Z");
    assert!(episode["vector"].as_array().is_some_and(|v| v.len() == 384), "the vector is exported");
    assert!(episode["content_hash"].is_string());
    assert!(episode["consolidated_at"].is_string(), "consolidation is exported: {episode}");
    let turn = by_content("turn 1");
    assert_eq!(turn["tier"], "working");
    assert!(turn["vector"].is_null());
}

#[tokio::test]
async fn an_embedded_tenant_moves_to_postgres_and_back_unchanged() {
    let source = embedded_app(None).await;
    fill(&source).await;
    let first = export(&source, &tenant(&source), true).await;
    check_contents(&first);

    let db = fresh_database().await;
    let pg = postgres_app(&db, Some(&tenant(&source))).await;
    let summary = import(&pg, &first).await;
    assert_eq!(summary.tiers, counts([4, 2, 2, 1], [0; 4], [0; 4]));
    assert!(summary.complete);
    // Imported episodes keep their consolidation: none is taken again.
    assert_eq!(consolidate(&pg, "a").await["episodes"], 0);
    let second = export(&pg, &tenant(&pg), true).await;
    assert_same_export(&first, &second);

    // Importing again writes nothing.
    let again = import(&pg, &first).await;
    assert_eq!(again.tiers, counts([0; 4], [4, 2, 2, 1], [0; 4]));
    assert_same_export(&first, &export(&pg, &tenant(&pg), true).await);

    // And back to a new embedded data directory.
    let back = embedded_app(Some(&tenant(&source))).await;
    assert_eq!(import(&back, &second).await.tiers, counts([4, 2, 2, 1], [0; 4], [0; 4]));
    assert_same_export(&first, &export(&back, &tenant(&back), true).await);

    // The imported memories serve recall: the current fact is found, by vector too.
    let (status, found) = back.get_json("/v1/memories?agent_id=a&tier=semantic").await;
    assert!(status.is_success(), "{found}");
    let contents: Vec<&str> =
        found["memories"].as_array().unwrap().iter().map(|m| m["content"].as_str().unwrap()).collect();
    assert_eq!(contents, ["The user lives in Berlin"]);
    drop(pg);
    drop_database(&db).await;
}

#[tokio::test]
async fn a_postgres_tenant_moves_to_the_embedded_backend_unchanged() {
    let db = fresh_database().await;
    let source = postgres_app(&db, None).await;
    fill(&source).await;
    let first = export(&source, &tenant(&source), true).await;
    check_contents(&first);

    let target = embedded_app(Some(&tenant(&source))).await;
    assert_eq!(import(&target, &first).await.tiers, counts([4, 2, 2, 1], [0; 4], [0; 4]));
    assert_eq!(consolidate(&target, "a").await["episodes"], 0);
    let second = export(&target, &tenant(&target), true).await;
    assert_same_export(&first, &second);
    assert_eq!(import(&target, &first).await.tiers, counts([0; 4], [4, 2, 2, 1], [0; 4]));
    assert_same_export(&first, &export(&target, &tenant(&target), true).await);

    // The embedded side's vector index knows the imported vectors.
    let embedder = engram::embed::from_config(&target.config.embedding).unwrap().unwrap();
    let text = "Deploy with the script".to_string();
    let vector = embedder.embed(std::slice::from_ref(&text)).await.unwrap().pop().unwrap();
    let query = SearchQuery {
        agent_id: "a".into(),
        user_id: None,
        tiers: vec![Tier::Procedural],
        text,
        vector: Some(Embedding { model: embedder.model_id().into(), vector }),
        metadata: vec![],
        since: None,
        until: None,
        per_leg: 10,
        include_candidates: false,
        as_of: None,
        valid_at: None,
    };
    let hits = target.store.search(&tenant(&target), &query, Utc::now()).await.unwrap();
    assert!(hits.hits.iter().any(|h| h.memory.skill_name.as_deref() == Some("deploy") && h.similarity.is_some()));
    drop(source);
    drop_database(&db).await;
}

#[tokio::test]
async fn without_vectors_imported_memories_wait_for_the_reembed_job() {
    let source = embedded_app(None).await;
    source.write_one(json!({"agent_id": "a", "tier": "semantic", "content": "The sky is blue"})).await;
    let file = export(&source, &tenant(&source), false).await;
    let (header, records, _) = parse(&file);
    assert_eq!(header["vectors"], false);
    let fact = records.values().next().unwrap();
    assert!(fact["vector"].is_null());
    assert_eq!(fact["embedding_model"], "lexical-hash-v1-384");

    let target = spawn_app_with(|c| {
        c.database.url = String::new();
        c.auth.default_tenant = tenant(&source);
        c.embedding.reembed_batch = 0;
    })
    .await;
    import(&target, &file).await;
    let (_, records, _) = parse(&export(&target, &tenant(&target), false).await);
    assert!(records.values().next().unwrap()["embedding_model"].is_null());
    assert_eq!(target.storage.maintenance.reembed_pending("lexical-hash-v1-384").await.unwrap(), 1);
}

#[tokio::test]
async fn a_bad_line_is_named_and_nothing_of_its_batch_is_written() {
    let source = embedded_app(None).await;
    source.write_one(json!({"agent_id": "a", "tier": "episodic", "content": "A good episode"})).await;
    let file = String::from_utf8(export(&source, &tenant(&source), true).await).unwrap();
    let mut lines: Vec<&str> = file.lines().collect();
    lines.insert(2, r#"{"kind": "memory", "tier": "episodic", "content": "no id"}"#);
    let target = embedded_app(None).await;
    let err = transfer::import(&target.storage, None, lines.join("\n").as_bytes(), Utc::now()).await.unwrap_err();
    assert!(format!("{err:#}").contains("line 3"), "{err:#}");
    let (_, listed) = target.get_json("/v1/memories?agent_id=a").await;
    assert_eq!(listed["memories"], json!([]));
    // Not an export at all.
    let err = transfer::import(&target.storage, None, &b"{\"a\": 1}\n"[..], Utc::now()).await.unwrap_err();
    assert!(format!("{err:#}").contains("line 1"), "{err:#}");
    // A NUL (which Postgres cannot store, and which the embedded backend once
    // took) is refused on either backend, naming the field.
    let nul = file.replacen("A good episode", "A good\\u0000episode", 1);
    let err = transfer::import(&target.storage, None, nul.as_bytes(), Utc::now()).await.unwrap_err();
    assert!(format!("{err:#}").contains("line 2: /content: must not contain the NUL"), "{err:#}");
    let (_, listed) = target.get_json("/v1/memories?agent_id=a").await;
    assert_eq!(listed["memories"], json!([]));
}

#[tokio::test]
async fn expired_memories_are_skipped_and_counted() {
    let source = embedded_app(None).await;
    source.write_one(json!({"agent_id": "a", "session_id": "s", "tier": "working", "content": "soon gone"})).await;
    source.write_one(json!({"agent_id": "a", "tier": "episodic", "content": "kept"})).await;
    let file = export(&source, &tenant(&source), true).await;
    let target = embedded_app(Some(&tenant(&source))).await;
    // Two days later the working entry (24 hours) is past its time.
    let summary =
        transfer::import(&target.storage, None, file.as_slice(), Utc::now() + Duration::days(2)).await.unwrap();
    assert_eq!(summary.tiers, counts([0, 1, 0, 0], [0; 4], [1, 0, 0, 0]));
}
