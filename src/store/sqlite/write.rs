//! The write path of the SQLite store, one function per tier and the
//! idempotency key, each running inside the caller's transaction: the
//! rules of `store/postgres/memories.rs` (dedup, supersede, procedural
//! upsert, key claim). Every function also records what the vector index
//! must do once the transaction commits (`IndexOp`) to the in-process
//! indexes.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use sqlx::SqliteConnection;
use uuid::Uuid;

use super::rows::{self, COLUMNS, MemoryRow, encode_vector, to_json_text};
use super::{micros, store_error};
use crate::domain::{Memory, Outcome, WrittenMemory};
use crate::store::{Embedding, IdempotencyKey, PreparedMemory, StoreError, StoreResult, StoredResponse};

/// A change to the in-process indexes (vectors and full text), applied once
/// its transaction committed.
pub(super) enum IndexOp {
    /// The memory as written (inserted, upserted, rewritten or
    /// re-embedded), with its vector if it has one.
    Put(Memory, Option<Embedding>),
    /// The memory keeps its text and vector; its filter fields may have changed.
    Refresh(Memory),
    /// A fact was superseded.
    Retire(Uuid),
    /// The memory is gone.
    Remove(Uuid),
}

impl IndexOp {
    /// What a freshly written row means for the indexes.
    pub(super) fn written(memory: &Memory, embedding: Option<&Embedding>) -> IndexOp {
        IndexOp::Put(memory.clone(), embedding.cloned())
    }
}

pub(super) fn vector_of(e: Option<&Embedding>) -> (Option<Vec<u8>>, Option<String>) {
    match e {
        Some(e) => (Some(encode_vector(&e.vector)), Some(e.model.clone())),
        None => (None, None),
    }
}

/// Takes the key unless a fresh one exists; returns the fresh one's response.
pub(super) async fn claim_key(
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

pub(super) async fn insert_episodic(
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
    .bind(p.expires_at.map(micros))
    .fetch_one(&mut *conn)
    .await
    .map_err(store_error)?;
    row.try_into()
}

/// Inserts a fact, unless an identical valid one exists (returned with
/// `deduplicated`). A fact with subject and predicate retires the valid
/// facts about the same pair whose confidence is not higher.
pub(super) async fn insert_semantic(
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
    .bind(p.expires_at.map(micros))
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
pub(super) async fn upsert_procedural(
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
        .bind(p.expires_at.map(micros))
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
            .bind(p.expires_at.map(micros))
            .fetch_one(&mut *conn)
            .await
            .map_err(store_error)?
        }
    };
    row.try_into()
}
