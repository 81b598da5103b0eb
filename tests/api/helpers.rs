//! Test harness: spawns the app on port 0 with a unique tenant, a unique
//! Redis prefix and a clock the test controls.
//!
//! The backend comes from `ENGRAM_TEST_BACKEND`: `postgres` (the default:
//! Postgres + Redis from scripts/test.sh) or `embedded` (a SQLite data
//! directory of its own per app). scripts/test.sh runs this suite once with
//! each; a test that only makes sense on one backend says so and returns.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, Utc};
use engram::clock::Clock;
use engram::config::{Config, EmbeddingProvider};
use engram::jobs::retention::RetentionSweep;
use engram::store::postgres::PgStore;
use engram::store::{MemoryStore, Storage};
use reqwest::{Response, StatusCode};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// A clock the test moves by hand.
pub struct ManualClock(Mutex<DateTime<Utc>>);

impl ManualClock {
    pub fn advance(&self, by: Duration) {
        *self.0.lock().unwrap() += by;
    }

    pub fn set(&self, to: DateTime<Utc>) {
        *self.0.lock().unwrap() = to;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock().unwrap()
    }
}

pub struct TestApp {
    pub base: String,
    pub client: reqwest::Client,
    pub clock: Arc<ManualClock>,
    pub storage: Storage,
    /// The app's persistent store, for store-level checks on either backend.
    pub store: Arc<dyn MemoryStore>,
    /// The retention sweep, run by tests with `run_once`.
    pub retention: Arc<RetentionSweep>,
    /// The service, for jobs tests run with `run_once` (the outbox).
    pub service: Arc<engram::service::MemoryService>,
    /// Erasure requests and the audit log.
    pub eraser: Arc<engram::jobs::erasure::Eraser>,
    pub config: Config,
    /// Bearer key sent with every request, when the app has keys.
    pub api_key: Option<String>,
    shutdown: CancellationToken,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Whether this run tests the embedded backend (`ENGRAM_TEST_BACKEND=embedded`).
pub fn embedded() -> bool {
    match std::env::var("ENGRAM_TEST_BACKEND").as_deref() {
        Ok("embedded") => true,
        Ok("postgres") | Err(_) => false,
        Ok(other) => panic!("ENGRAM_TEST_BACKEND must be postgres or embedded, not {other}"),
    }
}

fn test_database_url() -> String {
    std::env::var("ENGRAM_TEST_DATABASE_URL").expect(
        "ENGRAM_TEST_DATABASE_URL is not set: run the tests with scripts/test.sh, which starts Postgres and Redis",
    )
}

pub fn test_config() -> Config {
    let db = if embedded() { String::new() } else { test_database_url() };
    let redis = std::env::var("ENGRAM_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let mut c = Config::default();
    c.database.url = db;
    c.database.max_connections = 5;
    c.redis.url = redis;
    c.redis.key_prefix = format!("engram-test-{}", Uuid::new_v4().simple());
    c.auth.default_tenant = format!("t-{}", Uuid::new_v4().simple());
    c.embedded.data_dir =
        std::env::temp_dir().join(format!("engram-test-{}", Uuid::new_v4().simple())).to_string_lossy().into_owned();
    c.embedding.provider = EmbeddingProvider::LexicalHash;
    c.server.shutdown_grace_ms = 1_000;
    c
}

/// Drops a database made by `fresh_database`, with whatever is still connected.
pub async fn drop_database(url: &str) {
    let admin = sqlx::PgPool::connect(&test_database_url()).await.unwrap();
    let name = url.rsplit('/').next().unwrap().to_string();
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")))
        .execute(&admin)
        .await
        .unwrap();
}

/// The bundled model's directory (scripts/test.sh fetches it and sets ENGRAM_MODEL_DIR).
pub fn local_model_dir() -> String {
    let dir = std::env::var("ENGRAM_MODEL_DIR")
        .expect("ENGRAM_MODEL_DIR is not set: run the tests with scripts/test.sh, which fetches the model");
    assert!(std::path::Path::new(&dir).join("model.safetensors").is_file(), "no model in {dir}");
    dir
}

/// Configures the bundled all-MiniLM-L6-v2 embedder, the server's default.
pub fn use_local_model(c: &mut Config) {
    c.embedding.provider = EmbeddingProvider::Local;
    c.embedding.local.model_dir = local_model_dir();
}

/// A new, empty database next to the test database, for tests that work on
/// every row of a table (not only their tenant's). Returns its URL.
pub async fn fresh_database() -> String {
    let base = test_database_url();
    let name = format!("engram_test_{}", Uuid::new_v4().simple());
    let admin = sqlx::PgPool::connect(&base).await.expect("test database reachable");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&admin).await.unwrap();
    admin.close().await;
    match base.rsplit_once('/') {
        Some((server, _)) => format!("{server}/{name}"),
        None => panic!("unexpected database URL {base}"),
    }
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

pub async fn spawn_app_with(tweak: impl FnOnce(&mut Config)) -> TestApp {
    engram::telemetry::init_logging(&engram::config::LogConfig { format: "text".into(), filter: "warn".into() });
    let mut config = test_config();
    tweak(&mut config);
    let clock = Arc::new(ManualClock(Mutex::new(Utc::now())));
    let app = engram::app::build_with_clock(config.clone(), clock.clone()).await.expect("app builds");
    let storage = app.storage.clone();
    let store = app.state.service.store.clone();
    let retention = app.state.retention.clone();
    let service = app.state.service.clone();
    let eraser = app.state.eraser.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    tokio::spawn(engram::app::run(listener, app, shutdown.clone()));
    TestApp {
        base,
        client: reqwest::Client::new(),
        clock,
        storage,
        store,
        retention,
        service,
        eraser,
        config,
        api_key: None,
        shutdown,
    }
}

impl TestApp {
    /// The Postgres store, or None (with a note on stderr) on the embedded
    /// backend: for tests of what only the Postgres backend has.
    pub fn postgres_only(&self, what: &str) -> Option<&PgStore> {
        let pg = self.storage.pg();
        if pg.is_none() {
            eprintln!("skipped on the embedded backend: {what} is Postgres-only");
        }
        pg
    }

    fn auth(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.api_key {
            Some(k) => rb.bearer_auth(k),
            None => rb,
        }
    }

    pub fn as_key(&self, key: &str) -> TestApp {
        TestApp {
            base: self.base.clone(),
            client: self.client.clone(),
            clock: self.clock.clone(),
            storage: self.storage.clone(),
            store: self.store.clone(),
            retention: self.retention.clone(),
            service: self.service.clone(),
            eraser: self.eraser.clone(),
            config: self.config.clone(),
            api_key: Some(key.to_string()),
            // A second handle must not stop the server when dropped.
            shutdown: CancellationToken::new(),
        }
    }

    pub async fn post(&self, path: &str, body: &Value) -> Response {
        self.auth(self.client.post(format!("{}{path}", self.base)).json(body)).send().await.unwrap()
    }

    pub async fn post_raw(&self, path: &str, body: impl Into<reqwest::Body>) -> Response {
        self.auth(
            self.client.post(format!("{}{path}", self.base)).header("content-type", "application/json").body(body),
        )
        .send()
        .await
        .unwrap()
    }

    pub async fn get(&self, path: &str) -> Response {
        self.auth(self.client.get(format!("{}{path}", self.base))).send().await.unwrap()
    }

    pub async fn patch(&self, path: &str, body: &Value) -> Response {
        self.auth(self.client.patch(format!("{}{path}", self.base)).json(body)).send().await.unwrap()
    }

    pub async fn put(&self, path: &str, body: &Value) -> Response {
        self.auth(self.client.put(format!("{}{path}", self.base)).json(body)).send().await.unwrap()
    }

    pub async fn delete(&self, path: &str) -> Response {
        self.auth(self.client.delete(format!("{}{path}", self.base))).send().await.unwrap()
    }

    /// Writes and expects 201; returns the written memories.
    pub async fn write(&self, body: Value) -> Vec<Value> {
        let r = self.post("/v1/memories", &body).await;
        let status = r.status();
        let json: Value = r.json().await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "write failed: {json}");
        json["memories"].as_array().unwrap().clone()
    }

    /// Writes one memory and returns it.
    pub async fn write_one(&self, body: Value) -> Value {
        self.write(body).await.remove(0)
    }

    pub async fn get_json(&self, path: &str) -> (StatusCode, Value) {
        let r = self.get(path).await;
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// A direct Redis client, for checking what engram left there.
    pub async fn redis(&self) -> fred::clients::Client {
        use fred::prelude::*;
        let config = engram::store::redis::client_config(&self.config.redis.url).unwrap();
        let client = Builder::from_config(config).build().unwrap();
        client.init().await.unwrap();
        client
    }
}

/// Asserts the standard error body and returns it.
pub async fn expect_error(r: Response, status: StatusCode, code: &str) -> Value {
    let got = r.status();
    let header_id = r.headers().get("x-request-id").and_then(|v| v.to_str().ok()).map(str::to_string);
    let body: Value = r.json().await.expect("error bodies are JSON");
    assert_eq!(got, status, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert_eq!(body["error"]["request_id"].as_str().map(str::to_string), header_id, "request id in body and header");
    body
}

impl ManualClock {
    pub fn now_plus(&self, by: Duration) -> DateTime<Utc> {
        *self.0.lock().unwrap() + by
    }
}

/// A redis-server of a test's own on a free loopback port, for tests that
/// stop and start Redis (the shared one must never be stopped). Its data
/// directory keeps a snapshot across a restart when the test saves one.
pub struct OwnRedis {
    pub port: u16,
    dir: std::path::PathBuf,
    child: Option<std::process::Child>,
}

impl OwnRedis {
    pub fn start() -> OwnRedis {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let dir = std::env::temp_dir().join(format!("engram-redis-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut r = OwnRedis { port, dir, child: None };
        r.resume();
        r
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn cli(&self, args: &[&str]) -> bool {
        std::process::Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success() && !String::from_utf8_lossy(&o.stdout).contains("ERR"))
    }

    /// Writes a snapshot that the next start loads.
    pub fn save(&self) {
        assert!(self.cli(&["save"]), "redis SAVE");
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// Starts it again (with the last saved snapshot) and waits until it answers.
    pub fn resume(&mut self) {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server on PATH");
        self.child = Some(child);
        for _ in 0..100 {
            if self.cli(&["ping"]) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("redis-server did not start on port {}", self.port);
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// POSTs a JSON body; returns the status and the JSON answer.
pub async fn post_json(app: &TestApp, path: &str, body: &Value) -> (StatusCode, Value) {
    let r = app.post(path, body).await;
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}
