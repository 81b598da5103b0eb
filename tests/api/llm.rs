//! Consolidation with a real chat model (SmolLM2-135M on llama-server,
//! started by `scripts/llm-server.sh`; `scripts/test-llm.sh` runs these on
//! both backends). A weak model is enough for the wiring: the tests assert
//! structure, provenance and the write rules, never the prose. Faults come
//! from a small proxy in front of the real server: a 500, an answer that is
//! not JSON, an answer too slow for the timeout; none may leave anything
//! half-written, and the episodes are taken again once the model answers.
//! Without `ENGRAM_TEST_LLM_URL` each test says it is skipped and returns.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode as AxumStatus;
use axum::response::{IntoResponse, Response};
use chrono::Duration as Age;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::erasure::spawn_isolated;
use crate::helpers::TestApp;

const PASS: u8 = 0;
const FAIL_500: u8 = 1;
const NOT_JSON: u8 = 2;
const SLOW: u8 = 3;
/// NOT_JSON for a request whose text holds MARK, PASS for the others.
const NOT_JSON_IF_MARKED: u8 = 4;
const MARK: &str = "Zebulon";

/// The model server's base URL and model name, or None (skipped).
fn model_server(test: &str) -> Option<(String, String)> {
    match (std::env::var("ENGRAM_TEST_LLM_URL"), std::env::var("ENGRAM_TEST_LLM_MODEL")) {
        (Ok(url), Ok(model)) => Some((url, model)),
        _ => {
            eprintln!("skipped {test}: no chat model (ENGRAM_TEST_LLM_URL; scripts/test-llm.sh starts one)");
            None
        }
    }
}

struct Proxy {
    upstream: String,
    client: reqwest::Client,
    mode: AtomicU8,
}

async fn forward(State(proxy): State<Arc<Proxy>>, body: Bytes) -> Response {
    let mut mode = proxy.mode.load(Ordering::SeqCst);
    if mode == NOT_JSON_IF_MARKED {
        let marked = String::from_utf8_lossy(&body).contains(MARK);
        mode = if marked { NOT_JSON } else { PASS };
    }
    match mode {
        FAIL_500 => return (AxumStatus::INTERNAL_SERVER_ERROR, "injected failure").into_response(),
        NOT_JSON => {
            let completion = json!({"choices": [{"message": {"role": "assistant", "content": "{\"summary\": "}}],
                                    "usage": {"prompt_tokens": 10, "completion_tokens": 3}});
            return axum::Json(completion).into_response();
        }
        SLOW => tokio::time::sleep(Duration::from_secs(5)).await,
        _ => {}
    }
    let r = proxy
        .client
        .post(format!("{}/chat/completions", proxy.upstream))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await;
    match r {
        Ok(r) => {
            let status = AxumStatus::from_u16(r.status().as_u16()).unwrap_or(AxumStatus::BAD_GATEWAY);
            (status, r.bytes().await.unwrap_or_default()).into_response()
        }
        Err(e) => (AxumStatus::BAD_GATEWAY, e.to_string()).into_response(),
    }
}

/// A proxy on a free loopback port; returns its base URL (up to /v1).
async fn proxy(upstream: &str) -> (String, Arc<Proxy>) {
    let proxy = Arc::new(Proxy {
        upstream: upstream.trim_end_matches('/').to_string(),
        client: reqwest::Client::new(),
        mode: AtomicU8::new(PASS),
    });
    let app = axum::Router::new().route("/v1/chat/completions", axum::routing::post(forward)).with_state(proxy.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, proxy)
}

async fn with_model(url: &str, model: &str, tweak: impl FnOnce(&mut engram::config::Config)) -> TestApp {
    let (url, model) = (url.to_string(), model.to_string());
    spawn_isolated(move |c| {
        c.llm.provider = "openai".into();
        c.llm.base_url = url;
        c.llm.model = model;
        // A small model may run on or break off; retries sample afresh.
        c.llm.max_retries = 4;
        c.llm.timeout_ms = 120_000;
        tweak(c);
    })
    .await
}

/// Asks for a run of `agent` and returns the job once it ends.
async fn run(app: &TestApp, agent: &str) -> Value {
    let r = app.post("/v1/consolidation", &json!({"agent_id": agent})).await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let location = r.headers()["location"].to_str().unwrap().to_string();
    for _ in 0..6000 {
        let (_, job) = app.get_json(&location).await;
        if job["state"] == "completed" || job["state"] == "failed" {
            return job;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the job never ended");
}

async fn derived(app: &TestApp, agent: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for tier in ["episodic", "semantic"] {
        let (_, page) =
            app.get_json(&format!("/v1/memories?agent_id={agent}&tier={tier}&include_superseded=true&limit=200")).await;
        out.extend(
            page["memories"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["metadata"].get("consolidation").is_some())
                .cloned(),
        );
    }
    out
}

async fn write_episodes(app: &TestApp) -> Vec<Value> {
    let episode = |user: &str, content: &str| json!({"agent_id": "a", "user_id": user, "session_id": "s1", "tier": "episodic", "content": content});
    let written = app
        .write(json!({"memories": [
            episode("ann", "My name is Ann and I work as a nurse at the city hospital."),
            episode("ann", "I'm allergic to peanuts, please remember that."),
            episode("ann", "We decided to move the team dinner to Friday."),
            episode("bob", "I live in Lisbon with my dog Rex."),
        ]}))
        .await;
    app.clock.advance(Age::hours(2));
    written
}

#[tokio::test]
async fn a_real_model_summarises_and_extracts_with_provenance() {
    let Some((url, model)) = model_server("a_real_model_summarises_and_extracts_with_provenance") else {
        return;
    };
    let app = with_model(&url, &model, |_| {}).await;
    let episodes = write_episodes(&app).await;
    let job = run(&app, "a").await;
    assert_eq!(job["state"], "completed", "{job}");
    assert_eq!(job["report"]["episodes"], 4, "{job}");
    assert_eq!(job["report"]["summaries"], 1, "Ann's session; Bob's has one episode: {job}");
    let ids: Vec<&Value> = episodes.iter().map(|m| &m["id"]).collect();
    let made = derived(&app, "a").await;
    let summary = made.iter().find(|m| m["tier"] == "episodic").expect("a summary");
    let c = &summary["metadata"]["consolidation"];
    assert_eq!((c["method"].as_str(), c["model"].as_str()), (Some("llm"), Some(model.as_str())), "{summary}");
    assert_eq!(c["source_episode_ids"].as_array().unwrap().iter().collect::<Vec<_>>(), ids[..3].to_vec());
    assert_eq!(summary["user_id"], "ann");
    assert!(!summary["content"].as_str().unwrap().trim().is_empty());
    for fact in made.iter().filter(|m| m["tier"] == "semantic") {
        assert_eq!(fact["source"], "consolidated", "{fact}");
        assert!(ids.contains(&&fact["source_episode_id"]), "{fact}");
        let from = episodes.iter().find(|e| e["id"] == fact["source_episode_id"]).unwrap();
        assert_eq!(fact["user_id"], from["user_id"], "a fact is its episode's user's: {fact}");
        assert_eq!(fact["subject"], from["user_id"], "{fact}");
    }
    // Once: a second run finds nothing to do.
    let again = run(&app, "a").await;
    assert_eq!(again["report"]["episodes"], 0, "{again}");
}

#[tokio::test]
async fn model_faults_leave_nothing_half_written_and_the_episodes_are_taken_later() {
    let Some((url, model)) = model_server("model_faults_leave_nothing_half_written") else {
        return;
    };
    let (proxied, proxy) = proxy(&url).await;
    let app = with_model(&proxied, &model, |_| {}).await;
    write_episodes(&app).await;
    for (mode, expected) in [(FAIL_500, "unavailable"), (NOT_JSON, "unusable")] {
        proxy.mode.store(mode, Ordering::SeqCst);
        let job = run(&app, "a").await;
        assert_eq!(job["state"], "failed", "{job}");
        assert!(job["error"].as_str().unwrap().contains(expected), "{job}");
        assert!(derived(&app, "a").await.is_empty(), "nothing half-written after {expected}");
    }
    proxy.mode.store(PASS, Ordering::SeqCst);
    let job = run(&app, "a").await;
    assert_eq!(job["state"], "completed", "{job}");
    assert_eq!(job["report"]["episodes"], 4, "every episode, once: {job}");
}

#[tokio::test]
async fn a_group_the_model_cannot_answer_waits_without_holding_up_the_others() {
    let Some((url, model)) = model_server("a_group_the_model_cannot_answer_waits") else {
        return;
    };
    let (proxied, proxy) = proxy(&url).await;
    let app = with_model(&proxied, &model, |_| {}).await;
    // Carl's group comes first (written first); every answer about it is
    // unusable, as when a small model runs on for some turns.
    let episode = |user: &str, session: &str, content: &str| json!({"agent_id": "a", "user_id": user, "session_id": session, "tier": "episodic", "content": content});
    let carl = app
        .write(json!({"memories": [
            episode("carl", "s0", &format!("My name is {MARK} Carl and I keep bees.")),
            episode("carl", "s0", "The hives are behind the barn."),
        ]}))
        .await;
    write_episodes(&app).await;
    proxy.mode.store(NOT_JSON_IF_MARKED, Ordering::SeqCst);
    let job = run(&app, "a").await;
    assert_eq!(job["state"], "failed", "a group was left: {job}");
    assert!(job["error"].as_str().unwrap().contains("unusable"), "{job}");
    assert_eq!(job["report"]["groups_failed"], 1, "{job}");
    assert_eq!(job["report"]["episodes"], 4, "Ann's and Bob's groups went on: {job}");
    let made = derived(&app, "a").await;
    assert!(made.iter().any(|m| m["user_id"] == "ann"), "Ann's group written: {made:?}");
    assert!(made.iter().all(|m| m["user_id"] != "carl"), "nothing of Carl's group: {made:?}");
    // A later run takes exactly the group that was left.
    proxy.mode.store(PASS, Ordering::SeqCst);
    let again = run(&app, "a").await;
    assert_eq!(again["state"], "completed", "{again}");
    assert_eq!(again["report"]["episodes"], 2, "{again}");
    let made = derived(&app, "a").await;
    let summary = made.iter().find(|m| m["user_id"] == "carl" && m["tier"] == "episodic").expect("Carl's summary");
    let sources = summary["metadata"]["consolidation"]["source_episode_ids"].as_array().unwrap();
    let ids: Vec<&Value> = carl.iter().map(|m| &m["id"]).collect();
    assert_eq!(sources.iter().collect::<Vec<_>>(), ids, "{summary}");
}

#[tokio::test]
async fn a_model_slower_than_the_timeout_leaves_nothing_half_written() {
    let Some((url, model)) = model_server("a_model_slower_than_the_timeout") else {
        return;
    };
    let (proxied, proxy) = proxy(&url).await;
    proxy.mode.store(SLOW, Ordering::SeqCst);
    let app = with_model(&proxied, &model, |c| {
        c.llm.timeout_ms = 1_000;
        c.llm.max_retries = 0;
    })
    .await;
    write_episodes(&app).await;
    let job = run(&app, "a").await;
    assert_eq!(job["state"], "failed", "{job}");
    assert!(job["error"].as_str().unwrap().contains("unavailable"), "{job}");
    assert!(derived(&app, "a").await.is_empty(), "nothing half-written after a timeout");
}

#[tokio::test]
async fn the_daily_token_budget_stops_calls_when_spent() {
    let Some((url, model)) = model_server("the_daily_token_budget_stops_calls_when_spent") else {
        return;
    };
    let app = with_model(&url, &model, |c| c.llm.daily_token_budget = 1).await;
    write_episodes(&app).await;
    // The first call may cross the budget; the next is refused, and the
    // group whose facts it was to read is not written.
    let job = run(&app, "a").await;
    assert_eq!(job["state"], "failed", "{job}");
    assert!(job["error"].as_str().unwrap().contains("budget"), "{job}");
    assert!(derived(&app, "a").await.iter().all(|m| m["user_id"] != "ann"), "Ann's group is not half-written");
    let (_, metrics) = {
        let r = app.get("/metrics").await;
        (r.status(), r.text().await.unwrap())
    };
    assert!(metrics.contains("engram_llm_calls_total") && metrics.contains("outcome=\"budget_spent\""), "{metrics}");
    assert!(metrics.contains("engram_llm_tokens_total"), "{metrics}");
}
