//! Key scopes: a `read` key reads, a `read_write` key (the default) also
//! changes memories, an `admin` key also reaches the operator's routes (the
//! retention preview, `/metrics`, the checks of `/readyz`). Too small a scope
//! is 403 `insufficient_scope`; the probes answer without a key.

use engram::config::{ApiKeyConfig, Scope};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, expect_error, spawn_app_with};

/// A server with one key of each scope, all for one tenant: `reader`,
/// `writer` and `operator`.
async fn spawn_keyed(tweak: impl FnOnce(&mut engram::config::Config)) -> TestApp {
    let tenant = format!("s-{}", uuid::Uuid::new_v4().simple());
    spawn_app_with(|c| {
        c.auth.keys = vec![
            ApiKeyConfig::from_plain(&tenant, "reader", Scope::Read),
            ApiKeyConfig::from_plain(&tenant, "writer", Scope::ReadWrite),
            ApiKeyConfig::from_plain(&tenant, "operator", Scope::Admin),
        ];
        tweak(c);
    })
    .await
}

async fn expect_scope(r: reqwest::Response, needs: &str) {
    let challenge = r.headers().get("www-authenticate").and_then(|v| v.to_str().ok()).map(str::to_string);
    let body = expect_error(r, StatusCode::FORBIDDEN, "insufficient_scope").await;
    assert!(body["error"]["message"].as_str().unwrap().contains(&format!("`{needs}`")), "{body}");
    assert_eq!(challenge, Some(format!(r#"Bearer error="insufficient_scope", scope="{needs}""#)));
}

#[tokio::test]
async fn a_read_key_reads_and_searches_but_cannot_change_memories() {
    let server = spawn_keyed(|_| {}).await;
    let (reader, writer) = (server.as_key("reader"), server.as_key("writer"));
    let m = writer.write_one(json!({"agent_id": "a", "tier": "episodic", "content": "the reader may see this"})).await;
    let path = format!("/v1/memories/{}", m["id"].as_str().unwrap());

    for read in [path.clone(), format!("{path}/history"), "/v1/memories?agent_id=a".to_string()] {
        let (status, body) = reader.get_json(&read).await;
        assert_eq!(status, StatusCode::OK, "{read}: {body}");
    }
    let (status, found) = {
        let r = reader.post("/v1/memories/search", &json!({"agent_id": "a", "query": "reader"})).await;
        (r.status(), r.json::<Value>().await.unwrap())
    };
    assert_eq!(status, StatusCode::OK, "{found}");
    assert_eq!(found["results"][0]["memory"]["id"], m["id"], "{found}");
    let r = reader.post("/v1/context", &json!({"agent_id": "a", "query": "reader", "max_context_tokens": 8000})).await;
    let status = r.status();
    assert_eq!(status, StatusCode::OK, "{}", r.text().await.unwrap());

    let write = json!({"agent_id": "a", "tier": "episodic", "content": "not allowed"});
    expect_scope(reader.post("/v1/memories", &write).await, "read_write").await;
    expect_scope(reader.patch(&path, &json!({"importance": 0.9})).await, "read_write").await;
    expect_scope(reader.delete(&path).await, "read_write").await;
    let (_, still) = writer.get_json(&path).await;
    assert_eq!(
        (still["content"].as_str(), still["importance"].clone()),
        (m["content"].as_str(), m["importance"].clone())
    );

    // The writer may do all of it.
    assert_eq!(writer.patch(&path, &json!({"importance": 0.9})).await.status(), StatusCode::OK);
    assert_eq!(writer.delete(&path).await.status(), StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn operator_routes_need_an_admin_key_and_the_probes_none() {
    let server = spawn_keyed(|_| {}).await;
    let (reader, writer, operator) = (server.as_key("reader"), server.as_key("writer"), server.as_key("operator"));
    for key in [&reader, &writer] {
        expect_scope(key.get("/v1/retention/preview").await, "admin").await;
        expect_scope(key.get("/metrics").await, "admin").await;
    }
    let (status, preview) = operator.get_json("/v1/retention/preview").await;
    assert_eq!(status, StatusCode::OK, "{preview}");
    // The operator's key writes too (admin includes read_write).
    operator.write_one(json!({"agent_id": "a", "tier": "episodic", "content": "by the operator"})).await;
    let metrics = operator.get("/metrics").await;
    assert_eq!(metrics.status(), StatusCode::OK);
    assert!(metrics.text().await.unwrap().contains("engram_http_request_duration_seconds"));
    let anonymous = reqwest::get(format!("{}/metrics", server.base)).await.unwrap();
    expect_error(anonymous, StatusCode::UNAUTHORIZED, "unauthorized").await;

    // Probes send no key: liveness and readiness's status answer anyone, the
    // checks only an admin key.
    let health = reqwest::get(format!("{}/healthz", server.base)).await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    let anonymous = reqwest::get(format!("{}/readyz", server.base)).await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::OK);
    assert_eq!(anonymous.json::<Value>().await.unwrap(), json!({"status": "ready"}));
    for key in [&reader, &writer, &server.as_key("wrong")] {
        assert_eq!(key.get_json("/readyz").await, (StatusCode::OK, json!({"status": "ready"})));
    }
    let (status, ready) = operator.get_json("/readyz").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ready["checks"], json!({"database": "ok", "working_memory": "ok"}), "{ready}");
}

#[tokio::test]
async fn open_metrics_serves_metrics_without_a_key() {
    let server = spawn_keyed(|c| c.auth.open_metrics = true).await;
    let r = reqwest::get(format!("{}/metrics", server.base)).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // The retention preview still needs an admin key.
    expect_scope(server.as_key("writer").get("/v1/retention/preview").await, "admin").await;
}

/// Every operation's documented scope (the role of its `bearer`
/// requirement) is the one the server enforces: one scope less is 403
/// `insufficient_scope`, that scope gets past authorisation.
#[tokio::test]
async fn the_documented_scope_of_every_operation_is_the_enforced_one() {
    let server = spawn_keyed(|_| {}).await;
    let spec: Value = serde_json::from_str(&engram::http::openapi_json()).unwrap();
    let keys = [("read", "reader"), ("read_write", "writer"), ("admin", "operator")];
    let mut checked = 0;
    for (path, ops) in spec["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            let Some(roles) = op["security"][0]["bearer"].as_array() else { continue };
            let needs = roles[0].as_str().unwrap();
            let rank = keys.iter().position(|(s, _)| *s == needs).unwrap();
            let url = format!("{}{}", server.base, path.replace("{id}", &uuid::Uuid::new_v4().to_string()));
            for (i, (_, key)) in keys.iter().enumerate() {
                let request = match method.as_str() {
                    "get" => server.client.get(&url),
                    "delete" => server.client.delete(&url),
                    "post" => server.client.post(&url).json(&json!({})),
                    "patch" => server.client.patch(&url).json(&json!({})),
                    "put" => server.client.put(&url).json(&json!({})),
                    other => panic!("{other} {path}"),
                };
                let r = request.bearer_auth(key).send().await.unwrap();
                if i < rank {
                    expect_scope(r, needs).await;
                } else {
                    let status = r.status();
                    assert!(
                        status != StatusCode::FORBIDDEN && status != StatusCode::UNAUTHORIZED,
                        "{method} {path} as {key}: {status}"
                    );
                }
            }
            checked += 1;
        }
    }
    assert!(checked >= 10, "{checked} operations");
}
