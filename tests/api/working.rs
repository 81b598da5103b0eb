//! Working memory: bounded, ordered sessions in Redis; and what happens when
//! Redis is down.

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{expect_error, spawn_app_with};

#[tokio::test]
async fn a_session_keeps_its_newest_entries_in_order() {
    let app = spawn_app_with(|c| c.redis.working_max_entries = 3).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let m = app
            .write_one(json!({"agent_id": "w", "session_id": "s", "tier": "working", "content": format!("turn {i}")}))
            .await;
        ids.push(m["id"].as_str().unwrap().to_string());
    }
    let (_, listed) = app.get_json("/v1/memories?agent_id=w&session_id=s&tier=working").await;
    let contents: Vec<&str> =
        listed["memories"].as_array().unwrap().iter().map(|m| m["content"].as_str().unwrap()).collect();
    // Newest first in listings; the two oldest were pushed out.
    assert_eq!(contents, ["turn 4", "turn 3", "turn 2"]);
    let (status, _) = app.get_json(&format!("/v1/memories/{}", ids[0])).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Another session of the same agent is separate.
    app.write_one(json!({"agent_id": "w", "session_id": "other", "tier": "working", "content": "elsewhere"})).await;
    let (_, listed) = app.get_json("/v1/memories?agent_id=w&session_id=s&tier=working").await;
    assert_eq!(listed["memories"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn with_redis_down_working_memory_is_503_and_the_rest_keeps_serving() {
    // Nothing listens on port 1.
    let app = spawn_app_with(|c| {
        c.redis.url = "redis://127.0.0.1:1".into();
        c.redis.timeout_ms = 200;
    })
    .await;
    if app.postgres_only("Redis").is_none() {
        return;
    }
    let r =
        app.post("/v1/memories", &json!({"agent_id": "r", "session_id": "s", "tier": "working", "content": "x"})).await;
    let retry_after = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
    expect_error(r, StatusCode::SERVICE_UNAVAILABLE, "service_unavailable").await;
    assert_eq!(retry_after.as_deref(), Some("5"));

    let m = app.write_one(json!({"agent_id": "r", "tier": "episodic", "content": "persistent still works"})).await;
    let (_, listed) = app.get_json("/v1/memories?agent_id=r").await;
    assert_eq!(listed["memories"][0]["id"], m["id"]);
    // A persistent memory is still readable by id; an unknown id cannot be
    // ruled out of working memory, so it is 503 rather than a false 404.
    let skill = app.write_one(json!({"agent_id": "r", "skill_name": "k", "content": "a skill"})).await;
    let (status, got) = app.get_json(&format!("/v1/memories/{}", skill["id"].as_str().unwrap())).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(got["content"], "a skill");
    let r = app.get(&format!("/v1/memories/{}", uuid::Uuid::new_v4())).await;
    expect_error(r, StatusCode::SERVICE_UNAVAILABLE, "service_unavailable").await;

    let (status, ready) = app.get_json("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(ready["checks"]["database"], "ok");
    assert_ne!(ready["checks"]["working_memory"], "ok");
}
