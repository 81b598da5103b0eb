//! A tenant can neither read, list, update, delete nor dedup onto another
//! tenant's memories, and learns nothing of their existence (404, not 403).

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{expect_error, spawn_app_with};

#[tokio::test]
async fn tenants_are_isolated_in_every_operation() {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let (ta, tb) = (format!("a-{suffix}"), format!("b-{suffix}"));
    let server = spawn_app_with(|c| {
        c.auth.keys = vec![
            engram::config::ApiKeyConfig::from_plain(&ta, "key-a", Default::default()),
            engram::config::ApiKeyConfig::from_plain(&tb, "key-b", Default::default()),
        ];
    })
    .await;
    let a = server.as_key("key-a");
    let b = server.as_key("key-b");

    // The same agent, user and content in both tenants.
    let fact = json!({"agent_id": "shared", "user_id": "u", "tier": "semantic", "content": "User lives in Porto",
                      "subject": "user", "predicate": "city", "confidence": 0.5});
    let mine = a.write_one(fact.clone()).await;
    let episode = a.write_one(json!({"agent_id": "shared", "tier": "episodic", "content": "private talk"})).await;
    let working =
        a.write_one(json!({"agent_id": "shared", "session_id": "s", "tier": "working", "content": "scratch"})).await;
    let skill = a.write_one(json!({"agent_id": "shared", "skill_name": "s1", "content": "do the thing"})).await;

    // B's identical fact neither dedups onto A's nor supersedes it.
    let theirs = b
        .write_one(json!({"agent_id": "shared", "user_id": "u", "tier": "semantic", "content": "User lives in Porto",
                                    "subject": "user", "predicate": "city", "confidence": 0.9}))
        .await;
    assert_eq!(theirs["deduplicated"], false);
    assert_ne!(theirs["id"], mine["id"]);
    assert_eq!(theirs["supersedes"], Value::Null);
    // B's skill of the same name is B's own.
    let their_skill = b.write_one(json!({"agent_id": "shared", "skill_name": "s1", "content": "other thing"})).await;
    assert_ne!(their_skill["id"], skill["id"]);
    assert_eq!(their_skill["version"], 1);

    for m in [&mine, &episode, &working, &skill] {
        let path = format!("/v1/memories/{}", m["id"].as_str().unwrap());
        expect_error(b.get(&path).await, StatusCode::NOT_FOUND, "memory_not_found").await;
        expect_error(b.patch(&path, &json!({"importance": 0.1})).await, StatusCode::NOT_FOUND, "memory_not_found")
            .await;
        expect_error(b.delete(&path).await, StatusCode::NOT_FOUND, "memory_not_found").await;
        expect_error(b.get(&format!("{path}/history")).await, StatusCode::NOT_FOUND, "memory_not_found").await;
        // Still A's, untouched.
        let (status, still) = a.get_json(&path).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(still["content"], m["content"]);
        assert!(still["valid_until"].is_null());
    }
    let (_, listed) = b.get_json("/v1/memories?agent_id=shared").await;
    let ids: Vec<&Value> = listed["memories"].as_array().unwrap().iter().map(|m| &m["id"]).collect();
    assert_eq!(ids, [&their_skill["id"], &theirs["id"]], "only B's own skill and fact: {listed}");
    let (_, session) = b.get_json("/v1/memories?agent_id=shared&session_id=s").await;
    assert_eq!(session["memories"].as_array().unwrap().len(), 0, "A's working memory stays A's: {session}");

    // No key, or an unknown key: 401.
    let anonymous = server.as_key("wrong");
    expect_error(anonymous.get("/v1/memories").await, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let r = server.client.get(format!("{}/v1/memories", server.base)).send().await.unwrap();
    expect_error(r, StatusCode::UNAUTHORIZED, "unauthorized").await;
}
