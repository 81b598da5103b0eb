//! The write path of the persistent tiers, written once for every backend.
//!
//! A backend opens a `WriteTx`: one transaction offering small primitive
//! operations (find facts by content hash, find a slot's current facts,
//! retire facts, find a skill, insert, update, delete, remember an
//! idempotent response). The functions here compose them with the domain's
//! decisions (`domain::rows` builds each row, `domain::facts` settles
//! contradictions), so dedup, supersede, candidates, the skill upsert and
//! patches mean the same on SQLite and Postgres.
//!
//! Must not: hold SQL, or decide anything a backend could decide differently.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::{
    Embedding, IdempotencyKey, PreparedMemory, RenderResponse, StoreError, StoreResult, StoredMemory, StoredResponse,
    WriteOutcome,
};
use crate::domain::consolidate::{SkillOutcomes, SourcePolicy};
use crate::domain::facts::{self, Claim, Verdict};
use crate::domain::rows::{SkillState, count_outcomes, new_row, upsert_skill};
use crate::domain::{Memory, MemoryPatch, Tier, WrittenMemory};

/// What an update does to the stored vector.
#[derive(Debug, Clone, Copy)]
pub enum VectorChange<'a> {
    /// The text did not change: keep the vector.
    Keep,
    /// The text changed: store this vector (none: the memory has none now).
    Set(Option<&'a Embedding>),
}

/// One write transaction of a backend. Dropping it without `commit` rolls
/// it back. Reads see the transaction's own writes.
#[async_trait]
pub trait WriteTx: Send {
    /// Holds each key until the transaction ends, so that writers deciding
    /// about the same fact slot or skill take turns (a backend that runs one
    /// write transaction at a time may do nothing).
    async fn lock(&mut self, keys: &[String]) -> StoreResult<()>;

    /// Takes an idempotency key unless a fresh one exists; then returns the
    /// response remembered with it. A concurrent holder of the key makes
    /// this wait until it commits or rolls back.
    async fn claim_key(
        &mut self,
        tenant: &str,
        key: &IdempotencyKey,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<StoredResponse>>;

    /// Remembers the response of a claimed key.
    async fn save_response(
        &mut self,
        tenant: &str,
        key: &str,
        status: u16,
        body: &Value,
        now: DateTime<Utc>,
    ) -> StoreResult<()>;

    /// The facts of one agent's namespace with this content hash that are
    /// current (valid) or candidates, expired ones included.
    async fn facts_by_hash(
        &mut self,
        tenant: &str,
        agent_id: &str,
        namespace: &str,
        content_hash: &str,
    ) -> StoreResult<Vec<Memory>>;

    /// The current (valid) facts of a slot, expired ones included; `object`
    /// given narrows the slot to facts with that object (`Some(None)`: none).
    async fn slot_facts(
        &mut self,
        tenant: &str,
        slot: &Slot<'_>,
        object: Option<Option<&str>>,
    ) -> StoreResult<Vec<Memory>>;

    /// Ends the validity of facts at `at`.
    async fn retire_facts(&mut self, tenant: &str, ids: &[Uuid], at: DateTime<Utc>) -> StoreResult<()>;

    /// The agent's skill of this name, expired or not, locked for update.
    async fn skill(&mut self, tenant: &str, agent_id: &str, skill_name: &str) -> StoreResult<Option<SkillState>>;

    /// A persistent memory by id, expired or not, locked for update, with
    /// its reward count (0 for other tiers than procedural).
    async fn row(&mut self, tenant: &str, id: Uuid) -> StoreResult<Option<(Memory, i32)>>;

    /// Stores a new row as given; returns it as stored.
    async fn insert(&mut self, tenant: &str, row: &StoredMemory) -> StoreResult<Memory>;

    /// Rewrites a stored row (found by id) with every field of `row`; the
    /// vector as `vector` says. Returns it as stored.
    async fn update(&mut self, tenant: &str, row: &StoredMemory, vector: VectorChange<'_>) -> StoreResult<Memory>;

    /// Deletes a row; returns its tier if it existed.
    async fn delete(&mut self, tenant: &str, id: Uuid) -> StoreResult<Option<Tier>>;

    /// Records working-memory entries of the batch in the outbox, with the
    /// batch's idempotency key: they commit with the batch and are written
    /// to working memory after it (`MemoryStore::staged_working`).
    async fn stage_working(
        &mut self,
        tenant: &str,
        key: Option<&str>,
        entries: &[Memory],
        now: DateTime<Utc>,
    ) -> StoreResult<()>;

    /// Records that the cached copy of skill `id` must go: committed with
    /// the write that changed or deleted the skill, evicted by the writer
    /// after the commit and again by the outbox job, which takes the row out
    /// (`MemoryStore::staged_evictions`).
    async fn stage_eviction(&mut self, tenant: &str, id: Uuid, now: DateTime<Utc>) -> StoreResult<()>;

    /// Marks episodes consolidated at `at`, first taking the locks an
    /// erasure of `users` takes (so the two never interleave); returns how
    /// many of `ids` were live, unconsolidated episodes (the caller rolls
    /// back unless that is all of them).
    async fn mark_consolidated(
        &mut self,
        tenant: &str,
        users: &[String],
        ids: &[Uuid],
        at: DateTime<Utc>,
    ) -> StoreResult<u64>;

    /// Commits. Once this is called, what the transaction did reaches every
    /// index and cache of the backend even if the caller is dropped.
    async fn commit(self: Box<Self>) -> StoreResult<()>;
}

/// The slot of a fact with subject and predicate (`domain::facts`).
#[derive(Debug, Clone, Copy)]
pub struct Slot<'a> {
    pub agent_id: &'a str,
    pub namespace: &'a str,
    pub subject: &'a str,
    pub predicate: &'a str,
}

/// The locks a batch needs, sorted and distinct so that two batches always
/// take shared keys in the same order. The unit separator keeps field
/// boundaries unambiguous (identifiers cannot contain control characters).
fn lock_keys(tenant: &str, items: &[PreparedMemory]) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for p in items {
        let m = &p.memory;
        match m.tier {
            Tier::Semantic => {
                let ns = m.namespace();
                keys.push(format!("fact\u{1f}{tenant}\u{1f}{}\u{1f}{ns}\u{1f}{}", m.agent_id, p.content_hash));
                if let (Some(s), Some(pr)) = (&m.subject, &m.predicate) {
                    keys.push(format!("slot\u{1f}{tenant}\u{1f}{}\u{1f}{ns}\u{1f}{s}\u{1f}{pr}", m.agent_id));
                }
            }
            Tier::Procedural => keys.push(skill_key(tenant, &m.agent_id, m.skill_name.as_deref().unwrap_or_default())),
            Tier::Episodic | Tier::Working => {}
        }
    }
    keys.sort_unstable();
    keys.dedup();
    keys
}

fn skill_key(tenant: &str, agent_id: &str, skill_name: &str) -> String {
    format!("skill\u{1f}{tenant}\u{1f}{agent_id}\u{1f}{skill_name}")
}

/// Writes a batch in one transaction, all or nothing, and remembers the
/// response under the idempotency key and the batch's working-memory
/// entries (`working`, for the outbox) in the same transaction.
pub async fn write_batch(
    mut tx: Box<dyn WriteTx>,
    tenant: &str,
    items: &[PreparedMemory],
    working: &[Memory],
    idempotency: Option<&IdempotencyKey>,
    render: RenderResponse<'_>,
    now: DateTime<Utc>,
) -> StoreResult<WriteOutcome> {
    if items.iter().any(|p| p.memory.tier == Tier::Working) {
        return Err(StoreError::Internal(anyhow::anyhow!("working memory sent to the persistent store")));
    }
    if let Some(key) = idempotency
        && let Some(previous) = tx.claim_key(tenant, key, now).await?
    {
        return Ok(WriteOutcome::Replayed(previous));
    }
    tx.lock(&lock_keys(tenant, items)).await?;
    let mut written = Vec::with_capacity(items.len());
    for p in items {
        written.push(write_one(tx.as_mut(), tenant, p, now).await?);
    }
    if !working.is_empty() {
        tx.stage_working(tenant, idempotency.map(|k| k.key.as_str()), working, now).await?;
    }
    if let Some(key) = idempotency {
        tx.save_response(tenant, &key.key, 201, &render(&written), now).await?;
    }
    tx.commit().await?;
    Ok(WriteOutcome::Written(written))
}

/// Writes what consolidation made from `sources` (summaries and facts, by
/// the ordinary rules) and marks the sources, and the summaries written,
/// consolidated, in one transaction: an episode is consolidated exactly
/// once, and a crash leaves either all of it or none. Sources that are
/// gone (erased, expired) or already consolidated since they were read
/// roll it all back (`StoreError::Conflict`); the run reads them again.
pub async fn write_consolidated(
    mut tx: Box<dyn WriteTx>,
    tenant: &str,
    items: &[PreparedMemory],
    group: &GroupEffects<'_>,
    now: DateTime<Utc>,
) -> StoreResult<Consolidated> {
    let sources = group.sources;
    let mut users: Vec<String> = items.iter().filter_map(|p| p.memory.user_id.clone()).collect();
    users.sort_unstable();
    users.dedup();
    let marked = tx.mark_consolidated(tenant, &users, sources, now).await?;
    if marked != sources.len() as u64 {
        return Err(StoreError::Conflict("episodes changed while they were consolidated".into()));
    }
    let mut keys = lock_keys(tenant, items);
    keys.extend(group.skills.iter().map(|s| skill_key(tenant, group.agent_id, &s.skill_name)));
    keys.sort_unstable();
    keys.dedup();
    tx.lock(&keys).await?;
    let mut out = Consolidated::default();
    for p in items {
        out.written.push(write_one(tx.as_mut(), tenant, p, now).await?);
    }
    // A summary is itself an episode: it is never consolidated again.
    let summaries: Vec<Uuid> = out
        .written
        .iter()
        .filter(|w| w.memory.tier == Tier::Episodic && !w.deduplicated)
        .map(|w| w.memory.id)
        .collect();
    tx.mark_consolidated(tenant, &[], &summaries, now).await?;

    // The skills the episodes used: their outcomes counted once, here.
    for o in group.skills {
        let Some(state) = tx.skill(tenant, group.agent_id, &o.skill_name).await? else { continue };
        if state.skill.is_expired(now) {
            continue;
        }
        let skill = count_outcomes(&state.skill, o.successes, o.failures, now);
        let row = StoredMemory {
            content_hash: crate::domain::content::content_hash(&skill.content),
            memory: skill,
            reward_count: Some(state.reward_count),
            embedding: None,
        };
        tx.stage_eviction(tenant, row.memory.id, now).await?;
        out.skills.push(tx.update(tenant, &row, VectorChange::Keep).await?.id);
    }

    // Sources a summary now covers go as the policy says.
    if !summaries.is_empty() {
        match group.policy {
            SourcePolicy::Keep => {}
            SourcePolicy::Delete => {
                for id in sources {
                    if tx.delete(tenant, *id).await?.is_some() {
                        out.sources_deleted += 1;
                    }
                }
            }
            SourcePolicy::Shorten(_) => {
                for id in sources {
                    let Some((mut episode, reward_count)) = tx.row(tenant, *id).await? else { continue };
                    let Some(expires_at) = group.policy.shortened(episode.expires_at, now) else { continue };
                    episode.expires_at = Some(expires_at);
                    let row = StoredMemory {
                        content_hash: crate::domain::content::content_hash(&episode.content),
                        memory: episode,
                        reward_count: Some(reward_count),
                        embedding: None,
                    };
                    tx.update(tenant, &row, VectorChange::Keep).await?;
                    out.sources_shortened += 1;
                }
            }
        }
    }
    tx.commit().await?;
    Ok(out)
}

/// What one consolidated group does beside writing its summary and facts.
#[derive(Debug, Clone)]
pub struct GroupEffects<'a> {
    pub agent_id: &'a str,
    /// The group's episodes, marked consolidated in the same transaction.
    pub sources: &'a [Uuid],
    /// What becomes of them once a summary covers them.
    pub policy: SourcePolicy,
    /// The outcomes they report for the agent's skills.
    pub skills: &'a [SkillOutcomes],
}

/// What writing a consolidated group did.
#[derive(Debug, Default)]
pub struct Consolidated {
    pub written: Vec<WrittenMemory>,
    /// Skills whose counters moved.
    pub skills: Vec<Uuid>,
    pub sources_deleted: u64,
    pub sources_shortened: u64,
}

fn stored(memory: Memory, p: &PreparedMemory, reward_count: i32) -> StoredMemory {
    StoredMemory {
        memory,
        content_hash: p.content_hash.clone(),
        reward_count: Some(reward_count),
        embedding: p.embedding.clone(),
    }
}

async fn write_one(
    tx: &mut dyn WriteTx,
    tenant: &str,
    p: &PreparedMemory,
    now: DateTime<Utc>,
) -> StoreResult<WrittenMemory> {
    let expires_at = p.lifetime.map(|d| now + d);
    let mut row = new_row(&p.memory, now, expires_at, p.source);
    row.provenance = p.provenance.clone();
    let memory = match p.memory.tier {
        Tier::Episodic => tx.insert(tenant, &stored(row, p, 0)).await?,
        Tier::Semantic => return write_fact(tx, tenant, p, row, now).await,
        Tier::Procedural => {
            let name = p.memory.skill_name.as_deref().unwrap_or_default();
            match tx.skill(tenant, &p.memory.agent_id, name).await? {
                // A shared skill never overwrites the target's skill of that
                // name (poisoning): the target keeps its own, reported as a
                // deduplicated share.
                Some(old) if !old.skill.is_expired(now) && p.provenance.is_some() => {
                    return Ok(WrittenMemory { memory: old.skill, deduplicated: true });
                }
                Some(old) if !old.skill.is_expired(now) => {
                    let next = upsert_skill(&old, &row, p.memory.reward);
                    let s = stored(next.skill, p, next.reward_count);
                    tx.stage_eviction(tenant, s.memory.id, now).await?;
                    tx.update(tenant, &s, VectorChange::Set(p.embedding.as_ref())).await?
                }
                expired => {
                    // A forgotten skill is not revived: its counters go with it.
                    if let Some(old) = expired {
                        tx.stage_eviction(tenant, old.skill.id, now).await?;
                        tx.delete(tenant, old.skill.id).await?;
                    }
                    let rewards = i32::from(p.memory.reward.is_some());
                    tx.insert(tenant, &stored(row, p, rewards)).await?
                }
            }
        }
        Tier::Working => unreachable!("refused by write_batch"),
    };
    Ok(WrittenMemory { memory, deduplicated: false })
}

fn claim_of(m: &Memory) -> Claim {
    Claim {
        source: m.source.unwrap_or(facts::Source::Agent),
        confidence: m.confidence.unwrap_or(crate::domain::rows::DEFAULT_CONFIDENCE),
        recorded_at: m.created_at,
    }
}

/// A fact: deduplicated onto the same live fact (or the same candidate, if
/// it would lose again), else contested against its slot's current facts.
async fn write_fact(
    tx: &mut dyn WriteTx,
    tenant: &str,
    p: &PreparedMemory,
    mut row: Memory,
    now: DateTime<Utc>,
) -> StoreResult<WrittenMemory> {
    let m = &p.memory;
    let namespace = m.namespace();
    let mut candidate = None;
    for same in tx.facts_by_hash(tenant, &m.agent_id, &namespace, &p.content_hash).await? {
        if same.is_expired(now) {
            // Forgotten but not yet swept: it must not swallow the new fact.
            if same.valid_until.is_none() {
                tx.delete(tenant, same.id).await?;
            }
        } else if same.contested_by.is_some() {
            candidate = Some(same);
        } else {
            return Ok(WrittenMemory { memory: same, deduplicated: true });
        }
    }

    if let (Some(subject), Some(predicate)) = (&m.subject, &m.predicate) {
        let slot = Slot { agent_id: &m.agent_id, namespace: &namespace, subject, predicate };
        let object = p.multi_valued.then_some(m.object.as_deref());
        let mut facts = tx.slot_facts(tenant, &slot, object).await?;
        if p.multi_valued && !p.near_duplicates.is_empty() {
            // Facts of other objects that this one nearly repeats (found by
            // consolidation) share its slot: one of them is kept.
            for f in tx.slot_facts(tenant, &slot, None).await? {
                if p.near_duplicates.contains(&f.id) && !facts.iter().any(|x| x.id == f.id) {
                    facts.push(f);
                }
            }
        }
        let current: Vec<(Uuid, Claim)> =
            facts.iter().filter(|f| !f.is_expired(now)).map(|f| (f.id, claim_of(f))).collect();
        match facts::contest(&claim_of(&row), &current) {
            Verdict::Takes { retire, supersedes } => {
                tx.retire_facts(tenant, &retire, now).await?;
                row.supersedes = supersedes;
            }
            Verdict::Loses { contested_by } => {
                if let Some(c) = candidate {
                    return Ok(WrittenMemory { memory: c, deduplicated: true });
                }
                // Stored, never valid: an empty validity interval.
                row.valid_until = row.valid_from;
                row.contested_by = Some(contested_by);
            }
        }
    }
    let memory = tx.insert(tenant, &stored(row, p, 0)).await?;
    Ok(WrittenMemory { memory, deduplicated: false })
}

/// Applies a patch to a live persistent memory; `embedding` is the new
/// vector when the content changed.
pub async fn update(
    mut tx: Box<dyn WriteTx>,
    tenant: &str,
    id: Uuid,
    patch: &MemoryPatch,
    embedding: Option<&Embedding>,
    now: DateTime<Utc>,
) -> StoreResult<Memory> {
    let (mut next, reward_count) =
        tx.row(tenant, id).await?.filter(|(m, _)| !m.is_expired(now)).ok_or(StoreError::NotFound)?;
    patch.apply(&mut next, now);
    let content_hash = crate::domain::content::content_hash(&next.content);
    let row =
        StoredMemory { memory: next, content_hash, reward_count: Some(reward_count), embedding: embedding.cloned() };
    let vector = if patch.content.is_some() { VectorChange::Set(embedding) } else { VectorChange::Keep };
    if row.memory.tier == Tier::Procedural {
        tx.stage_eviction(tenant, id, now).await?;
    }
    let memory = tx.update(tenant, &row, vector).await?;
    tx.commit().await?;
    Ok(memory)
}

/// Deletes a persistent memory for good; returns its tier.
pub async fn delete(mut tx: Box<dyn WriteTx>, tenant: &str, id: Uuid, now: DateTime<Utc>) -> StoreResult<Tier> {
    let tier = tx.delete(tenant, id).await?.ok_or(StoreError::NotFound)?;
    if tier == Tier::Procedural {
        tx.stage_eviction(tenant, id, now).await?;
    }
    tx.commit().await?;
    Ok(tier)
}
