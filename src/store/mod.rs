//! Storage boundaries: what the service needs from a persistent memory store,
//! from working memory and from the skill cache, and the errors they speak.
//!
//! Backends implement these traits and know nothing of HTTP. Every method takes
//! the tenant first: no query is ever issued without it.
//!
//! Besides the three request-path traits, each backend implements capability
//! traits for the work around requests: `Maintenance` (model indexes,
//! re-embedding, idempotency keys, closing), `Transfer`
//! (export and import) and `Sweep` (deleting what retention no longer keeps).
//! `Storage` (in `storage.rs`) holds one handle of each,
//! built in one place, so no caller matches on the backend. A new kind of
//! administrative work is a new capability implemented once per backend, as
//! `erasure::Erasures` (a data subject's memories from every store, and the
//! audit log) is.

pub mod breaker;
pub mod consolidate;
pub mod erasure;
pub mod postgres;
pub mod redis;
pub mod share;
pub mod sqlite;
mod storage;
pub mod write;

pub use storage::{DbPool, Storage};

use std::collections::HashSet;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use serde_json::Value;
use uuid::Uuid;

use crate::domain::retention::{DecayCandidate, DecayRule};
use crate::domain::validate::FieldError;
use crate::domain::{Memory, MemoryPatch, NewMemory, Tier, WrittenMemory};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("invalid: {}", .0.message)]
    Invalid(FieldError),
    /// An erasure would touch memories under these active legal holds.
    #[error("under legal hold: {}", crate::domain::holds::refusal(.0))]
    Held(Vec<crate::domain::holds::Hold>),
    /// A hold cannot be placed while these erasures of the user are unfinished.
    #[error("erasures in progress: {0:?}")]
    Erasing(Vec<Uuid>),
    #[error("{what} unavailable: {source}")]
    Unavailable { what: &'static str, retry_after_secs: u64, source: anyhow::Error },
    #[error(transparent)]
    Internal(anyhow::Error),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// A stored value engram does not know (a row written by something else, or
/// by a newer version).
pub(crate) fn corrupt(what: &str, value: &str) -> StoreError {
    StoreError::Internal(anyhow::anyhow!("stored {what} {value:?} is not one engram knows"))
}

/// A fact's stored source, parsed the same way by every backend.
pub(crate) fn parse_source(s: &str) -> StoreResult<crate::domain::facts::Source> {
    crate::domain::facts::Source::parse(s).ok_or_else(|| corrupt("source", s))
}

/// The kinds a stored row names as text, parsed the same way by every backend.
pub(crate) struct RowKinds {
    pub tier: Tier,
    pub retention: crate::domain::Retention,
    pub event_type: Option<crate::domain::EventType>,
    pub outcome: Option<crate::domain::Outcome>,
}

impl RowKinds {
    pub(crate) fn parse(
        tier: &str,
        retention: &str,
        event_type: Option<&str>,
        outcome: Option<&str>,
    ) -> StoreResult<RowKinds> {
        use crate::domain::{EventType, Outcome, Retention};
        Ok(RowKinds {
            tier: Tier::parse(tier).ok_or_else(|| corrupt("tier", tier))?,
            retention: Retention::parse(retention).ok_or_else(|| corrupt("retention", retention))?,
            event_type: event_type.map(|e| EventType::parse(e).ok_or_else(|| corrupt("event_type", e))).transpose()?,
            outcome: outcome.map(|o| Outcome::parse(o).ok_or_else(|| corrupt("outcome", o))).transpose()?,
        })
    }
}

/// A write ready for storage: validated, classified, hashed and embedded,
/// with what the server decided about it.
#[derive(Debug, Clone)]
pub struct PreparedMemory {
    pub memory: NewMemory,
    /// Hex SHA-256 of the normalised content.
    pub content_hash: String,
    /// The vector and the id of the model that made it.
    pub embedding: Option<Embedding>,
    /// How long the memory lives from its ingestion (the retention policy's
    /// duration for its retention); `None` is forever.
    pub lifetime: Option<chrono::Duration>,
    /// Semantic: where the fact came from (the route and key that wrote it).
    pub source: crate::domain::facts::Source,
    /// Semantic: the predicate holds several values, so the object is part
    /// of the fact's slot (`domain::facts`).
    pub multi_valued: bool,
    /// A copy shared by another agent: where it came from.
    pub provenance: Option<crate::domain::share::Provenance>,
    /// Semantic, written by consolidation: current facts of the same subject
    /// and predicate that this one nearly repeats
    /// (`domain::consolidate::near_duplicates`); the write keeps one of them.
    pub near_duplicates: Vec<Uuid>,
}

impl PreparedMemory {
    /// A memory written by an agent through the memory routes, living as
    /// long as its retention's default duration, single-valued.
    pub fn new(memory: NewMemory, embedding: Option<Embedding>) -> PreparedMemory {
        PreparedMemory {
            content_hash: crate::domain::content::content_hash(&memory.content),
            lifetime: crate::domain::retention::RetentionPolicy::default().duration(memory.retention),
            memory,
            embedding,
            source: crate::domain::facts::Source::Agent,
            multi_valued: false,
            provenance: None,
            near_duplicates: Vec::new(),
        }
    }
}

/// A persistent memory as stored, with what `Memory` leaves out: the content
/// hash, a skill's reward count and (when asked for) the vector. The unit of
/// export and import, which copy rows as they are, without the write rules.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredMemory {
    pub memory: Memory,
    /// Hex SHA-256 of the normalised content.
    pub content_hash: String,
    /// Procedural only: how many rewards `avg_reward` is the mean of.
    pub reward_count: Option<i32>,
    pub embedding: Option<Embedding>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Embedding {
    pub model: String,
    pub vector: Vec<f32>,
}

/// A working-memory entry of a committed batch, from the outbox.
#[derive(Debug, Clone)]
pub struct Staged {
    pub tenant: String,
    pub memory: Memory,
}

/// Outbox rows (tenant, entry JSON) as `Staged`.
fn parse_staged(rows: Vec<(String, String)>) -> StoreResult<Vec<Staged>> {
    rows.into_iter()
        .map(|(tenant, entry)| {
            let memory = serde_json::from_str(&entry).map_err(|e| StoreError::Internal(e.into()))?;
            Ok(Staged { tenant, memory })
        })
        .collect()
}

/// A skill whose cached copy must go, from `skill_evictions`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StagedEviction {
    pub eviction_id: Uuid,
    pub tenant_id: String,
    pub id: Uuid,
}

/// An `Idempotency-Key` and the hash of the request body it came with.
#[derive(Debug, Clone)]
pub struct IdempotencyKey {
    pub key: String,
    pub request_hash: String,
}

/// A response remembered for an idempotency key.
#[derive(Debug, Clone)]
pub struct StoredResponse {
    pub request_hash: String,
    pub status: u16,
    pub body: Value,
}

pub enum WriteOutcome {
    /// The memories were written (or deduplicated onto existing ones).
    Written(Vec<WrittenMemory>),
    /// A concurrent request with the same idempotency key won; this is its response.
    Replayed(StoredResponse),
}

/// Renders the response body remembered with an idempotency key, from the
/// persistent results of the write (in request order).
pub type RenderResponse<'a> = &'a (dyn Fn(&[WrittenMemory]) -> Value + Send + Sync);

/// Keyset position in a listing ordered by (created_at, id), newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub created_at: DateTime<Utc>,
    pub id: Uuid,
}

#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub agent_id: Option<String>,
    pub user_id: Option<String>,
    pub session_id: Option<String>,
    /// Empty means every tier.
    pub tiers: Vec<Tier>,
    pub created_after: Option<DateTime<Utc>>,
    pub created_before: Option<DateTime<Utc>>,
    /// `metadata.KEY=VALUE` equality filters (the value compared as text).
    pub metadata: Vec<(String, String)>,
    pub after: Option<Cursor>,
    pub limit: usize,
    /// Also list facts a newer fact superseded.
    pub include_superseded: bool,
    /// What was known at this instant (as `SearchQuery::as_of`): rows
    /// ingested by then, facts valid then, never a candidate.
    pub as_of: Option<DateTime<Utc>>,
    /// Of facts, those that held at this time (as `SearchQuery::valid_at`);
    /// overrides `include_superseded`. Judged by the stores: `matches` does
    /// not apply it.
    pub valid_at: Option<DateTime<Utc>>,
}

impl ListFilter {
    pub fn wants(&self, tier: Tier) -> bool {
        self.tiers.is_empty() || self.tiers.contains(&tier)
    }

    /// Whether a memory passes every filter (used for sources that cannot
    /// filter themselves, and by tests).
    pub fn matches(&self, m: &Memory) -> bool {
        self.wants(m.tier)
            && self.agent_id.as_ref().is_none_or(|a| *a == m.agent_id)
            && self.user_id.as_ref().is_none_or(|u| Some(u) == m.user_id.as_ref())
            && self.session_id.as_ref().is_none_or(|s| Some(s) == m.session_id.as_ref())
            && self.created_after.is_none_or(|t| m.created_at >= t)
            && self.created_before.is_none_or(|t| m.created_at < t)
            && self
                .as_of
                .is_none_or(|t| m.created_at <= t && m.contested_by.is_none() && m.valid_until.is_none_or(|u| u > t))
            && self.after.is_none_or(|c| (m.created_at, m.id) < (c.created_at, c.id))
            && self.metadata.iter().all(|(k, v)| match m.metadata.get(k) {
                Some(Value::String(s)) => s == v,
                Some(Value::Null) | None => false,
                Some(other) => serde_json::to_string(other).is_ok_and(|s| s == *v),
            })
    }
}

/// A recall request as the store sees it: one agent, optional narrowing, and
/// the query as text and (when an embedder is configured) as a vector.
#[derive(Debug, Clone)]
pub struct SearchQuery {
    pub agent_id: String,
    pub user_id: Option<String>,
    /// Persistent tiers to search.
    pub tiers: Vec<Tier>,
    pub text: String,
    pub vector: Option<Embedding>,
    /// `metadata.KEY` equals VALUE (JSON equality).
    pub metadata: Vec<(String, Value)>,
    /// Bounds on `occurred_at`.
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    /// Candidates each leg returns per tier.
    pub per_leg: usize,
    /// Semantic: also facts kept as candidates (`contested_by` set).
    pub include_candidates: bool,
    /// What the agent knew at this time: rows ingested (`created_at`) by
    /// then; of facts, those valid then (`valid_until` unset or later) and
    /// never a candidate. Expiry is still judged at the search's `now`.
    pub as_of: Option<DateTime<Utc>>,
    /// Of facts, those that held in the world at this time: from their
    /// `valid_from` until the `valid_from` of the fact that superseded them
    /// (one known by `as_of`, when given), else until they were superseded
    /// (`valid_until`, unset or after `as_of` meaning still open); never a
    /// candidate. Other tiers are not narrowed.
    pub valid_at: Option<DateTime<Utc>>,
}

/// The query vector of a search, still being computed when it starts.
pub type PendingVector = BoxFuture<'static, Option<Embedding>>;

/// One candidate: the memory and what each leg said about it.
#[derive(Debug, Clone)]
pub struct Hit {
    pub memory: Memory,
    /// Cosine similarity to the query vector.
    pub similarity: Option<f64>,
    /// Full-text rank (ts_rank), unnormalised.
    pub text_rank: Option<f64>,
    /// The stored vector, for near-duplicate detection.
    pub vector: Option<Vec<f32>>,
}

/// A memory written next to a search candidate (`Store::neighbours`).
#[derive(Debug, Clone)]
pub struct Adjacent {
    /// The candidate it is next to.
    pub anchor: Uuid,
    pub id: Uuid,
    /// None when the caller knew it already.
    pub hit: Option<Hit>,
}

#[derive(Debug, Clone, Default)]
pub struct SearchHits {
    pub hits: Vec<Hit>,
    /// Whether the vector leg ran (a query vector was given).
    pub vector_leg: bool,
    /// Whether the full-text leg ran (the query had searchable words).
    pub text_leg: bool,
    pub vector_ms: f64,
    pub text_ms: f64,
}

/// The persistent tiers: episodic, semantic and procedural.
#[async_trait]
pub trait MemoryStore: Send + Sync {
    /// Whether the backend answers.
    async fn ping(&self) -> StoreResult<()>;

    /// The response remembered for an idempotency key, if it is still fresh.
    async fn idempotent_response(
        &self,
        tenant: &str,
        key: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<StoredResponse>>;

    /// Opens a write transaction (`write::WriteTx`): the primitives every
    /// write path is built from.
    async fn begin(&self) -> StoreResult<Box<dyn write::WriteTx>>;

    /// Writes the memories in one transaction (all or nothing), with their
    /// dedup, contradiction and upsert rules (`write::write_batch`), and
    /// remembers the response under the idempotency key in the same
    /// transaction.
    async fn write(
        &self,
        tenant: &str,
        items: &[PreparedMemory],
        idempotency: Option<&IdempotencyKey>,
        render: RenderResponse<'_>,
        now: DateTime<Utc>,
    ) -> StoreResult<WriteOutcome> {
        self.write_staging(tenant, items, &[], idempotency, render, now).await
    }

    /// `write`, with the batch's working-memory entries recorded in the
    /// outbox in the same transaction (written to working memory after the
    /// commit by the caller, or later from the outbox).
    async fn write_staging(
        &self,
        tenant: &str,
        items: &[PreparedMemory],
        working: &[Memory],
        idempotency: Option<&IdempotencyKey>,
        render: RenderResponse<'_>,
        now: DateTime<Utc>,
    ) -> StoreResult<WriteOutcome> {
        write::write_batch(self.begin().await?, tenant, items, working, idempotency, render, now).await
    }

    /// Working-memory entries still in the outbox, oldest first, at most
    /// `limit`: those of one tenant's idempotency key when `key` is given,
    /// else those of any tenant staged at or before `staged_before`.
    async fn staged_working(
        &self,
        key: Option<(&str, &str)>,
        staged_before: DateTime<Utc>,
        limit: usize,
    ) -> StoreResult<Vec<Staged>>;

    /// Takes entries out of the outbox (written to working memory, or deleted).
    async fn unstage_working(&self, tenant: &str, ids: &[Uuid]) -> StoreResult<()>;

    /// Skills whose cached copy must go (`WriteTx::stage_eviction`), oldest
    /// first, at most `limit`, of any tenant.
    async fn staged_evictions(&self, limit: usize) -> StoreResult<Vec<StagedEviction>>;

    /// Takes these rows (by `eviction_id`) out once their skills are evicted.
    async fn unstage_evictions(&self, eviction_ids: &[Uuid]) -> StoreResult<()>;

    /// A live (not expired) memory by id.
    async fn get(&self, tenant: &str, id: Uuid, now: DateTime<Utc>) -> StoreResult<Memory>;

    /// `get`, as the primary holds it now: for reads that a write is made
    /// from (a share's copy). `get` may answer from a read replica, which
    /// can lag on changes; without one the two are the same.
    async fn get_current(&self, tenant: &str, id: Uuid, now: DateTime<Utc>) -> StoreResult<Memory> {
        self.get(tenant, id, now).await
    }

    /// Up to `filter.limit + 1` live memories, newest first.
    async fn list(&self, tenant: &str, filter: &ListFilter, now: DateTime<Utc>) -> StoreResult<Vec<Memory>>;

    /// Applies a patch; `embedding` is the new vector when content changed.
    async fn update(
        &self,
        tenant: &str,
        id: Uuid,
        patch: &MemoryPatch,
        embedding: Option<&Embedding>,
        now: DateTime<Utc>,
    ) -> StoreResult<Memory> {
        write::update(self.begin().await?, tenant, id, patch, embedding, now).await
    }

    /// Deletes a memory for good; returns its tier.
    async fn delete(&self, tenant: &str, id: Uuid, now: DateTime<Utc>) -> StoreResult<Tier> {
        write::delete(self.begin().await?, tenant, id, now).await
    }

    /// A fact's history, oldest first: the chain of facts it superseded and
    /// that superseded it, and the candidates that contested any of them.
    async fn history(&self, tenant: &str, id: Uuid, now: DateTime<Utc>) -> StoreResult<Vec<Memory>>;

    /// Candidates for a query from the vector and full-text legs, run
    /// concurrently: live memories only, valid facts only.
    async fn search(&self, tenant: &str, query: &SearchQuery, now: DateTime<Utc>) -> StoreResult<SearchHits> {
        let vector = query.vector.clone();
        self.search_embedding(tenant, query, Box::pin(async move { vector }), now).await
    }

    /// `search` started before the query vector is known: `query.vector` is
    /// not read, the vector comes from `vector` (`None`: no vector leg). A
    /// backend may run the work that needs no vector (the full-text ranking)
    /// while the query is being embedded.
    async fn search_embedding(
        &self,
        tenant: &str,
        query: &SearchQuery,
        vector: PendingVector,
        now: DateTime<Utc>,
    ) -> StoreResult<SearchHits>;

    /// The episodic memories the same agent wrote just before and just after
    /// each of `anchors` (order `(created_at, id)`) that pass the query's
    /// filters, each scored on both legs like a search hit (`text_rank` 0
    /// when it matches no query word). A backend may leave out the hit of a
    /// neighbour in `known` (the caller has it already).
    async fn neighbours(
        &self,
        tenant: &str,
        query: &SearchQuery,
        anchors: &[Uuid],
        known: &HashSet<Uuid>,
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<Adjacent>>;

    /// Counts one access of each `(tier, id)` at `now`, unless its last counted
    /// access is later than `counted_after`; called off the request path.
    async fn record_access(
        &self,
        tenant: &str,
        hits: &[(Tier, Uuid)],
        now: DateTime<Utc>,
        counted_after: DateTime<Utc>,
    ) -> StoreResult<()>;
}

/// Working memory: per (tenant, agent, session) ordered entries with a TTL.
#[async_trait]
pub trait WorkingMemory: Send + Sync {
    async fn ping(&self) -> StoreResult<()>;
    /// Fails at once with `Unavailable` while working memory is known to be
    /// down (Redis's circuit breaker is open); asks nothing.
    fn available(&self) -> StoreResult<()> {
        Ok(())
    }
    /// Appends entries to their sessions.
    async fn append(&self, tenant: &str, items: &[Memory], now: DateTime<Utc>) -> StoreResult<()>;
    /// Removes entries (undo of a failed batch, or a delete).
    async fn remove(&self, tenant: &str, items: &[Memory]) -> StoreResult<()>;
    async fn get(&self, tenant: &str, id: Uuid) -> StoreResult<Option<Memory>>;
    /// A session's live entries, oldest first.
    async fn session(&self, tenant: &str, agent_id: &str, session_id: &str) -> StoreResult<Vec<Memory>>;
    /// Every live entry of a tenant, each session oldest first.
    async fn entries(&self, tenant: &str) -> StoreResult<Vec<Memory>>;
    /// Rewrites an entry in place (after a patch), with its new expiry.
    async fn replace(&self, tenant: &str, memory: &Memory, now: DateTime<Utc>) -> StoreResult<()>;
}

/// A cache of hot procedural skills in front of the persistent store.
#[async_trait]
pub trait SkillCache: Send + Sync {
    async fn get(&self, tenant: &str, id: Uuid) -> StoreResult<Option<Memory>>;
    async fn put(&self, tenant: &str, memory: &Memory) -> StoreResult<()>;
    async fn evict(&self, tenant: &str, id: Uuid) -> StoreResult<()>;
}

/// Upkeep of a backend, run by the background jobs and at start and shutdown.
#[async_trait]
pub trait Maintenance: Send + Sync {
    /// Prepares what searching with an embedding model needs (Postgres: the
    /// model's HNSW indexes; the embedded vector index needs nothing).
    async fn prepare_model(&self, model: &str, dimensions: usize) -> anyhow::Result<()>;

    /// Rows whose vector is missing or of another model than `model`.
    async fn reembed_pending(&self, model: &str) -> StoreResult<i64>;

    /// Re-embeds up to `batch` rows of `tier` with `embedder`; returns how many moved.
    async fn reembed_batch(
        &self,
        tier: Tier,
        embedder: &dyn crate::embed::Embedder,
        batch: usize,
        now: DateTime<Utc>,
    ) -> anyhow::Result<usize>;

    /// Deletes idempotency keys past their time to live; returns how many.
    async fn forget_idempotency_keys(&self, now: DateTime<Utc>) -> anyhow::Result<u64>;

    /// Moves working memory kept in an earlier version's layout into the
    /// current one; returns how many entries moved (Redis; the embedded
    /// working-memory table has one layout).
    async fn move_working_layout(&self, now: DateTime<Utc>) -> anyhow::Result<u64>;

    /// Closes connections (after the server stopped).
    async fn close(&self);
}

/// A tenant's rows copied as they are, for `engram export` and `engram import`.
#[async_trait]
pub trait Transfer: Send + Sync {
    /// Up to `limit` live memories of one persistent tier, superseded facts
    /// included, in (created_at, id) order after `after`; with their vectors
    /// when `vectors` is set.
    async fn export_page(
        &self,
        tenant: &str,
        tier: Tier,
        after: Option<Cursor>,
        limit: usize,
        vectors: bool,
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<TransferRow>>;

    /// Inserts persistent memories exactly as given, in one transaction;
    /// a memory whose id the tenant already has is left alone. Returns, per
    /// memory, whether it was inserted.
    async fn import_batch(&self, tenant: &str, rows: &[TransferRow]) -> anyhow::Result<Vec<bool>>;

    /// How many rows `export_page` will give for one tier (for progress).
    async fn export_count(&self, tenant: &str, tier: Tier, now: DateTime<Utc>) -> StoreResult<u64>;

    /// Every live working-memory entry of a tenant, each session oldest first.
    async fn working_entries(&self, tenant: &str) -> StoreResult<Vec<Memory>>;
}

/// A persistent row as export and import move it: the stored memory and
/// what only the store keeps of it.
#[derive(Debug, Clone)]
pub struct TransferRow {
    pub stored: StoredMemory,
    /// Episodic: when consolidation took it, so that an imported episode is
    /// not consolidated a second time.
    pub consolidated_at: Option<DateTime<Utc>>,
}

/// A memory a sweep deleted, or would delete.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Doomed {
    pub tenant: String,
    pub id: Uuid,
}

/// Where a decay listing continues: the last candidate's (tenant, id).
pub type SweepCursor = (String, Uuid);

/// The right to sweep, held until dropped (on Postgres, an advisory lock
/// across replicas on a connection of its own, released when it closes).
pub struct SweepLease {
    _held: Box<dyn Send>,
}

impl SweepLease {
    pub fn holding(held: impl Send + 'static) -> SweepLease {
        SweepLease { _held: Box::new(held) }
    }
}

/// Deleting what retention no longer keeps, from every store a memory lives
/// in (rows, in-process indexes, working-memory lists). Primitives only:
/// which memories decay is decided by `domain::retention`, the order of
/// work by `jobs::retention`. Evicting cached skills is the caller's (the
/// `SkillCache` is its own capability).
#[async_trait]
pub trait Sweep: Send + Sync {
    /// The right to sweep; `None` while another sweeper holds it.
    async fn try_begin(&self) -> StoreResult<Option<SweepLease>>;

    /// Deletes up to `limit` memories of `tier` (any tenant) whose
    /// `expires_at` is at or before `now`, as one transaction, and returns them.
    async fn delete_expired(&self, tier: Tier, now: DateTime<Utc>, limit: usize) -> StoreResult<Vec<Doomed>>;

    /// How many of `tenant`'s memories of `tier` are expired at `now` and not
    /// yet deleted, and the ids of up to `limit` of them (soonest expired first).
    async fn expired(
        &self,
        tenant: &str,
        tier: Tier,
        now: DateTime<Utc>,
        limit: usize,
    ) -> StoreResult<(u64, Vec<Uuid>)>;

    /// Memories expired at `now` and not yet deleted, per tier, across
    /// tenants (a tier the backend cannot count cheaply is left out).
    async fn expired_backlog(&self, now: DateTime<Utc>) -> StoreResult<Vec<(Tier, u64)>>;

    /// Up to `limit` live memories of `tier` that `rule` might forget
    /// (importance below its bound, not permanent, ingested long enough
    /// ago), of `tenant` when given, in a stable order after `after`.
    async fn decay_candidates(
        &self,
        tier: Tier,
        tenant: Option<&str>,
        rule: &DecayRule,
        after: Option<&SweepCursor>,
        limit: usize,
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<DecayCandidate>>;

    /// Deletes these memories of a persistent `tier` as one transaction;
    /// returns those that were still there.
    async fn delete(&self, tier: Tier, rows: &[Doomed]) -> StoreResult<Vec<Doomed>>;

    /// Entries of the backend's in-process indexes, by index name (none on
    /// backends without such indexes).
    fn index_sizes(&self) -> Vec<(&'static str, usize)>;
}
