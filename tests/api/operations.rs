//! Health, readiness, metrics, the docs page and the committed OpenAPI file.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::spawn_app;

#[tokio::test]
async fn health_and_readiness_report_the_backends() {
    let app = spawn_app().await;
    assert_eq!(app.get_json("/healthz").await, (StatusCode::OK, json!({"status": "ok"})));
    let (status, ready) = app.get_json("/readyz").await;
    assert_eq!(status, StatusCode::OK, "{ready}");
    assert_eq!(ready["checks"], json!({"database": "ok", "working_memory": "ok"}));
}

#[tokio::test]
async fn metrics_expose_route_latencies_and_the_pool() {
    let app = spawn_app().await;
    app.write_one(json!({"agent_id": "m", "tier": "episodic", "content": "measured"})).await;
    let text = app.get("/metrics").await.text().await.unwrap();
    assert!(text.contains("engram_http_request_duration_seconds_bucket"), "{text}");
    assert!(text.contains(r#"route="/v1/memories""#), "{text}");
    assert!(text.contains("engram_store_operation_duration_seconds"), "{text}");
    assert!(text.contains("engram_db_pool_connections"), "{text}");
}

#[tokio::test]
async fn the_docs_page_is_served_from_the_binary() {
    let app = spawn_app().await;
    let page = app.get("/docs").await.text().await.unwrap();
    assert!(page.contains("/docs/swagger-ui-bundle.js") && page.contains("/openapi.json"));
    assert!(!page.contains("http://") && !page.contains("https://"), "no external assets");
    let js = app.get("/docs/swagger-ui-bundle.js").await;
    assert_eq!(js.status(), StatusCode::OK);
    assert!(js.text().await.unwrap().len() > 100_000);
    let (status, spec) = app.get_json("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert!(spec["paths"]["/v1/memories"]["post"].is_object());
}

/// The committed `openapi/openapi.json` is what the code generates.
/// Regenerate with `ENGRAM_UPDATE_OPENAPI=1 cargo test openapi` (or `engram openapi > openapi/openapi.json`).
#[test]
fn committed_openapi_matches_the_code() {
    let generated = engram::http::openapi_json();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json");
    if std::env::var_os("ENGRAM_UPDATE_OPENAPI").is_some() {
        std::fs::write(path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    let parse = |s: &str| serde_json::from_str::<Value>(s).ok();
    assert!(
        parse(&committed).is_some() && parse(&committed) == parse(&generated),
        "openapi/openapi.json is stale: run ENGRAM_UPDATE_OPENAPI=1 cargo test openapi"
    );
}
