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

/// The document states every status a route can answer and the limits the
/// server enforces (schemathesis, in scripts/test.sh, checks the rest).
#[test]
fn the_openapi_document_states_statuses_and_limits() {
    let spec: serde_json::Value = serde_json::from_str(&engram::http::openapi_json()).unwrap();
    for (path, ops) in spec["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            let has = |status: &str| op["responses"].get(status).is_some();
            if op.get("security").is_some() {
                for status in ["401", "403"] {
                    assert!(has(status), "{method} {path} documents no {status}");
                }
                assert_eq!(op["responses"]["401"]["headers"]["WWW-Authenticate"]["schema"]["type"], "string");
                // The scope a key needs is the role of the bearer requirement,
                // and the 403 names it.
                let roles = op["security"][0]["bearer"].as_array().unwrap();
                assert!(roles.len() == 1, "{method} {path}: one scope, not {roles:?}");
                let scope = roles[0].as_str().unwrap();
                assert!(["read", "read_write", "admin"].contains(&scope), "{method} {path}: {scope}");
                let forbidden = op["responses"]["403"]["description"].as_str().unwrap();
                assert!(
                    forbidden.contains(&format!("insufficient_scope; needs `{scope}`")),
                    "{method} {path}: {forbidden}"
                );
                if path.starts_with("/v1/") {
                    for status in ["429", "503"] {
                        assert!(has(status), "{method} {path} documents no {status}");
                    }
                    assert!(op["responses"]["503"]["headers"].get("Retry-After").is_some(), "{method} {path}");
                }
            } else {
                assert!(!path.starts_with("/v1/"), "{method} {path} states no security");
            }
            if op.get("requestBody").is_some() {
                for status in ["400", "413", "422"] {
                    assert!(has(status), "{method} {path} documents no {status}");
                }
            }
            if path.contains("{id}") {
                assert!(has("404") && has("422"), "{method} {path}");
            }
        }
    }
    let schemas = &spec["components"]["schemas"];
    let create = &schemas["CreateMemoryRequest"]["properties"];
    assert_eq!(create["agent_id"]["maxLength"], 64);
    assert_eq!(create["content"]["maxLength"], engram::domain::validate::MAX_CONTENT_BYTES);
    assert_eq!(create["importance"]["maximum"], 1.0);
    assert_eq!(create["reward"]["minimum"], -1.0);
    assert_eq!(create["skill_name"]["maxLength"], engram::domain::validate::MAX_SKILL_NAME_CHARS);
    assert_eq!(create["subject"]["maxLength"], engram::domain::validate::MAX_SUBJECT_CHARS);
    assert_eq!(create["predicate"]["maxLength"], engram::domain::validate::MAX_PREDICATE_CHARS);
    assert_eq!(create["object"]["maxLength"], engram::domain::validate::MAX_PHRASE_CHARS);
    assert_eq!(schemas["BatchRequest"]["properties"]["memories"]["maxItems"], engram::domain::validate::MAX_BATCH);
    assert_eq!(schemas["SearchRequest"]["properties"]["top_k"]["maximum"], engram::http::recall::MAX_TOP_K);
    assert_eq!(schemas["Weights"]["properties"]["recency"]["maximum"], 10.0);
    let limit = spec["paths"]["/v1/memories"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "limit")
        .unwrap();
    assert_eq!(limit["schema"]["maximum"], engram::http::memories::MAX_LIMIT);
}
