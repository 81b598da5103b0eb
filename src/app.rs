//! Wiring: builds the application state from the configuration (the one
//! function tests use too), runs the server and its background jobs, and
//! shuts everything down on SIGTERM or Ctrl-C.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::domain::classify::RuleClassifier;
use crate::http::extract::Auth;
use crate::service::MemoryService;
use crate::store::Storage;
use crate::store::postgres::{self, PgStore};
use crate::store::redis::RedisStore;
use crate::store::sqlite::{SqliteSettings, SqliteStore};
use crate::{embed, jobs};

/// Shared by every request. Cheap to clone: handles only.
#[derive(Clone)]
pub struct AppState {
    /// All memory operations.
    pub service: Arc<MemoryService>,
    /// API keys and their tenants.
    pub auth: Arc<Auth>,
    /// Renders `/metrics`.
    pub metrics: PrometheusHandle,
    /// The database connection pool, for the pool gauges.
    pub db_pool: DbPool,
    /// The retention sweep, for its dry run and gauges (the job runs it too).
    pub retention: Arc<jobs::retention::RetentionSweep>,
    /// Erasure requests and receipts, and the audit log (the worker runs it too).
    pub eraser: Arc<jobs::erasure::Eraser>,
    pub consolidator: Arc<jobs::consolidation::Consolidator>,
    /// Grants, teams and shares between agents.
    pub sharing: Arc<crate::sharing::SharingService>,
    /// The OpenAPI document, rendered once.
    pub openapi_json: Arc<String>,
    pub body_limit: usize,
    pub request_timeout_ms: u64,
    /// The same for writes of memories (`POST /v1/memories`).
    pub write_timeout_ms: u64,
    /// Per-key request rate and in-flight limits.
    pub limits: Arc<crate::http::limits::Limits>,
}

pub use crate::store::DbPool;

/// The state plus the storage the background jobs and shutdown need.
pub struct App {
    pub state: AppState,
    /// Access counts queued by searches, for the flusher job.
    pub access_rx: Option<tokio::sync::mpsc::Receiver<crate::recall::AccessBatch>>,
    pub storage: Storage,
    pub config: Config,
}

/// Most skills the embedded backend's in-process cache holds.
const LOCAL_SKILL_CACHE_ENTRIES: usize = 10_000;

/// Opens the backends — Postgres and Redis when a database URL is set, else
/// the embedded database in the data directory — applies migrations (when
/// configured), checks the schema, prepares the embedding model's indexes, and
/// assembles the state.
pub async fn build(config: Config) -> anyhow::Result<App> {
    build_with_clock(config, Arc::new(SystemClock)).await
}

pub async fn build_with_clock(config: Config, clock: Arc<dyn Clock>) -> anyhow::Result<App> {
    for notice in &config.notices {
        tracing::info!("{notice}");
    }
    let storage = open_storage(&config).await?;
    let embedder = embed::from_config(&config.embedding)?;
    match &embedder {
        Some(e) => {
            storage.maintenance.prepare_model(e.model_id(), e.dimensions()).await?;
            tracing::info!(model = e.model_id(), dimensions = e.dimensions(), "embedding model ready");
        }
        None => tracing::warn!("no embedding provider configured: memories are stored without vectors"),
    }
    let auth = Auth::new(&config.auth);
    if auth.is_open() {
        tracing::warn!(
            tenant = %config.auth.default_tenant,
            "NO API KEYS CONFIGURED: the server is open to anyone who can reach it; \
             every request acts for the default tenant. Set ENGRAM_API_KEYS or [[auth.keys]]."
        );
    }
    let (access, access_rx) = crate::recall::AccessRecorder::new(10_000);
    let erasing = Arc::new(crate::domain::erasure::Erasing::default());
    let service = MemoryService {
        store: storage.memories.clone(),
        working: storage.working.clone(),
        skills: storage.skills.clone(),
        embedder,
        classifier: Arc::new(RuleClassifier),
        clock,
        agent_weights: config.agents.iter().filter_map(|(a, c)| c.weights.map(|w| (a.clone(), w))).collect(),
        dedup_cosine: config.search.dedup_cosine,
        vector_share: config.search.vector_share,
        neighbour_share: config.search.neighbour_share,
        speaker_share: config.search.speaker_share,
        date_share: config.search.date_share,
        relative_relevance: config.search.relative_relevance,
        context_candidates: config.search.context_candidates,
        access: Some(access),
        cardinality: crate::domain::facts::Cardinality::new(
            config.facts.multi_valued_predicates.iter().map(String::as_str),
        ),
        retention: config.retention.policy(),
        erasing: erasing.clone(),
    };
    let retention = jobs::retention::RetentionSweep {
        sweep: storage.sweep.clone(),
        skills: storage.skills.clone(),
        clock: service.clock.clone(),
        decay: config.retention.decay_rule(),
        batch: config.retention.sweep_batch,
    };
    let eraser = jobs::erasure::Eraser {
        erasure: storage.erasure.clone(),
        sweep: storage.sweep.clone(),
        working: storage.working.clone(),
        transfer: storage.transfer.clone(),
        skills: storage.skills.clone(),
        clock: service.clock.clone(),
        erasing,
        backend: storage.name,
        batch: config.erasure.batch,
        wake: tokio::sync::Notify::new(),
    };
    let eraser = Arc::new(eraser);
    let service = Arc::new(service);
    let sharing = crate::sharing::SharingService::new(
        &config.sharing,
        service.clone(),
        storage.sharing.clone(),
        eraser.clone(),
        service.clock.clone(),
    )?;
    let consolidator = jobs::consolidation::Consolidator {
        service: service.clone(),
        llm: crate::llm::from_config(&config.llm)?,
        store: storage.consolidation.clone(),
        clock: service.clock.clone(),
        config: config.consolidation.clone(),
        wake: tokio::sync::Notify::new(),
    };
    let state = AppState {
        retention: Arc::new(retention),
        eraser,
        consolidator: Arc::new(consolidator),
        service,
        sharing: Arc::new(sharing),
        auth: Arc::new(auth),
        metrics: crate::telemetry::metrics_handle(),
        db_pool: storage.pool.clone(),
        openapi_json: Arc::new(crate::http::openapi_json()),
        body_limit: config.server.body_limit_bytes,
        request_timeout_ms: config.server.request_timeout_ms,
        write_timeout_ms: config.server.write_timeout_ms,
        limits: Arc::new(crate::http::limits::Limits::new(&config.limits)),
    };
    Ok(App { state, access_rx: Some(access_rx), storage, config })
}

/// Opens the configured storage: Postgres and Redis when a database URL is
/// set (migrating when configured, and refusing a database whose schema is
/// behind this build), else the embedded database in the data directory.
/// Used by the server and by the commands that open the store.
pub async fn open_storage(config: &Config) -> anyhow::Result<Storage> {
    if config.database.url.is_empty() {
        let dir = std::path::Path::new(&config.embedded.data_dir);
        let settings = SqliteSettings {
            idempotency_ttl_hours: config.idempotency.ttl_hours,
            working_max_entries: config.redis.working_max_entries,
            max_connections: config.embedded.max_connections,
            busy_timeout: Duration::from_millis(config.embedded.busy_timeout_ms),
        };
        let store = SqliteStore::open(dir, &settings).await?;
        let shown = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
        tracing::info!(data_dir = %shown.display(), "embedded backend: every tier in one SQLite database; no Postgres or Redis");
        Ok(Storage::embedded(
            store,
            Duration::from_secs(config.redis.procedural_cache_ttl_secs),
            LOCAL_SKILL_CACHE_ENTRIES,
        ))
    } else {
        let pool = postgres::connect_lazy(&config.database, &config.search)?;
        if config.database.migrate_on_start {
            postgres::migrate(&pool).await?;
        }
        let mut pg =
            PgStore::new(pool, config.idempotency.ttl_hours).with_exact_scan_below(config.search.exact_scan_below);
        if let Some(replica) = postgres::connect_replica(&config.database, &config.search)? {
            tracing::info!(
                replica = %crate::config::redact_url(&config.database.read_url),
                "searches, context, gets and lists are read on the replica while it holds every deletion"
            );
            pg = pg.with_replica(
                replica,
                Duration::from_secs(config.database.read_retry_secs),
                Duration::from_millis(config.database.read_timeout_ms),
            );
        }
        pg.check_migrated().await?;
        let redis = RedisStore::connect(&config.redis).context("configuring Redis")?;
        Ok(Storage::postgres(pg, redis))
    }
}

/// Serves until `shutdown` is cancelled, then drains requests (bounded by
/// the grace period), stops the jobs and closes the backends.
pub async fn run(listener: TcpListener, mut app: App, shutdown: CancellationToken) -> anyhow::Result<()> {
    let addr = listener.local_addr().context("reading the listening address")?;
    refuse_keyless_on_network(&app.config, addr)?;
    tracing::info!("engram listening on http://{addr}; API docs at http://{addr}/docs");
    let tracker = TaskTracker::new();
    jobs::spawn_all(&tracker, &mut app, shutdown.clone());
    tracker.close();

    let router = crate::http::router(app.state.clone());
    let s = &app.config.server;
    let grace = Duration::from_millis(s.shutdown_grace_ms);
    let limits = crate::server::Limits {
        header_read_timeout: Duration::from_millis(s.header_read_timeout_ms),
        keep_alive_timeout: Duration::from_millis(s.keep_alive_timeout_ms),
        max_connections: s.max_connections,
    };
    let server = tokio::spawn(crate::server::serve(listener, router, limits, shutdown.clone()));
    shutdown.cancelled().await;
    match tokio::time::timeout(grace, server).await {
        Ok(joined) => joined.context("server task")?,
        Err(_) => tracing::warn!("requests still running after the grace period; exiting anyway"),
    }
    tracker.wait().await;
    app.storage.maintenance.close().await;
    Ok(())
}

/// Without API keys anyone who reaches the server reads and writes every
/// memory: that is for loopback, unless the configuration says otherwise.
/// `run` checks; `engram serve` checks before it builds anything too.
pub fn refuse_keyless_on_network(config: &Config, addr: std::net::SocketAddr) -> anyhow::Result<()> {
    let auth = &config.auth;
    if auth.keys.is_empty() && !addr.ip().is_loopback() && !auth.allow_keyless_on_network {
        anyhow::bail!(
            "refusing to listen on {addr} without API keys: anyone who can reach it could read and write \
             every memory. Configure keys (ENGRAM_API_KEYS or [[auth.keys]]), listen on 127.0.0.1, or set \
             auth.allow_keyless_on_network = true (ENGRAM_AUTH__ALLOW_KEYLESS_ON_NETWORK=true) to serve \
             keyless anyway"
        );
    }
    Ok(())
}

/// Cancels `token` on SIGTERM or Ctrl-C.
pub fn cancel_on_signal(token: CancellationToken) {
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen for SIGTERM");
                    std::future::pending::<()>().await
                }
            }
        };
        #[cfg(not(unix))]
        let term = std::future::pending::<()>();
        tokio::select! {
            _ = ctrl_c => {},
            _ = term => {},
        }
        tracing::info!("shutting down");
        token.cancel();
    });
}
