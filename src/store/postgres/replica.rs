//! A streaming read replica (`database.read_url`): which reads it serves,
//! and how a deletion on the primary stays deleted there.
//!
//! The reads a client makes (search and context, a get by id, a list) go to
//! the replica while it has replayed every deletion of the tenant. Each
//! deleting transaction (an erasure's acceptance, a memory deleted by id, a
//! write that replaces a row) raises the tenant's row in `read_fences` in the
//! same transaction as its deletes (migration 0014). Before a read, the row
//! is read on both sides at once: the same generation on the replica means
//! it has replayed every deletion acknowledged so far, so an erased or
//! deleted memory cannot come back from it; a lower one sends this read to
//! the primary. The cost is two primary-key lookups, one on each side,
//! side by side (for a search, while the query is embedded).
//!
//! Writes and what they read first (idempotency, dedup, supersede, a patch),
//! history, sharing's reads of a source, the erasure, retention and
//! consolidation jobs stay on the primary. What the replica may lag on is
//! new and changed rows: a memory written a moment ago may be missing from a
//! search or a list served there, a changed one may show its earlier
//! version. A get by id that misses on the replica asks the primary, and a
//! skill is always read from the primary, because the service caches it.
//!
//! A replica read that fails, or takes longer than `database.read_timeout_ms`,
//! is done again on the primary; a replica that cannot be reached or does
//! not answer in time is left alone for `database.read_retry_secs`. After
//! that a background probe (`SELECT 1`, under the same timeout) decides
//! whether reads go back, not a client's read: a replica that stays down
//! costs a client one failed-over read when it goes down, not one every
//! retry period.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::PgPool;

use super::{PgStore, store_error};
use crate::store::{StoreError, StoreResult};

/// The replica's pool and what it has done.
pub(super) struct Replica {
    pub(super) pool: PgPool,
    retry: Duration,
    /// A read there taking longer is abandoned (a replica that hangs
    /// instead of refusing connections) and done on the primary.
    timeout: Duration,
    health: std::sync::Mutex<Health>,
    counts: ReplicaCounts,
}

/// Whether reads may go to the replica.
#[derive(Clone, Copy, Debug)]
enum Health {
    Up,
    /// Left alone until then, after a failure.
    Resting(Instant),
    /// A probe is under way; reads stay on the primary until it answers.
    Probing,
}

/// How reads went, since the process started (also the
/// `engram_replica_reads_total` metric, by outcome).
#[derive(Debug, Default)]
pub struct ReplicaCounts {
    /// Served by the replica.
    pub served: AtomicU64,
    /// Sent to the primary: the replica had not replayed a deletion yet.
    pub behind: AtomicU64,
    /// Sent to the primary: the replica failed this read.
    pub failed: AtomicU64,
    /// Sent to the primary without trying the replica: it is left alone
    /// after failing, or a probe of it is under way.
    pub resting: AtomicU64,
}

impl ReplicaCounts {
    fn add(&self, outcome: &'static str) {
        let counter = match outcome {
            "served" => &self.served,
            "behind" => &self.behind,
            "resting" => &self.resting,
            _ => &self.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("engram_replica_reads_total", "outcome" => outcome).increment(1);
    }
}

impl Replica {
    pub(super) fn new(pool: PgPool, retry: Duration, timeout: Duration) -> Replica {
        Replica { pool, retry, timeout, health: std::sync::Mutex::new(Health::Up), counts: Default::default() }
    }

    /// A read on the replica, given up after the read timeout.
    async fn bounded<T>(&self, read: impl Future<Output = StoreResult<T>>) -> StoreResult<T> {
        match tokio::time::timeout(self.timeout, read).await {
            Ok(done) => done,
            Err(_) => Err(StoreError::Unavailable {
                what: "read replica",
                retry_after_secs: 1,
                source: anyhow::anyhow!("no answer within {:?}", self.timeout),
            }),
        }
    }

    fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether reads leave the replica alone now. The first caller after a
    /// rest has ended starts the probe that ends it, and goes to the primary
    /// like every read until the probe has answered.
    fn resting(self: &Arc<Self>) -> bool {
        let mut health = self.health();
        match *health {
            Health::Up => false,
            Health::Probing => true,
            Health::Resting(until) if Instant::now() < until => true,
            Health::Resting(_) => {
                *health = Health::Probing;
                drop(health);
                let replica = Arc::clone(self);
                tokio::spawn(async move { replica.probe().await });
                true
            }
        }
    }

    async fn probe(&self) {
        let answered = self.bounded(async { sqlx::query("SELECT 1").execute(&self.pool).await.map_err(store_error) });
        let next = match answered.await {
            Ok(_) => {
                tracing::info!("the read replica answers again; reads go there");
                Health::Up
            }
            Err(e) => {
                tracing::debug!(error = %e, "the read replica still does not answer");
                Health::Resting(Instant::now() + self.retry)
            }
        };
        *self.health() = next;
    }

    /// Notes a failed replica read; one that could not reach the replica
    /// rests it for the retry period.
    fn failed(&self, e: &StoreError) {
        if matches!(e, StoreError::Unavailable { .. }) {
            *self.health() = Health::Resting(Instant::now() + self.retry);
        }
        tracing::warn!(error = %e, "a read on the replica failed; it is done on the primary");
        self.counts.add("failed");
    }
}

/// How long an erasure's verification waits for the replica to replay its
/// deletes.
const CATCH_UP: Duration = Duration::from_secs(10);

/// Raises the tenant's generation in the deleting transaction `conn` is in.
pub(super) async fn raise_fence(conn: &mut sqlx::PgConnection, tenant: &str) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO read_fences (tenant_id, generation) VALUES ($1, 1) \
         ON CONFLICT (tenant_id) DO UPDATE SET generation = read_fences.generation + 1",
    )
    .bind(tenant)
    .execute(conn)
    .await
    .map_err(store_error)?;
    Ok(())
}

async fn generation(pool: &PgPool, tenant: &str) -> StoreResult<i64> {
    let g: Option<i64> = sqlx::query_scalar("SELECT generation FROM read_fences WHERE tenant_id = $1")
        .bind(tenant)
        .fetch_optional(pool)
        .await
        .map_err(store_error)?;
    Ok(g.unwrap_or(0))
}

impl PgStore {
    /// This store with a read replica.
    pub fn with_replica(mut self, pool: PgPool, retry: Duration, timeout: Duration) -> PgStore {
        self.replica = Some(Arc::new(Replica::new(pool, retry, timeout)));
        self
    }

    /// How the replica's reads went; None without a replica.
    pub fn replica_counts(&self) -> Option<&ReplicaCounts> {
        self.replica.as_ref().map(|r| &r.counts)
    }

    /// Closes the replica's pool, if there is one.
    pub async fn close_replica(&self) {
        if let Some(r) = &self.replica {
            r.pool.close().await;
        }
    }

    /// This store with every statement on the replica.
    fn on(&self, r: &Replica) -> PgStore {
        PgStore { pool: r.pool.clone(), replica: None, ..self.clone() }
    }

    /// This store reading on the replica, when the replica may serve a read
    /// of `tenant` now; None: read on the primary.
    pub(super) async fn reader(&self, tenant: &str) -> Option<PgStore> {
        let r = self.replica.as_ref()?;
        if r.resting() {
            r.counts.add("resting");
            return None;
        }
        let (primary, replica) = tokio::join!(generation(&self.pool, tenant), r.bounded(generation(&r.pool, tenant)));
        match (primary, replica) {
            (Ok(p), Ok(q)) if q >= p => Some(self.on(r)),
            (Ok(_), Ok(_)) => {
                r.counts.add("behind");
                None
            }
            (_, Err(e)) => {
                r.failed(&e);
                None
            }
            // The primary did not answer: the read goes there and says so.
            (Err(_), Ok(_)) => None,
        }
    }

    /// Runs a read on `reader` (from `reader()`), and on the primary when
    /// there is none or the replica fails it.
    pub(super) async fn read_on<T, F, Fut>(&self, reader: Option<PgStore>, read: F) -> StoreResult<T>
    where
        F: Fn(PgStore) -> Fut,
        Fut: Future<Output = StoreResult<T>>,
    {
        if let (Some(replica), Some(r)) = (reader, &self.replica) {
            match r.bounded(read(replica)).await {
                Ok(v) => {
                    self.note_served();
                    return Ok(v);
                }
                Err(e) => self.note_failed(&e),
            }
        }
        read(self.clone()).await
    }

    /// `read_on` with the reader this tenant may have now.
    pub(super) async fn read<T, F, Fut>(&self, tenant: &str, read: F) -> StoreResult<T>
    where
        F: Fn(PgStore) -> Fut,
        Fut: Future<Output = StoreResult<T>>,
    {
        let reader = self.reader(tenant).await;
        self.read_on(reader, read).await
    }

    /// The replica, once it shows the tenant's generation the primary
    /// shows (it has replayed the tenant's deletions), for an erasure's
    /// verification; None without a replica. A replica that does not catch
    /// up within `CATCH_UP` fails the verification, which is tried again
    /// later: an erasure is not verified while a replica may still hold
    /// its rows.
    pub(super) async fn caught_up_replica(&self, tenant: &str) -> StoreResult<Option<PgStore>> {
        let Some(r) = &self.replica else { return Ok(None) };
        let wanted = generation(&self.pool, tenant).await?;
        let deadline = Instant::now() + CATCH_UP;
        loop {
            match r.bounded(generation(&r.pool, tenant)).await {
                Ok(g) if g >= wanted => return Ok(Some(self.on(r))),
                Ok(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
                Ok(g) => {
                    return Err(StoreError::Unavailable {
                        what: "read replica",
                        retry_after_secs: 5,
                        source: anyhow::anyhow!("the replica shows deletion generation {g} of {wanted}"),
                    });
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A read on the replica (a store from `reader()`), given up after
    /// the read timeout.
    pub(super) async fn on_replica<T>(&self, read: impl Future<Output = StoreResult<T>>) -> StoreResult<T> {
        match &self.replica {
            Some(r) => r.bounded(read).await,
            None => read.await,
        }
    }

    pub(super) fn note_served(&self) {
        if let Some(r) = &self.replica {
            r.counts.add("served");
        }
    }

    pub(super) fn note_failed(&self, e: &StoreError) {
        if let Some(r) = &self.replica {
            r.failed(e);
        }
    }
}
