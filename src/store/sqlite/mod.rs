//! The embedded SQLite backend: the zero-setup mode, one directory on local
//! disk instead of Postgres and Redis.
//!
//! - `memories.rs`: `MemoryStore` (transactions, reads, listing, patches, history).
//! - `write.rs`: the write primitives (`WriteTx`) the shared write path in
//!   `store::write` is built from, and the commit that updates the indexes.
//! - `search.rs`: the two recall legs (the full-text and the vector index).
//! - `text.rs`: the in-process full-text index (bm25), rebuilt from the database at open.
//! - `vectors.rs`: the in-process vector index, rebuilt the same way.
//! - `reembed.rs`: moving stored vectors to the configured model.
//! - `transfer.rs`: export and import, rows copied as they are.
//! - `retention.rs`: deleting expired and decayed memories (`Sweep`).
//! - `holds.rs`: legal holds, which the sweep and erasure respect.
//! - `working.rs`: `WorkingMemory` as a table, `SkillCache` as a map.
//! - `rows.rs`: the row shape and its conversion to `Memory`.
//!
//! One process owns a data directory: `open` takes an exclusive lock on
//! `engram.lock` and fails if another process holds it. Inside the process,
//! every write transaction runs behind one async mutex (`write_gate`):
//! SQLite has one writer at a time anyway, and serialising here means a
//! transaction that reads before it writes can never fail to upgrade its
//! lock, and the in-process indexes change in commit order.
//!
//! Must not: know about HTTP, or be used by two processes on one directory.

mod consolidate;
mod erasure;
mod holds;
mod memories;
mod reembed;
mod retention;
mod rows;
mod search;
mod share;
mod text;
mod transfer;
mod vectors;
mod working;
mod write;

#[cfg(test)]
mod tests;

use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use super::StoreError;
pub use text::TextIndex;
pub use vectors::VectorIndex;
pub use working::{LocalSkillCache, SqliteWorkingMemory};

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// Settings of the embedded backend (the Postgres and Redis backends take
/// the same values from their own sections of the configuration).
#[derive(Debug, Clone)]
pub struct SqliteSettings {
    /// How long an idempotency key is remembered.
    pub idempotency_ttl_hours: u32,
    /// Most entries a working-memory session keeps (the oldest go first).
    pub working_max_entries: usize,
    /// Connections in the pool: readers run concurrently (WAL), writers queue.
    pub max_connections: u32,
    /// How long a statement waits for a lock held by another connection.
    pub busy_timeout: Duration,
}

impl Default for SqliteSettings {
    fn default() -> Self {
        Self {
            idempotency_ttl_hours: 24,
            working_max_entries: 500,
            max_connections: 4,
            busy_timeout: Duration::from_secs(5),
        }
    }
}

/// The persistent tiers (and, through `working_memory`, working memory) in
/// one SQLite database. Cheap to clone: every clone shares the pool, the
/// lock and the in-process indexes.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// Connections to `engram.db`; reads take any, writes take one while
    /// holding `write_gate`.
    pool: SqlitePool,
    /// Held by every write transaction from BEGIN until its index changes
    /// are applied.
    write_gate: Arc<tokio::sync::Mutex<()>>,
    /// Held by a retention sweep from start to end (batches take `write_gate`
    /// one at a time).
    sweep_gate: Arc<tokio::sync::Mutex<()>>,
    /// Held by the erasure worker while it works.
    erasure_gate: Arc<tokio::sync::Mutex<()>>,
    /// The agents being consolidated, as `tenant/agent` (one process owns
    /// the data directory, so an in-process set is the whole lock).
    consolidating: Arc<std::sync::Mutex<std::collections::HashSet<(String, String)>>>,
    /// Vectors of every memory that has one; read by searches, changed by
    /// writers after their commit (under `write_gate`).
    vectors: RwLock<VectorIndex>,
    /// Every memory's text, for the full-text leg; kept like `vectors`.
    text: RwLock<TextIndex>,
    /// Working-memory sessions recently read, parsed (see `working.rs`).
    sessions: std::sync::Mutex<working::SessionCache>,
    idempotency_ttl: chrono::Duration,
    working_max_entries: usize,
    dir: PathBuf,
    /// The exclusive lock on `engram.lock`, released when the store is dropped.
    _lock: File,
}

/// How much of the database file is read through a memory map (address
/// space, not memory: the pages live in the OS page cache either way).
/// SQLite caps it at its built-in maximum (just under 2 GiB); beyond that,
/// pages are read as before.
const MMAP_BYTES: u64 = 2 << 30;

impl SqliteStore {
    /// Opens (creating if needed) the data directory `dir`: locks it, opens
    /// `engram.db` in WAL mode with synchronous writes, applies migrations and
    /// loads the vector and full-text indexes.
    pub async fn open(dir: &Path, settings: &SqliteSettings) -> anyhow::Result<SqliteStore> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating data directory {}", dir.display()))?;
        let lock = lock_dir(dir)?;
        // WAL: readers never block the writer nor each other. synchronous =
        // FULL: a commit is on disk (WAL fsynced) before it returns, so every
        // acknowledged write survives a crash or power loss (NORMAL would
        // only survive a process crash). Foreign keys on, though this schema
        // declares none yet, so later migrations can rely on them.
        let options = SqliteConnectOptions::new()
            .filename(dir.join("engram.db"))
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(settings.busy_timeout)
            // Reads through a memory map of the file instead of a read()
            // per page: a search reads rows scattered over the file. Writes
            // still go through the WAL.
            .pragma("mmap_size", MMAP_BYTES.to_string())
            // Deleted content is overwritten with zeros in the file, not only
            // unlinked: an erased memory must not survive in free pages. Old
            // page images in the WAL go when an erasure checkpoints it.
            .pragma("secure_delete", "on");
        let pool = SqlitePoolOptions::new()
            .max_connections(settings.max_connections.max(1))
            .connect_with(options)
            .await
            .with_context(|| format!("opening {}", dir.join("engram.db").display()))?;
        MIGRATOR.run(&pool).await.context("applying SQLite migrations")?;
        let started = Instant::now();
        let (vectors, text) =
            tokio::try_join!(async { VectorIndex::load(&pool).await.context("loading the vector index") }, async {
                TextIndex::load(&pool).await.context("loading the full-text index")
            },)?;
        tracing::info!(
            dir = %dir.display(),
            vectors = vectors.len(),
            texts = text.len(),
            load_ms = started.elapsed().as_millis() as u64,
            "opened the SQLite store"
        );
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                pool,
                write_gate: Arc::new(tokio::sync::Mutex::new(())),
                sweep_gate: Default::default(),
                erasure_gate: Default::default(),
                consolidating: Default::default(),
                vectors: RwLock::new(vectors),
                text: RwLock::new(text),
                sessions: Default::default(),
                idempotency_ttl: chrono::Duration::hours(i64::from(settings.idempotency_ttl_hours)),
                working_max_entries: settings.working_max_entries.max(1),
                dir: dir.to_path_buf(),
                _lock: lock,
            }),
        })
    }

    /// Working memory in the same database.
    pub fn working_memory(&self) -> SqliteWorkingMemory {
        SqliteWorkingMemory::new(self.inner.clone())
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.inner.pool
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Closes every connection (checkpointing the WAL). The directory lock is
    /// released when the last clone of the store is dropped.
    pub async fn close(&self) {
        self.inner.pool.close().await;
    }

    /// Deletes idempotency keys older than their lifetime; returns how many.
    pub async fn forget_idempotency_keys(&self, now: DateTime<Utc>) -> anyhow::Result<u64> {
        let _gate = self.inner.write_gate.lock().await;
        let done = sqlx::query("delete from idempotency_keys where created_at <= ?")
            .bind(micros(now - self.inner.idempotency_ttl))
            .execute(&self.inner.pool)
            .await
            .context("forgetting old idempotency keys")?;
        Ok(done.rows_affected())
    }
}

/// Takes the exclusive advisory lock that makes one process the owner of `dir`.
fn lock_dir(dir: &Path) -> anyhow::Result<File> {
    let path = dir.join("engram.lock");
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(TryLockError::WouldBlock) => {
            anyhow::bail!("data directory {} is in use by another engram process", dir.display())
        }
        Err(TryLockError::Error(e)) => Err(e).with_context(|| format!("locking {}", path.display())),
    }
}

/// A timestamp as stored: microseconds since the epoch (Postgres's precision).
fn micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

fn from_micros(v: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_micros(v)
        .ok_or_else(|| StoreError::Internal(anyhow::anyhow!("stored timestamp {v} is out of range")))
}

/// Maps a sqlx error to the store's vocabulary.
fn store_error(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => {
            StoreError::Unavailable { what: "database", retry_after_secs: 1, source: e.into() }
        }
        sqlx::Error::Database(db) if db.is_unique_violation() => {
            StoreError::Conflict("another memory already holds this content".into())
        }
        // SQLITE_BUSY (5) and SQLITE_LOCKED (6), extended codes included: the
        // busy timeout ran out behind another connection. Worth a retry.
        sqlx::Error::Database(db)
            if db.code().and_then(|c| c.parse::<i32>().ok()).is_some_and(|c| matches!(c & 0xff, 5 | 6)) =>
        {
            StoreError::Unavailable { what: "database", retry_after_secs: 1, source: e.into() }
        }
        _ => StoreError::Internal(anyhow::Error::new(e).context("database")),
    }
}

/// Records a store operation's latency.
fn observe(op: &'static str, started: Instant) {
    record(op, started.elapsed().as_secs_f64());
}

fn record(op: &'static str, seconds: f64) {
    metrics::histogram!("engram_store_operation_duration_seconds", "backend" => "sqlite", "op" => op).record(seconds);
}
