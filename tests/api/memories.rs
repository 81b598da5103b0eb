//! The write path and the read/list/update/delete/history routes.

use chrono::{DateTime, Duration, Utc};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{expect_error, spawn_app};

fn ts(v: &Value) -> DateTime<Utc> {
    v.as_str().unwrap().parse().unwrap()
}

#[tokio::test]
async fn one_memory_of_each_tier_is_written_and_read_back() {
    let app = spawn_app().await;
    let written = app
        .write(json!({"memories": [
            {"agent_id": "a1", "session_id": "s1", "tier": "working", "content": "User is comparing flights to Lisbon"},
            {"agent_id": "a1", "user_id": "u1", "tier": "episodic", "content": "Booked TAP flight 123", "outcome": "success",
             "event_type": "action", "metadata": {"topic": "travel"}},
            {"agent_id": "a1", "user_id": "u1", "content": "User prefers aisle seats", "subject": "user", "predicate": "seat preference",
             "object": "aisle", "confidence": 0.9},
            {"agent_id": "a1", "content": "Search flights, then filter by price", "skill_name": "book_flight",
             "trigger_pattern": "user asks to book a flight", "tool_sequence": [{"tool": "search"}, {"tool": "filter"}], "outcome": "success"}
        ]}))
        .await;
    let tiers: Vec<&str> = written.iter().map(|m| m["tier"].as_str().unwrap()).collect();
    // Tiers given or inferred from the fields (fact fields → semantic, skill fields → procedural).
    assert_eq!(tiers, ["working", "episodic", "semantic", "procedural"]);
    assert!(written.iter().all(|m| m["deduplicated"] == false));

    for m in &written {
        let (status, got) = app.get_json(&format!("/v1/memories/{}", m["id"].as_str().unwrap())).await;
        assert_eq!(status, StatusCode::OK, "{got}");
        assert_eq!(got["content"], m["content"]);
        assert_eq!(got["tier"], m["tier"]);
    }
    let [working, episodic, semantic, procedural] = &written[..] else { unreachable!() };
    // Default retentions and the expiry they imply.
    assert_eq!(working["retention"], "session");
    assert_eq!(ts(&working["expires_at"]) - ts(&working["created_at"]), Duration::hours(24));
    assert_eq!(episodic["retention"], "medium_term");
    assert_eq!(ts(&episodic["expires_at"]) - ts(&episodic["created_at"]), Duration::days(90));
    assert_eq!(semantic["retention"], "long_term");
    assert_eq!(ts(&semantic["expires_at"]) - ts(&semantic["created_at"]), Duration::days(365));
    assert_eq!(procedural["retention"], "permanent");
    assert_eq!(procedural["expires_at"], Value::Null);
    // Tier fields.
    assert_eq!(episodic["event_type"], "action");
    assert_eq!(episodic["metadata"]["topic"], "travel");
    assert_eq!(semantic["namespace"], "user:u1");
    assert_eq!(semantic["subject"], "user");
    assert_eq!(procedural["success_count"], 1);
    assert_eq!(procedural["success_rate"], 1.0);
    // Persistent tiers carry the configured model's vector.
    assert_eq!(episodic["embedding_model"], "lexical-hash-v1-384");
    assert_eq!(working["embedding_model"], Value::Null);
    // occurred_at defaults to the write time.
    assert_eq!(episodic["occurred_at"], episodic["created_at"]);
}

#[tokio::test]
async fn occurred_at_is_kept_apart_from_created_at() {
    let app = spawn_app().await;
    let m = app
        .write_one(
            json!({"agent_id": "a", "tier": "episodic", "content": "Met Anna", "occurred_at": "2023-05-08T13:56:00Z"}),
        )
        .await;
    assert_eq!(ts(&m["occurred_at"]), "2023-05-08T13:56:00Z".parse::<DateTime<Utc>>().unwrap());
    assert!(ts(&m["created_at"]) > ts(&m["occurred_at"]));
}

#[tokio::test]
async fn an_identical_fact_is_deduplicated_per_namespace() {
    let app = spawn_app().await;
    let first = app
        .write_one(json!({"agent_id": "a", "user_id": "u", "tier": "semantic", "content": "User likes green tea."}))
        .await;
    // Same fact after normalisation (case, spacing, final stop).
    let again = app
        .write_one(json!({"agent_id": "a", "user_id": "u", "tier": "semantic", "content": "user likes  GREEN tea"}))
        .await;
    assert_eq!(again["id"], first["id"]);
    assert_eq!(again["deduplicated"], true);
    // Another user's namespace is another fact.
    let other = app
        .write_one(json!({"agent_id": "a", "user_id": "u2", "tier": "semantic", "content": "User likes green tea."}))
        .await;
    assert_ne!(other["id"], first["id"]);
    assert_eq!(other["deduplicated"], false);
    // In one batch, the second copy dedups onto the first.
    let batch = app
        .write(json!({"memories": [
            {"agent_id": "a", "tier": "semantic", "content": "Paris is in France"},
            {"agent_id": "a", "tier": "semantic", "content": "paris is in france."}
        ]}))
        .await;
    assert_eq!(batch[0]["id"], batch[1]["id"]);
    assert_eq!(batch[1]["deduplicated"], true);
}

#[tokio::test]
async fn a_weaker_contradicting_fact_is_kept_as_a_candidate_and_a_stronger_one_supersedes() {
    let app = spawn_app().await;
    let fact = |content: &str, confidence: f64| {
        json!({"agent_id": "a", "user_id": "u", "content": content, "subject": "User", "predicate": "favourite colour",
               "object": content.rsplit(' ').next().unwrap(), "confidence": confidence})
    };
    let blue = app.write_one(fact("User's favourite colour is blue", 0.8)).await;
    assert_eq!(blue["source"], "agent");
    // Newer but less confident: kept as a candidate, never valid, the current fact untouched.
    let red = app.write_one(fact("User's favourite colour is red", 0.5)).await;
    assert_eq!(red["supersedes"], Value::Null);
    assert_eq!(red["contested_by"], blue["id"]);
    assert_eq!(red["valid_until"], red["valid_from"], "{red}");
    let (_, blue_now) = app.get_json(&format!("/v1/memories/{}", blue["id"].as_str().unwrap())).await;
    assert_eq!(blue_now["valid_until"], Value::Null);
    // Said again with the same weight: the same candidate.
    let red_again = app.write(json!({"memories": [fact("User's favourite colour is red", 0.5)]})).await;
    assert_eq!(red_again[0]["id"], red["id"]);
    assert_eq!(red_again[0]["deduplicated"], true);
    // Never recalled.
    let found: Value = app
        .post("/v1/memories/search", &json!({"agent_id": "a", "user_id": "u", "query": "favourite colour red"}))
        .await
        .json()
        .await
        .unwrap();
    let recalled: Vec<&Value> = found["results"].as_array().unwrap().iter().map(|r| &r["memory"]["id"]).collect();
    assert!(!recalled.contains(&&red["id"]), "{found}");

    // More confident: takes the slot and supersedes the current fact.
    let green = app.write_one(fact("User's favourite colour is green", 0.9)).await;
    assert_eq!(green["supersedes"], blue["id"]);
    assert_eq!(green["contested_by"], Value::Null);
    let (_, blue_after) = app.get_json(&format!("/v1/memories/{}", blue["id"].as_str().unwrap())).await;
    assert!(blue_after["valid_until"].is_string(), "{blue_after}");

    // History: the chain oldest first, each fact followed by its candidates;
    // a candidate's history is that of the fact it contests.
    for id in [&green["id"], &red["id"]] {
        let (status, history) = app.get_json(&format!("/v1/memories/{}/history", id.as_str().unwrap())).await;
        assert_eq!(status, StatusCode::OK);
        let chain: Vec<&str> =
            history["memories"].as_array().unwrap().iter().map(|m| m["content"].as_str().unwrap()).collect();
        assert_eq!(
            chain,
            ["User's favourite colour is blue", "User's favourite colour is red", "User's favourite colour is green"]
        );
    }

    // Listing hides superseded facts and candidates unless asked.
    let (_, listed) = app.get_json("/v1/memories?agent_id=a&tier=semantic").await;
    let contents: Vec<&str> =
        listed["memories"].as_array().unwrap().iter().map(|m| m["content"].as_str().unwrap()).collect();
    assert_eq!(contents, ["User's favourite colour is green"]);
    let (_, all) = app.get_json("/v1/memories?agent_id=a&tier=semantic&include_superseded=true").await;
    assert_eq!(all["memories"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn a_multi_valued_predicate_keeps_one_current_fact_per_object() {
    let app = spawn_app().await;
    let fact = |content: &str, predicate: &str, object: &str| json!({"agent_id": "a", "content": content, "subject": "Alice", "predicate": predicate, "object": object});
    let tea = app.write_one(fact("Alice likes tea.", "likes", "tea")).await;
    let jazz = app.write_one(fact("Alice likes jazz.", "Likes", "jazz")).await;
    assert_eq!(jazz["supersedes"], Value::Null);
    assert_eq!(jazz["contested_by"], Value::Null);
    // The same object said again in other words replaces only its own fact.
    let tea_again = app.write_one(fact("Alice really likes tea.", "likes", "tea")).await;
    assert_eq!(tea_again["supersedes"], tea["id"]);
    // A single-valued predicate: one current fact, whatever the object.
    app.write_one(fact("Alice lives in Oslo.", "lives_in", "Oslo")).await;
    let rome = app.write_one(fact("Alice lives in Rome.", "lives_in", "Rome")).await;
    assert!(rome["supersedes"].is_string());

    let (_, listed) = app.get_json("/v1/memories?agent_id=a&tier=semantic").await;
    let mut contents: Vec<&str> =
        listed["memories"].as_array().unwrap().iter().map(|m| m["content"].as_str().unwrap()).collect();
    contents.sort();
    assert_eq!(contents, ["Alice likes jazz.", "Alice lives in Rome.", "Alice really likes tea."]);
}

#[tokio::test]
async fn a_skill_is_upserted_and_outcomes_move_its_counters() {
    let app = spawn_app().await;
    let skill = |outcome: &str, reward: f64| {
        json!({"agent_id": "a", "skill_name": "refund", "content": "Check the order, then refund via the payments tool",
               "outcome": outcome, "reward": reward})
    };
    let first = app.write_one(skill("success", 1.0)).await;
    let second = app.write_one(skill("failure", 0.0)).await;
    let third = app.write_one(skill("success", 0.5)).await;
    assert_eq!(first["id"], second["id"]);
    assert_eq!(second["id"], third["id"]);
    assert_eq!(third["success_count"], 2);
    assert_eq!(third["failure_count"], 1);
    // 2 / (2 + 1) = 0.6667 (stored as real).
    assert!((third["success_rate"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-6);
    // Rewards 1.0, 0.0, 0.5 → mean 0.5.
    assert!((third["avg_reward"].as_f64().unwrap() - 0.5).abs() < 1e-6);
    assert_eq!(third["version"], 3);
    // A read after the upsert sees the new counters (the cache was invalidated).
    let path = format!("/v1/memories/{}", first["id"].as_str().unwrap());
    let (_, cached) = app.get_json(&path).await;
    assert_eq!(cached["version"], 3);
    app.write_one(skill("success", 1.0)).await;
    let (_, fresh) = app.get_json(&path).await;
    assert_eq!(fresh["version"], 4);
    assert_eq!(fresh["success_count"], 3);
}

#[tokio::test]
async fn listing_paginates_with_a_cursor_without_gaps_or_repeats() {
    let app = spawn_app().await;
    let mut ids = Vec::new();
    for i in 0..7 {
        app.clock.advance(Duration::milliseconds(5));
        let tier = if i % 2 == 0 { "episodic" } else { "semantic" };
        let m =
            app.write_one(json!({"agent_id": "pager", "tier": tier, "content": format!("memory number {i}")})).await;
        ids.push(m["id"].as_str().unwrap().to_string());
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/memories?agent_id=pager&limit=3&cursor={c}"),
            None => "/v1/memories?agent_id=pager&limit=3".to_string(),
        };
        let (status, page) = app.get_json(&path).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        pages += 1;
        seen.extend(page["memories"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_string()));
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    ids.reverse(); // newest first
    assert_eq!(seen, ids);
}

#[tokio::test]
async fn listing_filters_by_tier_user_session_metadata_and_time() {
    let app = spawn_app().await;
    app.write(json!({"memories": [
        {"agent_id": "f", "user_id": "u1", "session_id": "s1", "tier": "episodic", "content": "one", "metadata": {"topic": "travel", "n": 5}},
        {"agent_id": "f", "user_id": "u2", "session_id": "s2", "tier": "episodic", "content": "two", "metadata": {"topic": "food"}},
        {"agent_id": "f", "user_id": "u1", "tier": "semantic", "content": "The user is vegetarian", "metadata": {"topic": "food"}},
        {"agent_id": "f", "session_id": "s1", "tier": "working", "content": "scratch"},
        {"agent_id": "other", "tier": "episodic", "content": "elsewhere", "metadata": {"topic": "travel"}}
    ]}))
    .await;
    let contents = |v: &Value| {
        let mut c: Vec<String> =
            v["memories"].as_array().unwrap().iter().map(|m| m["content"].as_str().unwrap().to_string()).collect();
        c.sort();
        c
    };
    let (_, v) = app.get_json("/v1/memories?agent_id=f&metadata.topic=food").await;
    assert_eq!(contents(&v), ["The user is vegetarian", "two"]);
    let (_, v) = app.get_json("/v1/memories?agent_id=f&metadata.n=5").await;
    assert_eq!(contents(&v), ["one"]);
    let (_, v) = app.get_json("/v1/memories?agent_id=f&user_id=u1").await;
    assert_eq!(contents(&v), ["The user is vegetarian", "one"]);
    let (_, v) = app.get_json("/v1/memories?agent_id=f&session_id=s1").await;
    assert_eq!(contents(&v), ["one", "scratch"]);
    let (_, v) = app.get_json("/v1/memories?agent_id=f&tier=working&session_id=s1").await;
    assert_eq!(contents(&v), ["scratch"]);
    let (_, v) = app.get_json("/v1/memories?metadata.topic=travel").await;
    assert_eq!(contents(&v), ["elsewhere", "one"]);
    let later = (app.clock.now_plus(Duration::minutes(1))).to_rfc3339().replace('+', "%2B");
    let (_, v) = app.get_json(&format!("/v1/memories?agent_id=f&created_after={later}")).await;
    assert_eq!(contents(&v), Vec::<String>::new());
    let (_, v) = app.get_json(&format!("/v1/memories?agent_id=f&created_before={later}&tier=episodic")).await;
    assert_eq!(contents(&v), ["one", "two"]);
}

#[tokio::test]
async fn patch_changes_content_importance_metadata_and_retention() {
    let app = spawn_app().await;
    let m = app
        .write_one(json!({"agent_id": "p", "tier": "episodic", "content": "Ordered pizza", "importance": 0.3,
                          "metadata": {"a": 1, "b": 2}}))
        .await;
    let path = format!("/v1/memories/{}", m["id"].as_str().unwrap());
    let r = app
        .patch(&path, &json!({"content": "Ordered sushi", "importance": 0.9, "metadata": {"a": null, "c": 3}, "retention": "short_term"}))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let got: Value = r.json().await.unwrap();
    assert_eq!(got["content"], "Ordered sushi");
    assert!((got["importance"].as_f64().unwrap() - 0.9).abs() < 1e-6);
    assert_eq!(got["metadata"], json!({"b": 2, "c": 3}));
    assert_eq!(got["retention"], "short_term");
    assert_eq!(ts(&got["expires_at"]) - ts(&got["created_at"]), Duration::days(7));
    assert_eq!(got["embedding_model"], "lexical-hash-v1-384");
    let (_, again) = app.get_json(&path).await;
    assert_eq!(again["content"], "Ordered sushi");
    // Working memory is patched in Redis.
    let w = app.write_one(json!({"agent_id": "p", "session_id": "s", "tier": "working", "content": "draft"})).await;
    let r = app.patch(&format!("/v1/memories/{}", w["id"].as_str().unwrap()), &json!({"content": "final"})).await;
    assert_eq!(r.status(), StatusCode::OK);
    let (_, w2) = app.get_json(&format!("/v1/memories/{}", w["id"].as_str().unwrap())).await;
    assert_eq!(w2["content"], "final");
    // An empty patch says what is missing.
    let r = app.patch(&path, &json!({})).await;
    expect_error(r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field").await;
}

#[tokio::test]
async fn delete_removes_the_row_and_every_redis_copy() {
    let app = spawn_app().await;
    // On the embedded backend working memory is a table and the skill cache
    // a map in the process: there are no Redis copies to look at.
    let redis = match app.storage.pg() {
        Some(_) => Some(app.redis().await),
        None => None,
    };
    use fred::prelude::*;
    let tenant = &app.config.auth.default_tenant;
    let prefix = &app.config.redis.key_prefix;

    let w = app.write_one(json!({"agent_id": "d", "session_id": "s", "tier": "working", "content": "scratch"})).await;
    let wid = w["id"].as_str().unwrap();
    let item_key = format!("{prefix}:{tenant}:wm:e:{{{tenant}:d:s}}:{wid}");
    let pointer_key = format!("{prefix}:{tenant}:wm:p:{wid}");
    let session_key = format!("{prefix}:{tenant}:wm:l:{{{tenant}:d:s}}");
    if let Some(redis) = &redis {
        assert_eq!(redis.exists::<i64, _>(&item_key).await.unwrap(), 1);
        assert_eq!(redis.get::<String, _>(&pointer_key).await.unwrap(), item_key);
    }
    assert_eq!(app.delete(&format!("/v1/memories/{wid}")).await.status(), StatusCode::NO_CONTENT);
    if let Some(redis) = &redis {
        assert_eq!(redis.exists::<i64, _>(&item_key).await.unwrap(), 0, "the Redis copy is gone");
        assert_eq!(redis.exists::<i64, _>(&pointer_key).await.unwrap(), 0, "so is its pointer");
        let ids: Vec<String> = redis.lrange(&session_key, 0, -1).await.unwrap();
        assert!(!ids.contains(&wid.to_string()));
    }

    let p = app.write_one(json!({"agent_id": "d", "skill_name": "greet", "content": "Say hello"})).await;
    let pid = p["id"].as_str().unwrap();
    app.get_json(&format!("/v1/memories/{pid}")).await; // caches it
    let skill_key = format!("{prefix}:{tenant}:skill:{pid}");
    if let Some(redis) = &redis {
        assert_eq!(redis.exists::<i64, _>(&skill_key).await.unwrap(), 1);
    }
    assert_eq!(app.delete(&format!("/v1/memories/{pid}")).await.status(), StatusCode::NO_CONTENT);
    if let Some(redis) = &redis {
        assert_eq!(redis.exists::<i64, _>(&skill_key).await.unwrap(), 0);
    }

    for id in [wid, pid] {
        let r = app.get(&format!("/v1/memories/{id}")).await;
        expect_error(r, StatusCode::NOT_FOUND, "memory_not_found").await;
        let r = app.delete(&format!("/v1/memories/{id}")).await;
        expect_error(r, StatusCode::NOT_FOUND, "memory_not_found").await;
    }
    let e = app.write_one(json!({"agent_id": "d", "tier": "episodic", "content": "gone soon"})).await;
    assert_eq!(
        app.delete(&format!("/v1/memories/{}", e["id"].as_str().unwrap())).await.status(),
        StatusCode::NO_CONTENT
    );
    let (status, _) = app.get_json(&format!("/v1/memories/{}", e["id"].as_str().unwrap())).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn expired_memories_are_gone_before_any_sweep() {
    let app = spawn_app().await;
    let m = app
        .write_one(json!({"agent_id": "x", "tier": "episodic", "content": "fleeting", "retention": "transient"}))
        .await;
    let f = app
        .write_one(
            json!({"agent_id": "x", "tier": "semantic", "content": "The sky is green", "retention": "transient"}),
        )
        .await;
    let path = format!("/v1/memories/{}", m["id"].as_str().unwrap());
    assert_eq!(app.get_json(&path).await.0, StatusCode::OK);
    app.clock.advance(Duration::minutes(61));
    assert_eq!(app.get_json(&path).await.0, StatusCode::NOT_FOUND);
    let (_, listed) = app.get_json("/v1/memories?agent_id=x").await;
    assert_eq!(listed["memories"].as_array().unwrap().len(), 0);
    // An expired fact does not swallow the same fact written again.
    let again = app.write_one(json!({"agent_id": "x", "tier": "semantic", "content": "The sky is green"})).await;
    assert_eq!(again["deduplicated"], false);
    assert_ne!(again["id"], f["id"]);
}

#[tokio::test]
async fn an_idempotency_key_replays_the_first_response() {
    let app = spawn_app().await;
    let body = r#"{"agent_id": "i", "tier": "episodic", "content": "charged the card"}"#;
    let send = |key: &'static str, body: &'static str| {
        app.client
            .post(format!("{}/v1/memories", app.base))
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let first = send("k-1", body).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.unwrap();
    let second = send("k-1", body).await.unwrap();
    assert_eq!(second.status(), StatusCode::CREATED);
    assert_eq!(second.headers().get("idempotent-replayed").unwrap(), "true");
    let second: Value = second.json().await.unwrap();
    assert_eq!(first, second);
    let (_, listed) = app.get_json("/v1/memories?agent_id=i").await;
    assert_eq!(listed["memories"].as_array().unwrap().len(), 1, "written once");
    let other = send("k-1", r#"{"agent_id": "i", "tier": "episodic", "content": "charged twice"}"#).await.unwrap();
    expect_error(other, StatusCode::CONFLICT, "idempotency_key_reused").await;
    // After 24 hours the key is free again.
    app.clock.advance(Duration::hours(25));
    let later = send("k-1", r#"{"agent_id": "i", "tier": "episodic", "content": "a new day"}"#).await.unwrap();
    assert_eq!(later.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn concurrent_requests_with_one_key_write_once() {
    let app = spawn_app().await;
    let body = json!({"agent_id": "race", "tier": "episodic", "content": "exactly once"});
    let mut handles = Vec::new();
    for _ in 0..8 {
        let req = app.client.post(format!("{}/v1/memories", app.base)).header("idempotency-key", "same").json(&body);
        handles.push(tokio::spawn(async move { req.send().await.unwrap().json::<Value>().await.unwrap() }));
    }
    let mut ids = Vec::new();
    for h in handles {
        ids.push(h.await.unwrap()["memories"][0]["id"].clone());
    }
    assert!(ids.windows(2).all(|w| w[0] == w[1]), "{ids:?}");
    let (_, listed) = app.get_json("/v1/memories?agent_id=race").await;
    assert_eq!(listed["memories"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn the_classifier_picks_tier_and_importance_when_absent() {
    let app = spawn_app().await;
    let fact = app.write_one(json!({"agent_id": "c", "content": "The user is allergic to peanuts"})).await;
    assert_eq!(fact["tier"], "semantic");
    // Semantic base 0.6 + emphasis ("allergic") 0.2.
    assert!((fact["importance"].as_f64().unwrap() - 0.8).abs() < 1e-6);
    let chat = app.write_one(json!({"agent_id": "c", "content": "I went to the beach with my kids yesterday"})).await;
    assert_eq!(chat["tier"], "episodic");
    assert!((chat["importance"].as_f64().unwrap() - 0.5).abs() < 1e-6);
    let given = app.write_one(json!({"agent_id": "c", "content": "ok", "tier": "episodic", "importance": 0.05})).await;
    assert!((given["importance"].as_f64().unwrap() - 0.05).abs() < 1e-6);
}

#[tokio::test]
async fn concurrent_contradicting_facts_leave_one_current_fact_per_slot() {
    let app = std::sync::Arc::new(spawn_app().await);
    let mut writers = Vec::new();
    for i in 0..12 {
        let app = app.clone();
        writers.push(tokio::spawn(async move {
            let body = json!({"agent_id": "a", "content": format!("Bob's desk is number {i}"), "subject": "Bob",
                              "predicate": "desk", "object": i.to_string(), "confidence": 0.5 + f64::from(i % 4) / 10.0});
            app.write_one(body).await
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    let (_, listed) = app.get_json("/v1/memories?agent_id=a&tier=semantic").await;
    let current = listed["memories"].as_array().unwrap();
    assert_eq!(current.len(), 1, "{listed}");
    // The winner is one of the most confident (0.8).
    assert_eq!(current[0]["confidence"].as_f64().map(|c| (c * 10.0).round()), Some(8.0), "{listed}");
    let (_, all) = app.get_json("/v1/memories?agent_id=a&tier=semantic&include_superseded=true&limit=50").await;
    assert_eq!(all["memories"].as_array().unwrap().len(), 12);
}

/// Clients that give up at every point of a write (the request dropped
/// mid-flight) leave each memory either absent or stored and searchable.
#[tokio::test]
async fn writes_abandoned_by_their_clients_are_absent_or_searchable() {
    let app = spawn_app().await;
    for i in 0..30u64 {
        let memories: Vec<Value> = (0..4)
            .map(|j| json!({"agent_id": "a", "tier": "episodic", "content": format!("walrus report q{i}z{j}")}))
            .collect();
        let request = app.client.post(format!("{}/v1/memories", app.base)).json(&json!({"memories": memories}));
        let request = match &app.api_key {
            Some(key) => request.bearer_auth(key),
            None => request,
        };
        // From 1 ms to 30 ms: some give up before the commit, some during it.
        let _ = request.timeout(std::time::Duration::from_millis(i + 1)).send().await;
    }
    // Whatever the server still had in hand finishes.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;

    let (_, listed) = app.get_json("/v1/memories?agent_id=a&limit=200").await;
    let stored = listed["memories"].as_array().unwrap();
    for m in stored {
        let content = m["content"].as_str().unwrap();
        let found: Value = app
            .post("/v1/memories/search", &json!({"agent_id": "a", "query": content, "top_k": 3}))
            .await
            .json()
            .await
            .unwrap();
        let ids: Vec<&Value> = found["results"].as_array().unwrap().iter().map(|r| &r["memory"]["id"]).collect();
        assert!(ids.contains(&&m["id"]), "{content} is stored but not found: {found}");
    }
    // Batches are all or nothing.
    assert_eq!(stored.len() % 4, 0, "{listed}");
    eprintln!("{} of 30 abandoned batches were stored", stored.len() / 4);
}
