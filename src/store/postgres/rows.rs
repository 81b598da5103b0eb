//! One row shape for the three tables: each SELECT projects the same columns
//! (NULL where a tier has no such field), so a UNION ALL over the tiers maps
//! into one struct and one conversion.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::domain::{Memory, Tier};
use crate::store::{RowKinds, StoreError};

const COMMON: &str = "id, agent_id, user_id, session_id, content, importance, retention, metadata, private, \
    occurred_at, created_at, updated_at, expires_at, access_count::bigint AS access_count, last_accessed_at, \
    embedding_model";

/// The names of the columns every `*_columns()` projects, in their order.
pub const NAMES: &str = "tier, id, agent_id, user_id, session_id, content, importance, retention, metadata, private, \
    occurred_at, created_at, updated_at, expires_at, access_count, last_accessed_at, embedding_model, event_type, \
    outcome, namespace, subject, predicate, object, confidence, valid_from, valid_until, supersedes, \
    source_episode_id, skill_name, trigger_pattern, policy, tool_sequence, success_count, failure_count, \
    success_rate, avg_reward, version, source, contested_by, provenance";

pub fn episodic_columns() -> String {
    format!(
        "'episodic'::text AS tier, {COMMON}, event_type, outcome, NULL::text AS namespace, NULL::text AS subject, \
         NULL::text AS predicate, NULL::text AS object, NULL::float8 AS confidence, NULL::timestamptz AS valid_from, \
         NULL::timestamptz AS valid_until, NULL::uuid AS supersedes, NULL::uuid AS source_episode_id, \
         NULL::text AS skill_name, NULL::text AS trigger_pattern, NULL::jsonb AS policy, NULL::jsonb AS tool_sequence, \
         NULL::integer AS success_count, NULL::integer AS failure_count, NULL::float8 AS success_rate, \
         NULL::float8 AS avg_reward, NULL::integer AS version, NULL::text AS source, NULL::uuid AS contested_by, \
         provenance"
    )
}

pub fn semantic_columns() -> String {
    format!(
        "'semantic'::text AS tier, {COMMON}, NULL::text AS event_type, NULL::text AS outcome, namespace, subject, \
         predicate, object, confidence, valid_from, valid_until, supersedes, source_episode_id, \
         NULL::text AS skill_name, NULL::text AS trigger_pattern, NULL::jsonb AS policy, NULL::jsonb AS tool_sequence, \
         NULL::integer AS success_count, NULL::integer AS failure_count, NULL::float8 AS success_rate, \
         NULL::float8 AS avg_reward, NULL::integer AS version, source, contested_by, provenance"
    )
}

pub fn procedural_columns() -> String {
    format!(
        "'procedural'::text AS tier, {COMMON}, NULL::text AS event_type, NULL::text AS outcome, NULL::text AS namespace, \
         NULL::text AS subject, NULL::text AS predicate, NULL::text AS object, NULL::float8 AS confidence, \
         NULL::timestamptz AS valid_from, NULL::timestamptz AS valid_until, NULL::uuid AS supersedes, \
         NULL::uuid AS source_episode_id, skill_name, trigger_pattern, policy, tool_sequence, success_count, \
         failure_count, success_rate, avg_reward, version, NULL::text AS source, NULL::uuid AS contested_by, \
         provenance"
    )
}

pub fn columns(tier: Tier) -> String {
    match tier {
        Tier::Episodic => episodic_columns(),
        Tier::Semantic => semantic_columns(),
        Tier::Procedural => procedural_columns(),
        Tier::Working => unreachable!("working memory is not stored in Postgres"),
    }
}

/// The table of a tier's vectors, partitioned by tenant and agent, that the
/// vector leg searches (migration 0018; kept equal to the memory table's
/// `embedding` column by a trigger).
pub fn vectors(tier: Tier) -> &'static str {
    match tier {
        Tier::Episodic => "episodic_vectors",
        Tier::Semantic => "semantic_vectors",
        Tier::Procedural => "procedural_vectors",
        Tier::Working => unreachable!("working memory is not stored in Postgres"),
    }
}

pub fn table(tier: Tier) -> &'static str {
    match tier {
        Tier::Episodic => "episodic_memory",
        Tier::Semantic => "semantic_memory",
        Tier::Procedural => "procedural_memory",
        Tier::Working => unreachable!("working memory is not stored in Postgres"),
    }
}

#[derive(Debug, sqlx::FromRow)]
pub struct MemoryRow {
    tier: String,
    id: Uuid,
    agent_id: String,
    user_id: Option<String>,
    session_id: Option<String>,
    content: String,
    importance: f64,
    retention: String,
    metadata: sqlx::types::Json<Map<String, Value>>,
    private: bool,
    occurred_at: DateTime<Utc>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    expires_at: Option<DateTime<Utc>>,
    access_count: i64,
    last_accessed_at: Option<DateTime<Utc>>,
    embedding_model: Option<String>,
    event_type: Option<String>,
    outcome: Option<String>,
    namespace: Option<String>,
    subject: Option<String>,
    predicate: Option<String>,
    object: Option<String>,
    confidence: Option<f64>,
    valid_from: Option<DateTime<Utc>>,
    valid_until: Option<DateTime<Utc>>,
    supersedes: Option<Uuid>,
    source_episode_id: Option<Uuid>,
    skill_name: Option<String>,
    trigger_pattern: Option<String>,
    policy: Option<Value>,
    tool_sequence: Option<Value>,
    success_count: Option<i32>,
    failure_count: Option<i32>,
    success_rate: Option<f64>,
    avg_reward: Option<f64>,
    version: Option<i32>,
    source: Option<String>,
    contested_by: Option<Uuid>,
    provenance: Option<sqlx::types::Json<crate::domain::share::Provenance>>,
}

impl TryFrom<MemoryRow> for Memory {
    type Error = StoreError;

    fn try_from(r: MemoryRow) -> Result<Self, StoreError> {
        let RowKinds { tier, retention, event_type, outcome } =
            RowKinds::parse(&r.tier, &r.retention, r.event_type.as_deref(), r.outcome.as_deref())?;
        Ok(Memory {
            id: r.id,
            tier,
            agent_id: r.agent_id,
            user_id: r.user_id,
            session_id: r.session_id,
            content: r.content,
            importance: r.importance,
            retention,
            metadata: r.metadata.0,
            private: r.private,
            occurred_at: r.occurred_at,
            created_at: r.created_at,
            updated_at: r.updated_at,
            expires_at: r.expires_at,
            access_count: r.access_count,
            last_accessed_at: r.last_accessed_at,
            embedding_model: r.embedding_model,
            event_type,
            outcome,
            namespace: r.namespace,
            subject: r.subject,
            predicate: r.predicate,
            object: r.object,
            confidence: r.confidence,
            valid_from: r.valid_from,
            valid_until: r.valid_until,
            supersedes: r.supersedes,
            source_episode_id: r.source_episode_id,
            skill_name: r.skill_name,
            trigger_pattern: r.trigger_pattern,
            policy: r.policy,
            tool_sequence: r.tool_sequence,
            success_count: r.success_count,
            failure_count: r.failure_count,
            success_rate: r.success_rate,
            avg_reward: r.avg_reward,
            version: r.version,
            source: r.source.as_deref().map(crate::store::parse_source).transpose()?,
            contested_by: r.contested_by,
            provenance: r.provenance.map(|p| p.0),
        })
    }
}
