//! The Postgres backend of the persistent tiers: connection pool, migrations
//! and per-model vector indexes. The `MemoryStore`
//! implementation itself is in `memories.rs`, the write primitives
//! (`WriteTx`) in `write.rs`; export and import of a tenant's rows in
//! `transfer.rs`; retention's deletes in `retention.rs`; legal holds in
//! `holds.rs`.

mod consolidate;
mod erasure;
pub(crate) use erasure::vacuumed;
mod holds;
mod memories;
mod reembed;
pub mod replica;
mod retention;
mod rows;
pub mod search;
mod share;
pub mod stats;
mod transfer;
mod write;

use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use super::StoreError;
use sqlx::AssertSqlSafe;

use crate::config::{DatabaseConfig, SearchConfig};

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Advisory-lock keys; any replica may run maintenance, one at a time.
/// (…_0001 guarded the monthly partitions, gone since migration 0007.)
const LOCK_MODELS: i64 = 0x656e_6772_616d_0002;
/// Held (session-level) by the one replica running a retention sweep.
const LOCK_RETENTION: i64 = 0x656e_6772_616d_0003;
/// Held (session-level) by the one replica working on erasures.
const LOCK_ERASURE: i64 = 0x656e_6772_616d_0004;
/// The tables the vector leg searches, one per tier (migration 0018), each
/// with one HNSW index per registered model (`index_name`).
pub const VECTOR_TABLES: [&str; 3] = ["episodic_vectors", "semantic_vectors", "procedural_vectors"];

/// The persistent store on Postgres.
#[derive(Clone)]
pub struct PgStore {
    /// Shared pool; every method borrows a connection for one statement or one transaction.
    pool: PgPool,
    /// How long an idempotency key is remembered.
    idempotency_ttl: chrono::Duration,
    /// Word and agent frequencies for both recall legs (`stats.rs`).
    stats: std::sync::Arc<stats::PlannerStats>,
    /// The read replica, when `database.read_url` names one (`replica.rs`).
    replica: Option<std::sync::Arc<replica::Replica>>,
    /// `search.exact_scan_below` (`stats.rs`).
    exact_scan_below: u32,
}

/// Connects a pool (the server starts even if Postgres is momentarily down;
/// requests then get 503 until it answers).
/// Every connection searches HNSW indexes with the configured `ef_search`
/// and iterative scans, so filters applied after the graph walk (tenant,
/// agent, expiry) still return a full top-k.
///
/// And every statement is planned for its own parameters. Agents differ in
/// size by orders of magnitude, and the right plan with them: a walk of the
/// HNSW graph for an agent with a tenth of a table, a scan of its own rows
/// through the (tenant, agent) index for one with a hundred. sqlx prepares
/// every statement, and after five runs Postgres may switch a prepared
/// statement to a generic plan built for the average agent, which among
/// 10K agents is a tiny one; a large agent's search then reads and sorts
/// all its rows (the episodic vector leg of an agent with 70K of 709K rows:
/// 384 ms instead of 22 ms, bench/RESULTS.md "Postgres at 1M memories").
/// Planning each run costs well under a millisecond. (sqlx's unnamed
/// statements, `persistent(false)`, would do the same for the search alone,
/// but in sqlx 0.9 they fail when a statement's types need a lookup, as
/// `vector` does: transact-rs/sqlx#4305.)
///
/// And no statement runs on parallel workers. Every statement here serves
/// one request among many; a parallel plan starts worker processes (a few
/// milliseconds) and takes cores the other requests need. The full-text
/// leg's inner scan, whose size the planner cannot know before the query's
/// words are read, was planned in parallel for every agent, tiny or not
/// (bench/RESULTS.md, "1M memories over 10K agents with each agent's words
/// indexed apart").
pub fn connect_lazy(config: &DatabaseConfig, search: &SearchConfig) -> anyhow::Result<PgPool> {
    connect_url(&config.url, config, search).context("parsing database.url")
}

/// A pool on the read replica (`database.read_url`), set up as the
/// primary's; None when there is none.
pub fn connect_replica(config: &DatabaseConfig, search: &SearchConfig) -> anyhow::Result<Option<PgPool>> {
    if config.read_url.is_empty() {
        return Ok(None);
    }
    Ok(Some(connect_url(&config.read_url, config, search).context("parsing database.read_url")?))
}

fn connect_url(url: &str, config: &DatabaseConfig, search: &SearchConfig) -> anyhow::Result<PgPool> {
    let setup = format!(
        "SET hnsw.ef_search = {}; SET hnsw.iterative_scan = relaxed_order; SET hnsw.max_scan_tuples = {}; \
         SET plan_cache_mode = force_custom_plan; SET max_parallel_workers_per_gather = 0",
        search.ef_search, search.max_scan_tuples
    );
    PgPoolOptions::new()
        .max_connections(config.max_connections)
        .acquire_timeout(Duration::from_millis(config.acquire_timeout_ms))
        .after_connect(move |conn, _meta| {
            let setup = setup.clone();
            Box::pin(async move {
                sqlx::raw_sql(AssertSqlSafe(setup)).execute(conn).await?;
                Ok(())
            })
        })
        .connect_lazy(url)
        .map_err(Into::into)
}

pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    MIGRATOR.run(pool).await.context("applying database migrations")
}

impl PgStore {
    pub fn new(pool: PgPool, idempotency_ttl_hours: u32) -> Self {
        Self {
            pool,
            idempotency_ttl: chrono::Duration::hours(i64::from(idempotency_ttl_hours)),
            stats: Default::default(),
            replica: None,
            exact_scan_below: SearchConfig::default().exact_scan_below,
        }
    }

    /// Agents with fewer vectors than `n` in a tier are searched there by
    /// comparing them all, not by an HNSW walk, unless they hold most of
    /// their partition (`search.exact_scan_below`, `stats.rs`).
    pub fn with_exact_scan_below(mut self, n: u32) -> Self {
        self.exact_scan_below = n;
        self
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Fails, naming the first missing one, unless every migration this
    /// build knows has been applied: a server must not run its queries
    /// against an older schema.
    pub async fn check_migrated(&self) -> anyhow::Result<()> {
        let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
            .fetch_all(&self.pool)
            .await
            .context("reading the applied migrations (did migrations run? try `engram migrate`)")?;
        if let Some(missing) = MIGRATOR.iter().find(|m| !applied.contains(&m.version)) {
            anyhow::bail!(
                "the database lacks migration {} ({}): run `engram migrate` or set database.migrate_on_start",
                missing.version,
                missing.description
            );
        }
        Ok(())
    }

    /// Registers an embedding model and creates its HNSW indexes (one per
    /// tier's vector table, a partial expression index over that model's
    /// rows, built on every partition). Refuses a model already registered
    /// with another vector size.
    pub async fn ensure_model(&self, model: &str, dimensions: usize) -> anyhow::Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(LOCK_MODELS).execute(&mut *tx).await?;
        let known: Option<i32> = sqlx::query_scalar("SELECT dimensions FROM embedding_models WHERE model = $1")
            .bind(model)
            .fetch_optional(&mut *tx)
            .await?;
        match known {
            Some(d) if d as usize != dimensions => anyhow::bail!(
                "embedding model {model:?} is registered with {d} dimensions but the configuration gives {dimensions}"
            ),
            Some(_) => {}
            None => {
                sqlx::query("INSERT INTO embedding_models (model, dimensions) VALUES ($1, $2)")
                    .bind(model)
                    .bind(dimensions as i32)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        // One short transaction per index, and nothing at all when it exists:
        // CREATE INDEX locks its table against writes, and holding two such
        // locks at once could deadlock with a write batch touching both tables.
        let literal = model.replace('\'', "''");
        for table in VECTOR_TABLES {
            let name = index_name(table, model);
            let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_indexes WHERE indexname = $1)")
                .bind(&name)
                .fetch_one(&self.pool)
                .await?;
            if exists {
                continue;
            }
            let mut tx = self.pool.begin().await?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(LOCK_MODELS).execute(&mut *tx).await?;
            let sql = format!(
                "CREATE INDEX IF NOT EXISTS {name} ON {table} USING hnsw ((embedding::vector({dimensions})) vector_cosine_ops) \
                 WITH (m = 16, ef_construction = 200) WHERE embedding_model = '{literal}'"
            );
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&mut *tx)
                .await
                .with_context(|| format!("creating {name}"))?;
            tx.commit().await?;
        }
        Ok(())
    }
}

impl PgStore {
    /// Deletes idempotency keys older than their lifetime; returns how many.
    pub async fn forget_idempotency_keys(&self, now: DateTime<Utc>) -> anyhow::Result<u64> {
        let done = sqlx::query("DELETE FROM idempotency_keys WHERE created_at <= $1")
            .bind(now - self.idempotency_ttl)
            .execute(&self.pool)
            .await
            .context("forgetting old idempotency keys")?;
        Ok(done.rows_affected())
    }
}

/// `{table}_hnsw_{hash}`: stable, short and safe whatever the model's name.
pub fn index_name(table: &str, model: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = hex::encode(Sha256::digest(model.as_bytes()));
    format!("{table}_hnsw_{}", &digest[..12])
}

/// Maps a sqlx error to the store's vocabulary.
fn store_error(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) | sqlx::Error::Tls(_) => {
            StoreError::Unavailable { what: "database", retry_after_secs: 2, source: e.into() }
        }
        sqlx::Error::Database(db) if db.is_unique_violation() => {
            StoreError::Conflict("another memory already holds this content".into())
        }
        _ => StoreError::Internal(anyhow::Error::new(e).context("database")),
    }
}

/// Records a store operation's latency.
fn observe(op: &'static str, started: Instant) {
    metrics::histogram!("engram_store_operation_duration_seconds", "backend" => "postgres", "op" => op)
        .record(started.elapsed().as_secs_f64());
}
