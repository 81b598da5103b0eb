//! Bad input gets the contract's error, names the field, and the server
//! keeps serving.

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{expect_error, spawn_app, spawn_app_with};

#[tokio::test]
async fn bad_inputs_get_the_contract_errors_and_the_server_keeps_serving() {
    let app = spawn_app().await;
    let r = app.post_raw("/v1/memories", r#"{"agent_id": "a", "content": "#).await;
    expect_error(r, StatusCode::BAD_REQUEST, "invalid_json").await;

    let cases = [
        (json!({"agent_id": "a"}), "/content"),
        (json!({"content": "x"}), "/agent_id"),
        (json!({"agent_id": "a", "content": "x", "importance": "high"}), "/importance"),
        (json!({"agent_id": "a", "content": "x", "importance": 1.5}), "/importance"),
        (json!({"agent_id": "a", "content": "x", "tier": "dream"}), "/tier"),
        (json!({"agent_id": "a", "content": "x", "retention": "forever"}), "/retention"),
        (json!({"agent_id": "a", "content": "   "}), "/content"),
        (json!({"agent_id": "", "content": "x"}), "/agent_id"),
        (json!({"agent_id": "a", "content": "x", "tier": "working"}), "/session_id"),
        (json!({"agent_id": "a", "content": "x", "tier": "procedural"}), "/skill_name"),
        (json!({"agent_id": "a", "content": "x", "occurred_at": "last tuesday"}), "/occurred_at"),
        (json!({"agent_id": "a", "content": "x", "metadata": [1, 2]}), "/metadata"),
        (json!({"agent_id": "a", "content": "x", "confidence": -1}), "/confidence"),
        (json!({"agent_id": "a", "content": "x", "colour": "red"}), "/colour"),
        (json!({"memories": []}), "/memories"),
    ];
    for (body, field) in cases {
        let r = app.post("/v1/memories", &body).await;
        let err = expect_error(r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field").await;
        assert_eq!(err["error"]["field"], field, "{body} → {err}");
    }

    // In a batch the pointer names the element; nothing of the batch is written.
    let mut memories: Vec<_> =
        (0..40).map(|i| json!({"agent_id": "batch", "tier": "episodic", "content": format!("item {i}")})).collect();
    memories[37]["importance"] = json!(1.5);
    let r = app.post("/v1/memories", &json!({"memories": memories})).await;
    let err = expect_error(r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field").await;
    assert_eq!(err["error"]["field"], "/memories/37/importance");
    let (_, listed) = app.get_json("/v1/memories?agent_id=batch").await;
    assert_eq!(listed["memories"].as_array().unwrap().len(), 0);

    let too_many: Vec<_> = (0..501).map(|i| json!({"agent_id": "b", "content": format!("m {i}")})).collect();
    let r = app.post("/v1/memories", &json!({"memories": too_many})).await;
    let err = expect_error(r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field").await;
    assert_eq!(err["error"]["field"], "/memories");

    let r = app.get("/v1/memories/not-a-uuid").await;
    let err = expect_error(r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field").await;
    assert_eq!(err["error"]["field"], "id");
    let r = app.get(&format!("/v1/memories/{}", uuid::Uuid::new_v4())).await;
    expect_error(r, StatusCode::NOT_FOUND, "memory_not_found").await;
    let r = app.get("/v1/memories?cursor=bm9wZQ").await;
    expect_error(r, StatusCode::BAD_REQUEST, "invalid_cursor").await;
    let r = app.get("/v1/memories?limit=5000").await;
    let err = expect_error(r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field").await;
    assert_eq!(err["error"]["field"], "limit");
    let r = app.get("/v1/nothing-here").await;
    expect_error(r, StatusCode::NOT_FOUND, "route_not_found").await;
    let r = app.client.put(format!("{}/v1/memories", app.base)).send().await.unwrap();
    expect_error(r, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed").await;

    // Still serving.
    let m = app.write_one(json!({"agent_id": "a", "content": "still here", "tier": "episodic"})).await;
    assert_eq!(m["content"], "still here");
}

#[tokio::test]
async fn a_body_over_the_limit_is_413() {
    let app = spawn_app_with(|c| c.server.body_limit_bytes = 64 * 1024).await;
    let big = "x".repeat(100 * 1024);
    let r = app.post("/v1/memories", &json!({"agent_id": "a", "content": big})).await;
    expect_error(r, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large").await;
    // The default limit is 2 MiB: a 3 MiB body is refused too.
    let app = spawn_app().await;
    let r = app.post_raw("/v1/memories", vec![b' '; 3 * 1024 * 1024]).await;
    expect_error(r, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large").await;
    assert_eq!(app.get("/healthz").await.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_client_request_id_is_echoed_in_header_and_error_body() {
    let app = spawn_app().await;
    let r = app
        .client
        .get(format!("{}/v1/memories/{}", app.base, uuid::Uuid::new_v4()))
        .header("x-request-id", "trace-me-42")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers().get("x-request-id").unwrap(), "trace-me-42");
    let body = expect_error(r, StatusCode::NOT_FOUND, "memory_not_found").await;
    assert_eq!(body["error"]["request_id"], "trace-me-42");
}

#[tokio::test]
async fn a_key_past_its_rate_gets_429_with_retry_after_and_probes_are_not_limited() {
    let app = spawn_app_with(|c| {
        c.limits.requests_per_second = 1;
        c.limits.burst = 3;
    })
    .await;
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(app.get("/v1/memories?agent_id=a").await);
    }
    let limited = statuses.into_iter().find(|r| r.status() == StatusCode::TOO_MANY_REQUESTS).expect("a 429");
    assert!(limited.headers().get("retry-after").is_some());
    expect_error(limited, StatusCode::TOO_MANY_REQUESTS, "rate_limited").await;
    for _ in 0..10 {
        assert_eq!(app.get("/healthz").await.status(), StatusCode::OK);
    }
}
