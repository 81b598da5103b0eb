//! The two backends side by side: the same writes at the same (manual) time
//! into a Postgres + Redis server and an embedded one, then the same reads.
//! They must return the same memories in the same order, with score
//! components equal within 1e-6. The fixtures are chosen so that full text
//! cannot tell the backends apart (each query's words occur in one memory
//! only, so the normalised text score is 1 for it and 0 for the rest on both
//! `ts_rank` and bm25): any difference is a difference of the contract.

use chrono::{DateTime, Duration, Utc};
use serde_json::{Value, json};

use crate::helpers::{TestApp, spawn_app_with};

const FIXTURES: &[(&str, &str)] = &[
    ("episodic", "Booked a window seat on the morning train to Porto"),
    ("episodic", "The dentist moved the appointment to Thursday afternoon"),
    ("episodic", "Paid the electricity invoice for October"),
    ("semantic", "The user is allergic to peanuts"),
    ("semantic", "The user's sister lives in Montreal"),
    ("procedural", "To reset the router, hold the button for ten seconds"),
    ("working", "User is choosing between two laptops"),
];

/// The same writes, in the same order, at the same instants.
async fn seed(app: &TestApp, start: DateTime<Utc>) {
    for (i, (tier, content)) in FIXTURES.iter().enumerate() {
        app.clock.set(start + Duration::minutes(i as i64));
        let mut body = json!({"agent_id": "c", "user_id": "u", "tier": tier, "content": content,
                              "occurred_at": (start - Duration::days(i as i64)).to_rfc3339()});
        match *tier {
            "working" => body["session_id"] = json!("s1"),
            "procedural" => body["skill_name"] = json!(format!("skill-{i}")),
            _ => {}
        }
        app.write_one(body).await;
    }
    // A fact superseded, a duplicate, and a skill's outcome: the rules, not just the rows.
    app.write_one(json!({"agent_id": "c", "tier": "semantic", "content": "The user's sister lives in Toronto",
                         "subject": "user's sister", "predicate": "lives in"}))
        .await;
    app.write_one(json!({"agent_id": "c", "tier": "semantic", "content": "The user's sister lives in Ottawa",
                         "subject": "user's sister", "predicate": "lives in"}))
        .await;
    app.write_one(json!({"agent_id": "c", "tier": "semantic", "content": "The user is allergic to peanuts"})).await;
    app.write_one(json!({"agent_id": "c", "skill_name": "skill-5", "content": "To reset the router, hold the button for ten seconds",
                         "outcome": "failure"}))
        .await;
    app.clock.set(start + Duration::hours(1));
}

/// (content, score, components) of a search, best first.
async fn search(app: &TestApp, query: &str) -> Vec<(String, Value, Value)> {
    let r = app.post("/v1/memories/search", &json!({"agent_id": "c", "session_id": "s1", "query": query})).await;
    assert_eq!(r.status(), reqwest::StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["memory"]["content"].as_str().unwrap().to_string(), r["score"].clone(), r["components"].clone()))
        .collect()
}

fn close(a: &Value, b: &Value) -> bool {
    (a.as_f64().unwrap() - b.as_f64().unwrap()).abs() < 1e-6
}

#[tokio::test]
async fn both_backends_return_the_same_memories_in_the_same_order() {
    let pg_url = std::env::var("ENGRAM_TEST_DATABASE_URL")
        .expect("ENGRAM_TEST_DATABASE_URL is not set: run the tests with scripts/test.sh");
    let postgres = spawn_app_with(|c| c.database.url = pg_url).await;
    let embedded = spawn_app_with(|c| c.database.url = String::new()).await;
    assert_eq!((postgres.storage.name, embedded.storage.name), ("postgres", "embedded"));
    let start = DateTime::parse_from_rfc3339("2026-06-01T09:00:00Z").unwrap().with_timezone(&Utc);
    for app in [&postgres, &embedded] {
        seed(app, start).await;
    }

    for query in ["train to Porto", "peanuts allergy", "dentist appointment", "router reset", "laptops", "sister"] {
        let (a, b) = (search(&postgres, query).await, search(&embedded, query).await);
        let names = |r: &[(String, Value, Value)]| r.iter().map(|(c, _, _)| c.clone()).collect::<Vec<_>>();
        assert_eq!(names(&a), names(&b), "query {query:?}");
        for ((content, score_a, comp_a), (_, score_b, comp_b)) in a.iter().zip(&b) {
            for k in ["relevance", "recency", "importance", "frequency", "tier_bonus"] {
                assert!(
                    close(&comp_a[k], &comp_b[k]),
                    "query {query:?}, {content:?}: {k} {} vs {}",
                    comp_a[k],
                    comp_b[k]
                );
            }
            assert!(close(score_a, score_b), "query {query:?}, {content:?}: score {score_a} vs {score_b}");
        }
        // Searches count accesses (frequency) in the background, every 500 ms:
        // let both servers record these before the next query.
        tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    }

    // Listing, newest first, and a fact's history.
    assert_eq!(list(&postgres).await, list(&embedded).await);
    let chain = history(&postgres).await;
    assert_eq!(chain, history(&embedded).await);
    assert!(chain.len() >= 2 && chain.last().unwrap() == "The user's sister lives in Ottawa", "{chain:?}");
}

/// Contents of the agent's memories, newest first.
async fn list(app: &TestApp) -> Vec<String> {
    let (_, body) = app.get_json("/v1/memories?agent_id=c&limit=50").await;
    body["memories"].as_array().unwrap().iter().map(|m| m["content"].as_str().unwrap().to_string()).collect()
}

/// Contents of the supersede chain that ends in the Ottawa fact, oldest first.
async fn history(app: &TestApp) -> Vec<String> {
    let (_, body) = app.get_json("/v1/memories?agent_id=c&tier=semantic&limit=50").await;
    let ottawa = body["memories"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["content"] == "The user's sister lives in Ottawa")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, chain) = app.get_json(&format!("/v1/memories/{ottawa}/history")).await;
    chain["memories"].as_array().unwrap().iter().map(|m| m["content"].as_str().unwrap().to_string()).collect()
}
