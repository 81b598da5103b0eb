//! `MemoryStore` on SQLite: the write path (dedup, supersede, upsert,
//! idempotency, one transaction per request), reads, listing, patches,
//! deletes and fact history. The rules are the Postgres backend's
//! (`store/postgres/memories.rs`); where that one leans on row locks, this
//! one leans on the write gate, which runs one write transaction at a time.

use std::time::Instant;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use uuid::Uuid;

use super::rows::{self, COLUMNS, MemoryRow, encode_vector, to_json_text};
use super::vectors::Entry;
use super::{SqliteStore, micros, observe, store_error};
use crate::domain::memory::merge_metadata;
use crate::domain::{Memory, MemoryPatch, Outcome, Tier, WrittenMemory};
use crate::store::{
    Embedding, IdempotencyKey, ListFilter, MemoryStore, PreparedMemory, RenderResponse, SearchHits, SearchQuery,
    StoreError, StoreResult, StoredResponse, WriteOutcome,
};

/// A change to the vector index, applied once its transaction committed.
pub(super) enum IndexOp {
    /// The memory has this vector now (inserted, upserted or re-embedded).
    Put(Memory, Embedding),
    /// The memory keeps its vector; its filter fields may have changed.
    Refresh(Memory),
    /// A fact was superseded.
    Retire(Uuid),
    /// The memory is gone, or has no vector any more.
    Remove(Uuid),
}

impl IndexOp {
    /// What a freshly written row means for the index.
    fn written(memory: &Memory, embedding: Option<&Embedding>) -> IndexOp {
        match embedding {
            Some(e) => IndexOp::Put(memory.clone(), e.clone()),
            None => IndexOp::Remove(memory.id),
        }
    }
}

fn vector_of(e: Option<&Embedding>) -> (Option<Vec<u8>>, Option<String>) {
    match e {
        Some(e) => (Some(encode_vector(&e.vector)), Some(e.model.clone())),
        None => (None, None),
    }
}

/// `(expires_at is null or expires_at > ?)` for the row alias `m`.
fn push_live(qb: &mut QueryBuilder<Sqlite>, now: DateTime<Utc>) {
    qb.push(" and (m.expires_at is null or m.expires_at > ").push_bind(micros(now)).push(")");
}

impl SqliteStore {
    /// Applies index changes in order (called under the write gate).
    pub(super) fn apply(&self, tenant: &str, ops: Vec<IndexOp>) {
        if ops.is_empty() {
            return;
        }
        let mut index = self.inner.vectors.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        for op in ops {
            match op {
                IndexOp::Put(m, e) => {
                    let entry = Entry::of(&m);
                    index.put(tenant, &m.agent_id, &e.model, &e.vector, entry);
                }
                IndexOp::Refresh(m) => index.refresh(tenant, Entry::of(&m)),
                IndexOp::Retire(id) => index.retire(tenant, id),
                IndexOp::Remove(id) => index.remove(tenant, id),
            }
        }
    }

    /// A live memory by id, superseded facts included.
    pub(super) async fn find(&self, tenant: &str, id: Uuid, now: DateTime<Utc>) -> StoreResult<Option<Memory>> {
        let row: Option<MemoryRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "select {COLUMNS} from memories m where m.tenant_id = ? and m.id = ? \
             and (m.expires_at is null or m.expires_at > ?)"
        )))
        .bind(tenant)
        .bind(id)
        .bind(micros(now))
        .fetch_optional(&self.inner.pool)
        .await
        .map_err(store_error)?;
        row.map(Memory::try_from).transpose()
    }

    /// Counts one access of each `(tier, id)` at `now`, unless its last
    /// counted access is later than `counted_after` (then nothing changes,
    /// as in the Postgres backend).
    pub async fn record_access_since(
        &self,
        tenant: &str,
        hits: &[(Tier, Uuid)],
        now: DateTime<Utc>,
        counted_after: DateTime<Utc>,
    ) -> StoreResult<()> {
        let mut ids: Vec<(Tier, Uuid)> = hits.iter().filter(|(t, _)| *t != Tier::Working).copied().collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() {
            return Ok(());
        }
        let _gate = self.inner.write_gate.lock().await;
        let mut tx = self.inner.pool.begin().await.map_err(store_error)?;
        for (tier, id) in ids {
            sqlx::query(
                "update memories set access_count = access_count + 1, last_accessed_at = ? \
                 where tenant_id = ? and id = ? and tier = ? and (last_accessed_at is null or last_accessed_at <= ?)",
            )
            .bind(micros(now))
            .bind(tenant)
            .bind(id)
            .bind(tier.as_str())
            .bind(micros(counted_after))
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
        }
        tx.commit().await.map_err(store_error)?;
        Ok(())
    }
}

/// Takes the key unless a fresh one exists; returns the fresh one's response.
async fn claim_key(
    conn: &mut SqliteConnection,
    tenant: &str,
    key: &IdempotencyKey,
    now: DateTime<Utc>,
    ttl: chrono::Duration,
) -> StoreResult<Option<StoredResponse>> {
    let claimed: Option<i64> = sqlx::query_scalar(
        "insert into idempotency_keys (tenant_id, key, request_hash, status, response, created_at, updated_at) \
         values (?1, ?2, ?3, 0, 'null', ?4, ?4) \
         on conflict (tenant_id, key) do update set request_hash = excluded.request_hash, status = 0, \
             response = 'null', created_at = excluded.created_at, updated_at = excluded.updated_at \
         where idempotency_keys.created_at <= ?5 \
         returning 1",
    )
    .bind(tenant)
    .bind(&key.key)
    .bind(&key.request_hash)
    .bind(micros(now))
    .bind(micros(now - ttl))
    .fetch_optional(&mut *conn)
    .await
    .map_err(store_error)?;
    if claimed.is_some() {
        return Ok(None);
    }
    let (request_hash, status, body): (String, i64, String) =
        sqlx::query_as("select request_hash, status, response from idempotency_keys where tenant_id = ? and key = ?")
            .bind(tenant)
            .bind(&key.key)
            .fetch_one(&mut *conn)
            .await
            .map_err(store_error)?;
    let body = serde_json::from_str(&body).map_err(|e| StoreError::Internal(e.into()))?;
    Ok(Some(StoredResponse { request_hash, status: status as u16, body }))
}

async fn insert_episodic(
    conn: &mut SqliteConnection,
    tenant: &str,
    p: &PreparedMemory,
    now: DateTime<Utc>,
) -> StoreResult<Memory> {
    let m = &p.memory;
    let (vector, model) = vector_of(p.embedding.as_ref());
    let row: MemoryRow = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "insert into memories (id, tenant_id, tier, agent_id, user_id, session_id, event_type, content, content_hash, \
             outcome, importance, embedding, embedding_model, retention, private, metadata, occurred_at, created_at, \
             updated_at, expires_at) \
         values (?1, ?2, 'episodic', ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?17, ?18) \
         returning {}",
        rows::returning()
    )))
    .bind(m.id)
    .bind(tenant)
    .bind(&m.agent_id)
    .bind(&m.user_id)
    .bind(&m.session_id)
    .bind(m.event_type.map_or("conversation", |e| e.as_str()))
    .bind(&m.content)
    .bind(&p.content_hash)
    .bind(m.outcome.map(|o| o.as_str()))
    .bind(m.importance)
    .bind(vector)
    .bind(model)
    .bind(m.retention.as_str())
    .bind(m.private)
    .bind(to_json_text(&m.metadata)?)
    .bind(micros(m.occurred_at.unwrap_or(now)))
    .bind(micros(now))
    .bind(m.retention.expires_at(now).map(micros))
    .fetch_one(&mut *conn)
    .await
    .map_err(store_error)?;
    row.try_into()
}

/// Inserts a fact, unless an identical valid one exists (returned with
/// `deduplicated`). A fact with subject and predicate retires the valid
/// facts about the same pair whose confidence is not higher.
async fn insert_semantic(
    conn: &mut SqliteConnection,
    tenant: &str,
    p: &PreparedMemory,
    now: DateTime<Utc>,
    ops: &mut Vec<IndexOp>,
) -> StoreResult<WrittenMemory> {
    let m = &p.memory;
    let namespace = m.namespace();
    let existing: Option<MemoryRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "select {COLUMNS} from memories m where m.tenant_id = ? and m.tier = 'semantic' and m.agent_id = ? \
         and m.namespace = ? and m.content_hash = ? and m.valid_until is null"
    )))
    .bind(tenant)
    .bind(&m.agent_id)
    .bind(&namespace)
    .bind(&p.content_hash)
    .fetch_optional(&mut *conn)
    .await
    .map_err(store_error)?;
    if let Some(row) = existing {
        let memory: Memory = row.try_into()?;
        if !memory.is_expired(now) {
            return Ok(WrittenMemory { memory, deduplicated: true });
        }
        // Forgotten but not yet swept: it must not swallow the new fact.
        sqlx::query("delete from memories where tenant_id = ? and id = ?")
            .bind(tenant)
            .bind(memory.id)
            .execute(&mut *conn)
            .await
            .map_err(store_error)?;
        ops.push(IndexOp::Remove(memory.id));
    }

    let mut supersedes = None;
    if let (Some(subject), Some(predicate)) = (&m.subject, &m.predicate) {
        let retired: Vec<(Uuid, i64)> = sqlx::query_as(
            "update memories set valid_until = ?7, updated_at = ?7 \
             where tenant_id = ?1 and tier = 'semantic' and agent_id = ?2 and namespace = ?3 and subject = ?4 \
             and predicate = ?5 and valid_until is null and confidence <= ?6 returning id, created_at",
        )
        .bind(tenant)
        .bind(&m.agent_id)
        .bind(&namespace)
        .bind(subject)
        .bind(predicate)
        .bind(m.confidence.unwrap_or(0.7))
        .bind(micros(now))
        .fetch_all(&mut *conn)
        .await
        .map_err(store_error)?;
        ops.extend(retired.iter().map(|(id, _)| IndexOp::Retire(*id)));
        // The newest of them when several were valid; ties broken by id so
        // the choice does not depend on the order rows came back in.
        supersedes = retired.into_iter().max_by_key(|(id, created)| (*created, *id)).map(|(id, _)| id);
    }

    let (vector, model) = vector_of(p.embedding.as_ref());
    let row: MemoryRow = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "insert into memories (id, tenant_id, tier, agent_id, user_id, session_id, namespace, content, content_hash, \
             subject, predicate, object, confidence, source_episode_id, supersedes, valid_from, importance, embedding, \
             embedding_model, retention, private, metadata, occurred_at, created_at, updated_at, expires_at) \
         values (?1, ?2, 'semantic', ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, \
             ?20, ?21, ?15, ?22, ?22, ?23) \
         returning {}",
        rows::returning()
    )))
    .bind(m.id)
    .bind(tenant)
    .bind(&m.agent_id)
    .bind(&m.user_id)
    .bind(&m.session_id)
    .bind(&namespace)
    .bind(&m.content)
    .bind(&p.content_hash)
    .bind(&m.subject)
    .bind(&m.predicate)
    .bind(&m.object)
    .bind(m.confidence.unwrap_or(0.7))
    .bind(m.source_episode_id)
    .bind(supersedes)
    // valid_from and occurred_at: when the fact was observed.
    .bind(micros(m.occurred_at.unwrap_or(now)))
    .bind(m.importance)
    .bind(vector)
    .bind(model)
    .bind(m.retention.as_str())
    .bind(m.private)
    .bind(to_json_text(&m.metadata)?)
    .bind(micros(now))
    .bind(m.retention.expires_at(now).map(micros))
    .fetch_one(&mut *conn)
    .await
    .map_err(store_error)?;
    let memory: Memory = row.try_into()?;
    ops.push(IndexOp::written(&memory, p.embedding.as_ref()));
    Ok(WrittenMemory { memory, deduplicated: false })
}

/// Inserts a skill or updates the agent's skill of the same name: new text
/// replaces the old, given fields replace theirs, an outcome moves the
/// counters, a reward moves the running mean, the version increments.
/// The arithmetic is done here rather than in SQL so that it rounds like
/// Postgres: double precision, then stored as f32 (`real`).
async fn upsert_procedural(
    conn: &mut SqliteConnection,
    tenant: &str,
    p: &PreparedMemory,
    now: DateTime<Utc>,
) -> StoreResult<Memory> {
    let m = &p.memory;
    let skill = m.skill_name.as_deref().unwrap_or_default();
    let (vector, model) = vector_of(p.embedding.as_ref());
    let (success, failure) = match m.outcome {
        Some(Outcome::Success) => (1, 0),
        Some(Outcome::Failure) => (0, 1),
        _ => (0, 0),
    };
    // The stored skill's running-mean state and metadata, if it exists.
    let existing: Option<(Uuid, i64, f32, String)> = sqlx::query_as(
        "select id, reward_count, avg_reward, metadata from memories where tenant_id = ? and tier = 'procedural' \
         and agent_id = ? and skill_name = ?",
    )
    .bind(tenant)
    .bind(&m.agent_id)
    .bind(skill)
    .fetch_optional(&mut *conn)
    .await
    .map_err(store_error)?;

    let row: MemoryRow = match existing {
        None => sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "insert into memories (id, tenant_id, tier, agent_id, user_id, session_id, skill_name, content, \
                 content_hash, trigger_pattern, policy, tool_sequence, success_count, failure_count, reward_count, \
                 avg_reward, version, importance, embedding, embedding_model, retention, private, metadata, \
                 occurred_at, created_at, updated_at, expires_at) \
             values (?1, ?2, 'procedural', ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, 1, ?16, ?17, \
                 ?18, ?19, ?20, ?21, ?22, ?23, ?23, ?24) \
             returning {}",
            rows::returning()
        )))
        .bind(m.id)
        .bind(tenant)
        .bind(&m.agent_id)
        .bind(&m.user_id)
        .bind(&m.session_id)
        .bind(skill)
        .bind(&m.content)
        .bind(&p.content_hash)
        .bind(&m.trigger_pattern)
        .bind(m.policy.as_ref().map(to_json_text).transpose()?)
        .bind(m.tool_sequence.as_ref().map(to_json_text).transpose()?)
        .bind(success)
        .bind(failure)
        .bind(i32::from(m.reward.is_some()))
        .bind(m.reward.unwrap_or(0.0))
        .bind(m.importance)
        .bind(vector)
        .bind(model)
        .bind(m.retention.as_str())
        .bind(m.private)
        .bind(to_json_text(&m.metadata)?)
        .bind(micros(m.occurred_at.unwrap_or(now)))
        .bind(micros(now))
        .bind(m.retention.expires_at(now).map(micros))
        .fetch_one(&mut *conn)
        .await
        .map_err(store_error)?,
        Some((old_id, reward_count, old_avg, old_metadata)) => {
            let avg_reward = match m.reward {
                None => old_avg,
                Some(r) => {
                    ((f64::from(old_avg) * reward_count as f64 + f64::from(r)) / (reward_count + 1) as f64) as f32
                }
            };
            // `p.metadata || EXCLUDED.metadata`: a shallow merge, new keys win.
            let mut metadata: Map<String, Value> =
                serde_json::from_str(&old_metadata).map_err(|e| StoreError::Internal(e.into()))?;
            metadata.extend(m.metadata.iter().map(|(k, v)| (k.clone(), v.clone())));
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "update memories set user_id = coalesce(?3, user_id), session_id = coalesce(?4, session_id), \
                     content = ?5, content_hash = ?6, trigger_pattern = coalesce(?7, trigger_pattern), \
                     policy = coalesce(?8, policy), tool_sequence = coalesce(?9, tool_sequence), \
                     success_count = success_count + ?10, failure_count = failure_count + ?11, \
                     avg_reward = ?12, reward_count = reward_count + ?13, importance = ?14, \
                     embedding = ?15, embedding_model = ?16, retention = ?17, private = ?18, metadata = ?19, \
                     occurred_at = ?20, updated_at = ?21, expires_at = ?22, version = version + 1 \
                 where tenant_id = ?1 and id = ?2 \
                 returning {}",
                rows::returning()
            )))
            .bind(tenant)
            .bind(old_id)
            .bind(&m.user_id)
            .bind(&m.session_id)
            .bind(&m.content)
            .bind(&p.content_hash)
            .bind(&m.trigger_pattern)
            .bind(m.policy.as_ref().map(to_json_text).transpose()?)
            .bind(m.tool_sequence.as_ref().map(to_json_text).transpose()?)
            .bind(success)
            .bind(failure)
            .bind(avg_reward)
            .bind(i32::from(m.reward.is_some()))
            .bind(m.importance)
            .bind(vector)
            .bind(model)
            .bind(m.retention.as_str())
            .bind(m.private)
            .bind(to_json_text(&metadata)?)
            .bind(micros(m.occurred_at.unwrap_or(now)))
            .bind(micros(now))
            .bind(m.retention.expires_at(now).map(micros))
            .fetch_one(&mut *conn)
            .await
            .map_err(store_error)?
        }
    };
    row.try_into()
}

/// `metadata.KEY` compared as text, as `ListFilter::matches` does: a string
/// by its value, JSON null or a missing key never, anything else by its
/// JSON text. `json_each` finds the key whatever characters it holds (a
/// JSON path would have to quote them).
fn push_metadata_text(qb: &mut QueryBuilder<Sqlite>, key: &str, value: &str) {
    qb.push(" and exists (select 1 from json_each(m.metadata) j where j.key = ").push_bind(key.to_string());
    qb.push(
        " and (case j.type when 'text' then j.value when 'null' then null when 'true' then 'true' \
         when 'false' then 'false' when 'integer' then cast(j.value as text) \
         when 'real' then cast(j.value as text) else j.value end) = ",
    );
    qb.push_bind(value.to_string()).push(")");
}

fn push_list_filters(qb: &mut QueryBuilder<Sqlite>, tenant: &str, tiers: &[Tier], f: &ListFilter, now: DateTime<Utc>) {
    qb.push(" where m.tenant_id = ").push_bind(tenant.to_string());
    push_live(qb, now);
    qb.push(" and m.tier in (");
    let mut sep = qb.separated(", ");
    for t in tiers {
        sep.push_bind(t.as_str());
    }
    qb.push(")");
    if let Some(a) = &f.agent_id {
        qb.push(" and m.agent_id = ").push_bind(a.clone());
    }
    if let Some(u) = &f.user_id {
        qb.push(" and m.user_id = ").push_bind(u.clone());
    }
    if let Some(s) = &f.session_id {
        qb.push(" and m.session_id = ").push_bind(s.clone());
    }
    if let Some(t) = f.created_after {
        qb.push(" and m.created_at >= ").push_bind(micros(t));
    }
    if let Some(t) = f.created_before {
        qb.push(" and m.created_at < ").push_bind(micros(t));
    }
    if let Some(c) = f.after {
        qb.push(" and (m.created_at, m.id) < (").push_bind(micros(c.created_at)).push(", ").push_bind(c.id).push(")");
    }
    for (k, v) in &f.metadata {
        push_metadata_text(qb, k, v);
    }
    if !f.include_superseded {
        qb.push(" and (m.tier <> 'semantic' or m.valid_until is null)");
    }
}

#[async_trait]
impl MemoryStore for SqliteStore {
    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("select 1").execute(&self.inner.pool).await.map_err(store_error)?;
        Ok(())
    }

    async fn idempotent_response(
        &self,
        tenant: &str,
        key: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<StoredResponse>> {
        let row: Option<(String, i64, String)> = sqlx::query_as(
            "select request_hash, status, response from idempotency_keys where tenant_id = ? and key = ? \
             and status <> 0 and created_at > ?",
        )
        .bind(tenant)
        .bind(key)
        .bind(micros(now - self.inner.idempotency_ttl))
        .fetch_optional(&self.inner.pool)
        .await
        .map_err(store_error)?;
        row.map(|(request_hash, status, body)| {
            let body = serde_json::from_str(&body).map_err(|e| StoreError::Internal(e.into()))?;
            Ok(StoredResponse { request_hash, status: status as u16, body })
        })
        .transpose()
    }

    async fn write(
        &self,
        tenant: &str,
        items: &[PreparedMemory],
        idempotency: Option<&IdempotencyKey>,
        render: RenderResponse<'_>,
        now: DateTime<Utc>,
    ) -> StoreResult<WriteOutcome> {
        let started = Instant::now();
        if items.iter().any(|p| p.memory.tier == Tier::Working) {
            return Err(StoreError::Internal(anyhow::anyhow!("working memory sent to the persistent store")));
        }
        let _gate = self.inner.write_gate.lock().await;
        let mut tx = self.inner.pool.begin().await.map_err(store_error)?;
        if let Some(key) = idempotency
            && let Some(previous) = claim_key(&mut tx, tenant, key, now, self.inner.idempotency_ttl).await?
        {
            tx.rollback().await.map_err(store_error)?;
            return Ok(WriteOutcome::Replayed(previous));
        }
        let mut written = Vec::with_capacity(items.len());
        let mut ops = Vec::new();
        for p in items {
            let w = match p.memory.tier {
                Tier::Episodic => {
                    let memory = insert_episodic(&mut tx, tenant, p, now).await?;
                    ops.push(IndexOp::written(&memory, p.embedding.as_ref()));
                    WrittenMemory { memory, deduplicated: false }
                }
                Tier::Semantic => insert_semantic(&mut tx, tenant, p, now, &mut ops).await?,
                Tier::Procedural => {
                    let memory = upsert_procedural(&mut tx, tenant, p, now).await?;
                    ops.push(IndexOp::written(&memory, p.embedding.as_ref()));
                    WrittenMemory { memory, deduplicated: false }
                }
                Tier::Working => unreachable!("rejected above"),
            };
            written.push(w);
        }
        if let Some(key) = idempotency {
            sqlx::query(
                "update idempotency_keys set status = 201, response = ?, updated_at = ? where tenant_id = ? and key = ?",
            )
            .bind(to_json_text(&render(&written))?)
            .bind(micros(now))
            .bind(tenant)
            .bind(&key.key)
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
        }
        tx.commit().await.map_err(store_error)?;
        self.apply(tenant, ops);
        observe("write", started);
        Ok(WriteOutcome::Written(written))
    }

    async fn get(&self, tenant: &str, id: Uuid, now: DateTime<Utc>) -> StoreResult<Memory> {
        let started = Instant::now();
        let found = self.find(tenant, id, now).await?;
        observe("get", started);
        found.ok_or(StoreError::NotFound)
    }

    async fn list(&self, tenant: &str, filter: &ListFilter, now: DateTime<Utc>) -> StoreResult<Vec<Memory>> {
        let started = Instant::now();
        let tiers: Vec<Tier> =
            [Tier::Episodic, Tier::Semantic, Tier::Procedural].into_iter().filter(|t| filter.wants(*t)).collect();
        if tiers.is_empty() {
            return Ok(Vec::new());
        }
        let mut qb = QueryBuilder::new(format!("select {COLUMNS} from memories m"));
        push_list_filters(&mut qb, tenant, &tiers, filter, now);
        qb.push(" order by m.created_at desc, m.id desc limit ").push_bind((filter.limit + 1) as i64);
        let rows: Vec<MemoryRow> = qb.build_query_as().fetch_all(&self.inner.pool).await.map_err(store_error)?;
        observe("list", started);
        rows.into_iter().map(Memory::try_from).collect()
    }

    async fn update(
        &self,
        tenant: &str,
        id: Uuid,
        patch: &MemoryPatch,
        embedding: Option<&Embedding>,
        now: DateTime<Utc>,
    ) -> StoreResult<Memory> {
        let started = Instant::now();
        let _gate = self.inner.write_gate.lock().await;
        // Read under the gate: no other write can slip between this read and
        // the update, which is what Postgres's FOR UPDATE buys.
        let current = self.find(tenant, id, now).await?.ok_or(StoreError::NotFound)?;
        let mut metadata = current.metadata.clone();
        if let Some(p) = &patch.metadata {
            merge_metadata(&mut metadata, p);
        }
        let mut tx = self.inner.pool.begin().await.map_err(store_error)?;
        let mut qb = QueryBuilder::new("update memories set updated_at = ");
        qb.push_bind(micros(now));
        qb.push(", metadata = ").push_bind(to_json_text(&metadata)?);
        if let Some(importance) = patch.importance {
            qb.push(", importance = ").push_bind(importance);
        }
        if let Some(retention) = patch.retention {
            qb.push(", retention = ").push_bind(retention.as_str());
            qb.push(", expires_at = ").push_bind(retention.expires_at(current.created_at).map(micros));
        }
        if let Some(content) = &patch.content {
            let (vector, model) = vector_of(embedding);
            qb.push(", content = ").push_bind(content.clone());
            qb.push(", content_hash = ").push_bind(crate::domain::content::content_hash(content));
            qb.push(", embedding = ").push_bind(vector);
            qb.push(", embedding_model = ").push_bind(model);
        }
        qb.push(" where tenant_id = ").push_bind(tenant.to_string());
        qb.push(" and id = ").push_bind(id);
        qb.push(format!(" returning {}", rows::returning()));
        let row: MemoryRow = qb.build_query_as().fetch_one(&mut *tx).await.map_err(store_error)?;
        tx.commit().await.map_err(store_error)?;
        let memory: Memory = row.try_into()?;
        let op = match &patch.content {
            Some(_) => IndexOp::written(&memory, embedding),
            None => IndexOp::Refresh(memory.clone()),
        };
        self.apply(tenant, vec![op]);
        observe("update", started);
        Ok(memory)
    }

    async fn delete(&self, tenant: &str, id: Uuid) -> StoreResult<Tier> {
        let started = Instant::now();
        let _gate = self.inner.write_gate.lock().await;
        let tier: Option<String> =
            sqlx::query_scalar("delete from memories where tenant_id = ? and id = ? returning tier")
                .bind(tenant)
                .bind(id)
                .fetch_optional(&self.inner.pool)
                .await
                .map_err(store_error)?;
        if tier.is_some() {
            self.apply(tenant, vec![IndexOp::Remove(id)]);
        }
        observe("delete", started);
        tier.as_deref().and_then(Tier::parse).ok_or(StoreError::NotFound)
    }

    async fn history(&self, tenant: &str, id: Uuid, now: DateTime<Utc>) -> StoreResult<Vec<Memory>> {
        let current = match self.find(tenant, id, now).await? {
            Some(m) if m.tier == Tier::Semantic => m,
            Some(m) => return Ok(vec![m]),
            None => return Err(StoreError::NotFound),
        };
        // Walk back through `supersedes` and forward through the rows that
        // supersede this one; depth orders the chain oldest first.
        let rows: Vec<MemoryRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "with recursive back(id, supersedes, depth) as ( \
                 select id, supersedes, 0 from memories where tenant_id = ?1 and id = ?2 \
                 union all select s.id, s.supersedes, b.depth - 1 from memories s join back b \
                     on s.id = b.supersedes where s.tenant_id = ?1 and s.tier = 'semantic' and b.depth > -10000), \
             fwd(id, depth) as ( \
                 select id, 0 from memories where tenant_id = ?1 and id = ?2 \
                 union all select s.id, f.depth + 1 from memories s join fwd f \
                     on s.supersedes = f.id where s.tenant_id = ?1 and s.tier = 'semantic' and f.depth < 10000), \
             chain(id, depth) as (select id, depth from back union select id, depth from fwd) \
             select {COLUMNS} from memories m join chain c on c.id = m.id \
             where m.tenant_id = ?1 and (m.expires_at is null or m.expires_at > ?3) order by c.depth"
        )))
        .bind(tenant)
        .bind(current.id)
        .bind(micros(now))
        .fetch_all(&self.inner.pool)
        .await
        .map_err(store_error)?;
        rows.into_iter().map(Memory::try_from).collect()
    }

    async fn search(&self, tenant: &str, query: &SearchQuery, now: DateTime<Utc>) -> StoreResult<SearchHits> {
        self.search_legs(tenant, query, now).await
    }

    /// Adds `times` to each memory's count and stamps `now`. (The newer
    /// once-per-interval rule is `record_access_since`.)
    async fn record_access(&self, tenant: &str, hits: &[(Tier, Uuid, i32)], now: DateTime<Utc>) -> StoreResult<()> {
        if hits.is_empty() {
            return Ok(());
        }
        let _gate = self.inner.write_gate.lock().await;
        let mut tx = self.inner.pool.begin().await.map_err(store_error)?;
        for (tier, id, times) in hits {
            sqlx::query(
                "update memories set access_count = access_count + ?, last_accessed_at = ? \
                 where tenant_id = ? and id = ? and tier = ?",
            )
            .bind(times)
            .bind(micros(now))
            .bind(tenant)
            .bind(id)
            .bind(tier.as_str())
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
        }
        tx.commit().await.map_err(store_error)?;
        Ok(())
    }
}
