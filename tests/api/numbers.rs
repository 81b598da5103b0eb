//! Numbers as written: importance, confidence and rewards read back as the
//! decimals the client sent, on every route that returns a memory.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, spawn_app};

/// The fields a test wrote, and the exact numbers it expects back.
fn expected(content: &str) -> Value {
    match content {
        "Kiwi note: the user watered the lemon tree" => json!({"importance": 0.4}),
        "Kiwi fact: the lemon tree stands on the balcony" => json!({"importance": 0.7, "confidence": 0.9}),
        "Kiwi skill: water the lemon tree weekly" => {
            json!({"importance": 0.6, "avg_reward": 0.3, "success_rate": 1.0})
        }
        "Kiwi scratch: lemon tree looks thirsty" => json!({"importance": 0.2}),
        other => panic!("unexpected memory {other}"),
    }
}

/// Every expected number of `m` is exactly the one written (JSON numbers
/// compare as f64: 0.4000000059604645 is not 0.4).
fn assert_exact(m: &Value, route: &str) {
    let content = m["content"].as_str().unwrap();
    for (field, value) in expected(content).as_object().unwrap() {
        assert_eq!(&m[field], value, "{route}: {field} of {content:?} in {m}");
    }
}

async fn post_with_key(app: &TestApp, key: &str, body: &str) -> (StatusCode, Option<String>, String) {
    let r = app
        .client
        .post(format!("{}/v1/memories", app.base))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let replayed = r.headers().get("idempotent-replayed").map(|v| v.to_str().unwrap().to_string());
    (r.status(), replayed, r.text().await.unwrap())
}

#[tokio::test]
async fn written_numbers_read_back_exactly_on_every_route() {
    let app = spawn_app().await;
    let body = json!({"memories": [
        {"agent_id": "n", "tier": "episodic", "content": "Kiwi note: the user watered the lemon tree", "importance": 0.4},
        {"agent_id": "n", "tier": "semantic", "content": "Kiwi fact: the lemon tree stands on the balcony",
         "importance": 0.7, "confidence": 0.9, "subject": "lemon tree", "predicate": "stands on"},
        {"agent_id": "n", "content": "Kiwi skill: water the lemon tree weekly", "skill_name": "water_lemon",
         "importance": 0.6, "reward": 0.3, "outcome": "success"},
        {"agent_id": "n", "session_id": "s1", "tier": "working", "content": "Kiwi scratch: lemon tree looks thirsty",
         "importance": 0.2}
    ]})
    .to_string();

    // The write response, as text: no float noise anywhere in it.
    let (status, replayed, first) = post_with_key(&app, "exact-1", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert_eq!(replayed, None);
    assert!(first.contains(r#""importance":0.4,"#), "{first}");
    assert!(first.contains(r#""confidence":0.9,"#), "{first}");
    assert!(first.contains(r#""avg_reward":0.3,"#), "{first}");
    let written: Value = serde_json::from_str(&first).unwrap();
    let written = written["memories"].as_array().unwrap().clone();
    assert_eq!(written.len(), 4);
    for m in &written {
        assert_exact(m, "write");
    }

    // The idempotent replay is the same JSON, byte for byte.
    let (status, replayed, second) = post_with_key(&app, "exact-1", &body).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(replayed.as_deref(), Some("true"));
    assert_eq!(second, first);

    for m in &written {
        let (status, got) = app.get_json(&format!("/v1/memories/{}", m["id"].as_str().unwrap())).await;
        assert_eq!(status, StatusCode::OK, "{got}");
        assert_exact(&got, "get");
    }

    // The persistent tiers, then the session's working memory.
    for (query, count) in [("agent_id=n", 3), ("agent_id=n&session_id=s1&tier=working", 1)] {
        let (status, listed) = app.get_json(&format!("/v1/memories?{query}")).await;
        assert_eq!(status, StatusCode::OK, "{listed}");
        let listed = listed["memories"].as_array().unwrap();
        assert_eq!(listed.len(), count, "{query}: {listed:?}");
        listed.iter().for_each(|m| assert_exact(m, "list"));
    }

    let fact_id = written[1]["id"].as_str().unwrap();
    let (_, history) = app.get_json(&format!("/v1/memories/{fact_id}/history")).await;
    history["memories"].as_array().unwrap().iter().for_each(|m| assert_exact(m, "history"));

    let r = app
        .post("/v1/memories/search", &json!({"agent_id": "n", "session_id": "s1", "query": "kiwi lemon tree"}))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let found: Value = r.json().await.unwrap();
    let results = found["results"].as_array().unwrap();
    assert_eq!(results.len(), 4, "{found}");
    for r in results {
        assert_exact(&r["memory"], "search");
        // The importance component is the stored importance, not a widened 4-byte float.
        assert_eq!(r["components"]["importance"], r["memory"]["importance"], "{r}");
    }
}

#[tokio::test]
async fn a_skills_running_mean_and_rate_are_exact_doubles() {
    let app = spawn_app().await;
    let skill = |reward: f64, outcome: &str| {
        json!({"agent_id": "m", "skill_name": "prune", "content": "Prune the lemon tree in spring",
               "reward": reward, "outcome": outcome})
    };
    app.write_one(skill(0.3, "success")).await;
    let second = app.write_one(skill(0.1, "failure")).await;
    // (0.3 · 1 + 0.1) / 2 and 1 / 2 in double precision, as both backends compute them.
    assert_eq!(second["avg_reward"], json!((0.3 + 0.1) / 2.0));
    assert_eq!(second["avg_reward"], json!(0.2));
    assert_eq!(second["success_rate"], json!(0.5));
    let (_, got) = app.get_json(&format!("/v1/memories/{}", second["id"].as_str().unwrap())).await;
    assert_eq!(got["avg_reward"], json!(0.2));
}
