//! Erasure's storage: the transaction that accepts an erasure (claims and
//! hides the subject's rows, forgets remembered responses and outbox entries
//! that show them), and the primitives the erasure job deletes, purges and
//! verifies with. `accept` composes the primitives with the rules of
//! `domain::erasure`, once for every backend; and the audit log.
//!
//! Legal holds share the accepting transaction's primitives: placing a hold
//! and accepting an erasure of the same user lock that user first, so each
//! sees what the other committed (`place_hold`, `release_hold` and the check
//! in `accept`, written once for every backend; the rules are
//! `domain::holds`'s).
//!
//! Must not: decide what belongs to a subject (`domain::erasure` does).

use std::collections::{BTreeMap, HashSet};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::{Embedding, StoreError, StoreResult, SweepLease, corrupt};
use crate::domain::erasure::{self, AuditEntry, Counts, ErasureRecord, NewAuditEntry, Subject};
use crate::domain::holds::{self, Hold};
use crate::domain::{Memory, Tier};

/// A persistent row an erasure looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErasureRow {
    pub tier: Tier,
    pub id: Uuid,
    pub user_id: Option<String>,
}

/// A fact linked to a memory: derived from it, or an older version it superseded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Linked {
    pub fact: ErasureRow,
    /// The memory it is linked to.
    pub to: Uuid,
}

/// The transaction accepting an erasure. Dropping it without `commit`
/// rolls it back.
#[async_trait]
pub trait ErasureTx: Send {
    /// The persistent rows of a user (of one agent when given) ingested at
    /// or before `before`, expired or not.
    async fn user_rows(
        &mut self,
        tenant: &str,
        user_id: &str,
        agent_id: Option<&str>,
        before: DateTime<Utc>,
    ) -> StoreResult<Vec<ErasureRow>>;

    /// The persistent rows of these ids that exist.
    async fn rows_by_id(&mut self, tenant: &str, ids: &[Uuid]) -> StoreResult<Vec<ErasureRow>>;

    /// Locks these episodes' rows until the transaction ends, in id order.
    /// A consolidation locks the episodes it marks, in the same order, until
    /// it commits their summary: taking the locks waits for that commit, so
    /// the summary is found. A backend that runs one write transaction at a
    /// time has nothing to lock.
    async fn lock_episodes(&mut self, tenant: &str, ids: &[Uuid]) -> StoreResult<()>;

    /// Facts derived from these memories or superseded by them.
    async fn linked_facts(&mut self, tenant: &str, ids: &[Uuid]) -> StoreResult<Vec<Linked>>;

    /// Copies shared from these memories (`provenance.source_memory_id`),
    /// of every tier.
    async fn copies(&mut self, tenant: &str, ids: &[Uuid]) -> StoreResult<Vec<Linked>>;

    /// Summaries consolidation made from these episodes
    /// (`metadata.consolidation.source_episode_ids`).
    async fn summaries(&mut self, tenant: &str, ids: &[Uuid]) -> StoreResult<Vec<Linked>>;

    /// Claims rows for the erasure `erasure` and hides them from every read
    /// from the commit on: SQLite moves their expiry to `at` (the worker
    /// deletes them with their in-process index entries), Postgres deletes
    /// them at once. Returns those no other erasure had claimed.
    async fn claim(
        &mut self,
        tenant: &str,
        erasure: Uuid,
        rows: &[ErasureRow],
        at: DateTime<Utc>,
    ) -> StoreResult<Vec<ErasureRow>>;

    /// The tenant's remembered responses: (idempotency key, body).
    async fn responses(&mut self, tenant: &str) -> StoreResult<Vec<(String, Value)>>;

    async fn forget_responses(&mut self, tenant: &str, keys: &[String]) -> StoreResult<()>;

    /// The tenant's working-memory entries waiting in the outbox.
    async fn staged(&mut self, tenant: &str) -> StoreResult<Vec<Memory>>;

    async fn unstage(&mut self, tenant: &str, ids: &[Uuid]) -> StoreResult<()>;

    /// Stores a new erasure.
    async fn insert_erasure(&mut self, record: &ErasureRecord) -> StoreResult<()>;

    /// Serialises this transaction, until it ends, with every other that
    /// locks one of these users of the tenant (given sorted, so two
    /// transactions never wait for each other in a circle). Postgres takes
    /// a transaction-scoped advisory lock per (tenant, user); the embedded
    /// backend's single writer already serialises every write transaction.
    async fn lock_users(&mut self, tenant: &str, users: &[String]) -> StoreResult<()>;

    /// The active holds on any of these users.
    async fn active_holds(&mut self, tenant: &str, users: &[String]) -> StoreResult<Vec<Hold>>;

    /// Unfinished erasures that name this user or have claimed rows of it
    /// that are not deleted yet.
    async fn erasures_of_user(&mut self, tenant: &str, user_id: &str) -> StoreResult<Vec<Uuid>>;

    async fn insert_hold(&mut self, hold: &Hold) -> StoreResult<()>;

    /// A hold of the tenant, locked until the transaction ends.
    async fn hold_for_update(&mut self, tenant: &str, id: Uuid) -> StoreResult<Option<Hold>>;

    /// Saves a hold's release (`released_by`, `released_at`).
    async fn save_release(&mut self, hold: &Hold) -> StoreResult<()>;

    /// Appends to the tenant's audit chain in this transaction, so the
    /// entry and the change it records commit together.
    async fn append_audit(&mut self, entry: &NewAuditEntry) -> StoreResult<AuditEntry>;

    async fn commit(self: Box<Self>) -> StoreResult<()>;
}

/// Erasures and the audit log of a backend.
#[async_trait]
pub trait Erasures: Send + Sync {
    async fn begin_erasure(&self) -> StoreResult<Box<dyn ErasureTx>>;

    async fn erasure(&self, tenant: &str, id: Uuid) -> StoreResult<Option<ErasureRecord>>;

    /// Erasures not finished, oldest first.
    async fn unfinished(&self, limit: usize) -> StoreResult<Vec<ErasureRecord>>;

    /// Saves an erasure's state, attempts, error, receipt and times.
    async fn update_erasure(&self, record: &ErasureRecord) -> StoreResult<()>;

    /// The rows an erasure claimed.
    async fn claimed(&self, tenant: &str, erasure: Uuid) -> StoreResult<Vec<(Tier, Uuid)>>;

    /// Drops an erasure's claims (once it is finished).
    async fn release(&self, tenant: &str, erasure: Uuid) -> StoreResult<()>;

    /// The right to work on erasures; `None` while another worker holds it
    /// (on Postgres, across replicas).
    async fn try_lease(&self) -> StoreResult<Option<SweepLease>>;

    /// A few vectors of the erasure's rows, kept when they were claimed, for
    /// the verification's nearest-neighbour queries after they are deleted
    /// (none where the verification asks the vector index for the ids).
    async fn sample_vectors(&self, tenant: &str, erasure: Uuid) -> StoreResult<Vec<(Tier, Embedding)>>;

    /// Makes deleted bytes go (Postgres: VACUUM; SQLite: the WAL checkpointed
    /// and truncated, freed pages already zeroed by secure_delete); returns
    /// what was done, per store.
    async fn purge(&self) -> StoreResult<BTreeMap<String, String>>;

    /// Looks for the subject in every store with queries of its own (not the
    /// deleting code's): per store and check, how many records it found.
    async fn verify(
        &self,
        record: &ErasureRecord,
        claimed: &[(Tier, Uuid)],
        samples: &[(Tier, Embedding)],
    ) -> StoreResult<Counts>;

    /// Appends to the tenant's audit chain; returns the entry as stored.
    async fn append_audit(&self, entry: &NewAuditEntry) -> StoreResult<AuditEntry>;

    /// Audit entries in `seq` order after `after`, of one tenant or of all.
    async fn audit_page(&self, tenant: Option<&str>, after: i64, limit: usize) -> StoreResult<Vec<AuditEntry>>;

    /// A hold of the tenant, active or released.
    async fn hold(&self, tenant: &str, id: Uuid) -> StoreResult<Option<Hold>>;

    /// The tenant's active holds (on one user when given), oldest first.
    async fn active_holds(&self, tenant: &str, user_id: Option<&str>) -> StoreResult<Vec<Hold>>;
}

/// An erasure's stored columns, as a backend read them (times already in
/// its own encoding's place), for `erasure_record`.
pub struct ErasureColumns {
    pub id: Uuid,
    pub tenant: String,
    pub selector: String,
    pub requested_by: String,
    pub state: String,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub receipt: Option<String>,
    pub requested_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

/// The erasure a row stores; a selector, state or receipt engram cannot
/// read is a corrupt row.
pub fn erasure_record(c: ErasureColumns) -> StoreResult<ErasureRecord> {
    Ok(ErasureRecord {
        id: c.id,
        tenant: c.tenant,
        subject: Subject::from_json(&c.selector).ok_or_else(|| corrupt("erasure selector", &c.selector))?,
        requested_by: c.requested_by,
        state: erasure::ErasureState::parse(&c.state).ok_or_else(|| corrupt("erasure state", &c.state))?,
        attempts: c.attempts,
        last_error: c.last_error,
        receipt: match c.receipt {
            Some(text) => serde_json::from_str(&text).map_err(|_| corrupt("erasure receipt", &text))?,
            None => erasure::Receipt::default(),
        },
        requested_at: c.requested_at,
        completed_at: c.completed_at,
        updated_at: c.updated_at,
    })
}

/// A receipt as stored: JSON text.
pub fn receipt_json(r: &erasure::Receipt) -> StoreResult<String> {
    serde_json::to_string(r).map_err(|e| super::StoreError::Internal(e.into()))
}

/// An erasure as accepted.
#[derive(Debug, Clone)]
pub struct Accepted {
    /// As stored; its receipt counts the remembered responses and outbox
    /// entries forgotten on acceptance.
    pub record: ErasureRecord,
    /// The skills claimed (for the skill cache).
    pub skills: Vec<Uuid>,
}

/// Accepts an erasure in one transaction: claims and hides the subject's
/// rows with everything linked to them (`domain::erasure`), forgets
/// remembered responses and outbox entries that show them, and stores the
/// erasure. Once this returns, no read of the database returns the claimed
/// rows. `store` names the database in the receipt.
pub async fn accept(mut tx: Box<dyn ErasureTx>, mut record: ErasureRecord, store: &str) -> StoreResult<Accepted> {
    let tenant = record.tenant.clone();
    let tenant = tenant.as_str();
    let mut rows = match &record.subject {
        Subject::User { user_id, agent_id } => {
            // Locked before the rows are read: a consolidation writing a
            // summary of this user's episodes holds the same lock, so it
            // either commits before these reads (and its summary is found
            // with the user's rows) or waits and finds its sources gone.
            tx.lock_users(tenant, std::slice::from_ref(user_id)).await?;
            tx.user_rows(tenant, user_id, agent_id.as_deref(), record.requested_at).await?
        }
        Subject::Memories { memory_ids } => {
            // A consolidation marks its episodes and writes their summary in
            // one transaction, holding its users' locks and the episodes'
            // rows. Taking the same locks, in the same order, before reading
            // the rows whose links are followed means that a summary being
            // written now is committed, and found, before they are read;
            // read first, it would be missed and outlive its erased source.
            let mut users: Vec<String> =
                tx.rows_by_id(tenant, memory_ids).await?.into_iter().filter_map(|r| r.user_id).collect();
            users.sort_unstable();
            users.dedup();
            tx.lock_users(tenant, &users).await?;
            tx.lock_episodes(tenant, memory_ids).await?;
            tx.rows_by_id(tenant, memory_ids).await?
        }
    };
    let mut seen: HashSet<Uuid> = rows.iter().map(|r| r.id).collect();
    let mut frontier: Vec<Uuid> = seen.iter().copied().collect();
    while !frontier.is_empty() {
        let users: BTreeMap<Uuid, Option<String>> = rows.iter().map(|r| (r.id, r.user_id.clone())).collect();
        let mut next = Vec::new();
        for link in tx.linked_facts(tenant, &frontier).await? {
            let erased_user = users.get(&link.to).cloned().flatten();
            if !seen.contains(&link.fact.id)
                && erasure::follows_link(link.fact.user_id.as_deref(), erased_user.as_deref())
            {
                seen.insert(link.fact.id);
                next.push(link.fact.id);
                rows.push(link.fact);
            }
        }
        // A shared copy is the same data in another agent's memory, and a
        // consolidated summary holds its episodes' sentences: each goes with
        // its source, whoever it now belongs to.
        let mut derived = tx.copies(tenant, &frontier).await?;
        derived.extend(tx.summaries(tenant, &frontier).await?);
        for copy in derived {
            if seen.insert(copy.fact.id) {
                next.push(copy.fact.id);
                rows.push(copy.fact);
            }
        }
        frontier = next;
    }
    // Under legal hold: refused before anything is claimed. The users are
    // locked first, so a hold committed before this check is seen, and a
    // hold placed after it waits for this transaction and then finds the
    // erasure (and is refused in turn).
    let subject_user = match &record.subject {
        Subject::User { user_id, .. } => Some(user_id.as_str()),
        Subject::Memories { .. } => None,
    };
    let users = holds::users_touched(subject_user, rows.iter().map(|r| r.user_id.as_deref()));
    tx.lock_users(tenant, &users).await?;
    let held = tx.active_holds(tenant, &users).await?;
    if !held.is_empty() {
        return Err(StoreError::Held(held));
    }
    // Expired from a microsecond before the request (which is rounded up
    // to a whole microsecond), so a read at the request's own instant
    // already leaves the rows out.
    let hide_at = record.requested_at - chrono::Duration::microseconds(1);
    let claimed = tx.claim(tenant, record.id, &rows, hide_at).await?;
    let skills = claimed.iter().filter(|r| r.tier == Tier::Procedural).map(|r| r.id).collect();

    // Everything the subject had, claimed now or by an earlier erasure.
    let keys: Vec<String> = tx
        .responses(tenant)
        .await?
        .into_iter()
        .filter(|(_, body)| record.subject.in_response(body, &seen, record.requested_at))
        .map(|(key, _)| key)
        .collect();
    tx.forget_responses(tenant, &keys).await?;
    let staged: Vec<Uuid> = tx
        .staged(tenant)
        .await?
        .into_iter()
        .filter(|m| record.subject.covers(m, record.requested_at))
        .map(|m| m.id)
        .collect();
    tx.unstage(tenant, &staged).await?;
    let deleted = &mut record.receipt.deleted;
    erasure::Receipt::add(deleted, store, "idempotency_records", keys.len() as u64);
    erasure::Receipt::add(deleted, store, "working_outbox", staged.len() as u64);
    tx.insert_erasure(&record).await?;
    tx.commit().await?;
    Ok(Accepted { record, skills })
}

/// Places a hold, with its audit entry, in one transaction; refused while
/// an erasure of the user is unfinished (`domain::holds`). `audit` is the
/// entry to append, built by the caller from the hold.
pub async fn place_hold(mut tx: Box<dyn ErasureTx>, hold: &Hold, audit: &NewAuditEntry) -> StoreResult<AuditEntry> {
    tx.lock_users(&hold.tenant, std::slice::from_ref(&hold.user_id)).await?;
    let erasing = tx.erasures_of_user(&hold.tenant, &hold.user_id).await?;
    if !erasing.is_empty() {
        return Err(StoreError::Erasing(erasing));
    }
    tx.insert_hold(hold).await?;
    let entry = tx.append_audit(audit).await?;
    tx.commit().await?;
    Ok(entry)
}

/// Releases a hold, with its audit entry, in one transaction. `release`
/// turns the stored hold into the released one and its audit entry; a hold
/// already released is returned as it is, without an entry. `None`: the
/// tenant has no such hold.
pub async fn release_hold(
    mut tx: Box<dyn ErasureTx>,
    tenant: &str,
    id: Uuid,
    release: impl FnOnce(Hold) -> (Hold, NewAuditEntry) + Send,
) -> StoreResult<Option<Hold>> {
    let Some(stored) = tx.hold_for_update(tenant, id).await? else { return Ok(None) };
    if !stored.is_active() {
        return Ok(Some(stored));
    }
    let (released, audit) = release(stored);
    tx.save_release(&released).await?;
    tx.append_audit(&audit).await?;
    tx.commit().await?;
    Ok(Some(released))
}
