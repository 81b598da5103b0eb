//! A server without API keys, as a web page would try to use it through a
//! visitor's browser: a cross-site `text/plain` post, a rebound DNS name in
//! `Host`, a foreign `Origin`; and a keyless server asked to listen on the
//! network.

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::helpers::{TestApp, expect_error, spawn_app, spawn_app_with, test_config};

fn memory(agent: &str) -> Value {
    json!({"memories": [{"agent_id": agent, "tier": "episodic", "content": "the door code is 4321"}]})
}

async fn listed(app: &TestApp, agent: &str) -> usize {
    let (status, page) = app.get_json(&format!("/v1/memories?agent_id={agent}")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    page["memories"].as_array().map_or(0, Vec::len)
}

#[tokio::test]
async fn a_body_not_sent_as_json_gets_415_and_nothing_is_written() {
    let app = spawn_app().await;
    let id = app.write_one(memory("someone-else")).await["id"].as_str().unwrap().to_string();
    let body = memory("victim").to_string();
    let requests = [
        ("POST", "/v1/memories".to_string(), Some("text/plain")),
        ("POST", "/v1/memories".to_string(), Some("application/x-www-form-urlencoded")),
        ("POST", "/v1/memories".to_string(), None),
        ("POST", "/v1/memories/search".to_string(), Some("text/plain")),
        ("POST", "/v1/context".to_string(), Some("text/plain")),
        ("PATCH", format!("/v1/memories/{id}"), Some("text/plain;charset=UTF-8")),
    ];
    for (method, path, content_type) in requests {
        let mut rb = app.client.request(method.parse().unwrap(), format!("{}{path}", app.base)).body(body.clone());
        if let Some(ct) = content_type {
            rb = rb.header("content-type", ct);
        }
        let err =
            expect_error(rb.send().await.unwrap(), StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type").await;
        assert!(err["error"]["message"].as_str().unwrap().contains("application/json"), "{err}");
    }
    assert_eq!(listed(&app, "victim").await, 0, "a text/plain post wrote a memory");
    // JSON with a charset parameter is JSON.
    let r = app
        .client
        .post(format!("{}/v1/memories", app.base))
        .header("content-type", "application/json; charset=utf-8")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn a_foreign_host_is_refused_without_keys_and_answered_with_them() {
    let app = spawn_app_with(|c| c.auth.allowed_hosts = vec!["engram.internal".into()]).await;
    app.write(memory("agent")).await;
    let with_host =
        |host: &str| app.client.get(format!("{}/v1/memories?agent_id=agent", app.base)).header("host", host).send();
    for host in ["evil.example", "evil.example:8080", "localhost.evil.example", "127.0.0.1.nip.io"] {
        let err = expect_error(with_host(host).await.unwrap(), StatusCode::FORBIDDEN, "host_not_allowed").await;
        assert!(err["error"]["message"].as_str().unwrap().contains("auth.allowed_hosts"), "{err}");
    }
    let evil_write = app
        .client
        .post(format!("{}/v1/memories", app.base))
        .header("host", "evil.example")
        .json(&memory("rebound"))
        .send()
        .await
        .unwrap();
    expect_error(evil_write, StatusCode::FORBIDDEN, "host_not_allowed").await;
    assert_eq!(listed(&app, "rebound").await, 0);
    for host in ["localhost:8080", "LOCALHOST", "127.0.0.1:1", "[::1]:8080", "engram.internal", "Engram.Internal:80"] {
        assert_eq!(with_host(host).await.unwrap().status(), StatusCode::OK, "{host}");
    }
    // Probes answer whatever the host: orchestrators address them by IP.
    let probe = app.client.get(format!("{}/healthz", app.base)).header("host", "10.1.2.3:8080").send().await.unwrap();
    assert_eq!(probe.status(), StatusCode::OK);

    // With keys nothing is checked: a page cannot read a visitor's key, and
    // a proxy may use any name.
    let tenant = format!("k-{}", uuid::Uuid::new_v4().simple());
    let keyed = spawn_app_with(|c| {
        c.auth.keys = vec![engram::config::ApiKeyConfig::from_plain(&tenant, "key-k", Default::default())]
    })
    .await;
    let r = keyed
        .client
        .get(format!("{}/v1/memories?agent_id=a", keyed.base))
        .bearer_auth("key-k")
        .header("host", "engram.behind-a-proxy.example")
        .header("origin", "https://app.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_request_from_a_foreign_origin_is_refused_without_keys() {
    let app = spawn_app().await;
    let post_from = |origin: &str| {
        app.client.post(format!("{}/v1/memories", app.base)).header("origin", origin).json(&memory("victim")).send()
    };
    for origin in ["http://evil.example", "https://evil.example:443", "null"] {
        let r = post_from(origin).await.unwrap();
        expect_error(r, StatusCode::FORBIDDEN, "origin_not_allowed").await;
    }
    let read = app
        .client
        .get(format!("{}/v1/memories?agent_id=victim", app.base))
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    expect_error(read, StatusCode::FORBIDDEN, "origin_not_allowed").await;
    assert_eq!(listed(&app, "victim").await, 0);
    // A page served from localhost (the /docs page) may.
    assert_eq!(post_from("http://localhost:8080").await.unwrap().status(), StatusCode::CREATED);
}

/// Builds an app from `config` and runs it on `addr`; returns the run's
/// outcome if it ended within a second (None: still serving) and the port.
async fn run_on(addr: &str, config: engram::config::Config) -> (Option<anyhow::Result<()>>, u16, CancellationToken) {
    let app = engram::app::build(config).await.expect("app builds");
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let shutdown = CancellationToken::new();
    let mut run = tokio::spawn(engram::app::run(listener, app, shutdown.clone()));
    let ended = tokio::time::timeout(std::time::Duration::from_secs(1), &mut run).await.ok().map(|j| j.unwrap());
    (ended, port, shutdown)
}

#[tokio::test]
async fn a_keyless_server_refuses_a_network_address_unless_told() {
    let (ended, _, _) = run_on("0.0.0.0:0", test_config()).await;
    let err = ended.expect("refused at once").expect_err("a keyless server started on 0.0.0.0");
    let msg = err.to_string();
    assert!(msg.contains("auth.allow_keyless_on_network") && msg.contains("ENGRAM_API_KEYS"), "{msg}");

    let mut told = test_config();
    told.auth.allow_keyless_on_network = true;
    let (ended, port, shutdown) = run_on("0.0.0.0:0", told).await;
    assert!(ended.is_none(), "did not start with the flag: {ended:?}");
    let health = reqwest::get(format!("http://127.0.0.1:{port}/healthz")).await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    shutdown.cancel();

    // Loopback needs no flag.
    let (ended, _, shutdown) = run_on("127.0.0.1:0", test_config()).await;
    assert!(ended.is_none(), "did not start on loopback: {ended:?}");
    shutdown.cancel();
}
