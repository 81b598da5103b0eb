//! Retention: configured lifetimes, the sweep that deletes what expired or
//! decayed from every store, and the dry run that shows it coming. Stores are
//! checked directly (SQL, Redis keys, in-process index sizes), not only
//! through the API; the sweep is run with `run_once` on the test clock.

use chrono::{DateTime, Duration, Utc};
use engram::domain::Period;
use reqwest::StatusCode;
use serde_json::{Value, json};

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
