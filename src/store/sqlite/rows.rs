//! The row shape of `memories` and its conversion to `Memory`: timestamps
//! from microseconds, JSON from text, enums from their names; and the
//! little-endian f32 encoding of vectors.

use serde_json::{Map, Value};
use uuid::Uuid;

use super::from_micros;
use crate::domain::Memory;
use crate::store::{RowKinds, StoreError, corrupt};

/// Every column a `MemoryRow` reads, in table order, each prefixed with `m.`
/// (queries alias `memories` as `m`, which also keeps them unambiguous in joins).
///
/// Real-valued columns are read through CAST: SQLite hands back a whole
/// number computed by an expression (the generated success_rate of 1/1, say)
/// as an INTEGER, which does not decode as a float.
pub const COLUMNS: &str = "m.seq, m.id, m.tier, m.agent_id, m.user_id, m.session_id, m.content, \
    cast(m.importance as real) as importance, \
    m.retention, m.metadata, m.private, m.occurred_at, m.created_at, m.updated_at, m.expires_at, m.access_count, \
    m.last_accessed_at, m.embedding_model, m.event_type, m.outcome, m.namespace, m.subject, m.predicate, m.object, \
    cast(m.confidence as real) as confidence, m.source_episode_id, m.supersedes, m.valid_from, m.valid_until, m.skill_name, m.trigger_pattern, \
    m.policy, m.tool_sequence, m.success_count, m.failure_count, \
    cast(m.success_rate as real) as success_rate, cast(m.avg_reward as real) as avg_reward, m.version, m.source, \
    m.contested_by, m.provenance";

/// The same columns as one JSON object, for statements that hand many rows
/// back as one (`json_group_array`): the driver passes rows over one at a
/// time between threads, which for hundreds of rows costs more than the
/// statement. Ids are hex (`Uuid` parses that form), booleans JSON booleans.
/// SQLite writes a REAL into JSON with 15 significant digits: every number a
/// client wrote comes back exact; a computed one (a running mean such as
/// 1.3 / 3) can differ from the column's double in its 16th digit.
pub const JSON_ROW: &str = "json_object('seq', m.seq, 'id', hex(m.id), 'tier', m.tier, 'agent_id', m.agent_id, \
    'user_id', m.user_id, 'session_id', m.session_id, 'content', m.content, \
    'importance', cast(m.importance as real), 'retention', m.retention, 'metadata', m.metadata, \
    'private', json(iif(m.private, 'true', 'false')), 'occurred_at', m.occurred_at, 'created_at', m.created_at, \
    'updated_at', m.updated_at, 'expires_at', m.expires_at, 'access_count', m.access_count, \
    'last_accessed_at', m.last_accessed_at, 'embedding_model', m.embedding_model, 'event_type', m.event_type, \
    'outcome', m.outcome, 'namespace', m.namespace, 'subject', m.subject, 'predicate', m.predicate, \
    'object', m.object, 'confidence', cast(m.confidence as real), \
    'source_episode_id', iif(m.source_episode_id is null, null, hex(m.source_episode_id)), \
    'supersedes', iif(m.supersedes is null, null, hex(m.supersedes)), 'valid_from', m.valid_from, \
    'valid_until', m.valid_until, 'skill_name', m.skill_name, 'trigger_pattern', m.trigger_pattern, \
    'policy', m.policy, 'tool_sequence', m.tool_sequence, 'success_count', m.success_count, \
    'failure_count', m.failure_count, 'success_rate', cast(m.success_rate as real), \
    'avg_reward', cast(m.avg_reward as real), 'version', m.version, 'source', m.source, \
    'contested_by', iif(m.contested_by is null, null, hex(m.contested_by)), 'provenance', m.provenance)";

/// Rows read as one `json_group_array` of `JSON_ROW`s, with their `seq`.
pub fn from_json_rows(json: &str) -> Result<Vec<(i64, Memory)>, StoreError> {
    let rows: Vec<MemoryRow> = serde_json::from_str(json)
        .map_err(|e| StoreError::Internal(anyhow::Error::new(e).context("rows read as JSON")))?;
    rows.into_iter().map(|r| Ok((r.seq, Memory::try_from(r)?))).collect()
}

/// The same names for a RETURNING clause, which takes no table alias.
pub fn returning() -> String {
    COLUMNS.replace("m.", "")
}

#[derive(Debug, sqlx::FromRow, serde::Deserialize)]
pub struct MemoryRow {
    /// The rowid: insertion order.
    pub seq: i64,
    id: Uuid,
    tier: String,
    agent_id: String,
    user_id: Option<String>,
    session_id: Option<String>,
    content: String,
    importance: f64,
    retention: String,
    metadata: String,
    private: bool,
    occurred_at: i64,
    created_at: i64,
    updated_at: i64,
    expires_at: Option<i64>,
    access_count: i64,
    last_accessed_at: Option<i64>,
    embedding_model: Option<String>,
    event_type: Option<String>,
    outcome: Option<String>,
    namespace: Option<String>,
    subject: Option<String>,
    predicate: Option<String>,
    object: Option<String>,
    confidence: Option<f64>,
    source_episode_id: Option<Uuid>,
    supersedes: Option<Uuid>,
    valid_from: Option<i64>,
    valid_until: Option<i64>,
    skill_name: Option<String>,
    trigger_pattern: Option<String>,
    policy: Option<String>,
    tool_sequence: Option<String>,
    success_count: Option<i32>,
    failure_count: Option<i32>,
    success_rate: Option<f64>,
    avg_reward: Option<f64>,
    version: Option<i32>,
    source: Option<String>,
    contested_by: Option<Uuid>,
    provenance: Option<String>,
}

fn json(what: &str, text: &str) -> Result<Value, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Internal(anyhow::anyhow!("stored {what} is not JSON: {e}")))
}

fn opt_time(v: Option<i64>) -> Result<Option<chrono::DateTime<chrono::Utc>>, StoreError> {
    v.map(from_micros).transpose()
}

impl TryFrom<MemoryRow> for Memory {
    type Error = StoreError;

    fn try_from(r: MemoryRow) -> Result<Self, StoreError> {
        let RowKinds { tier, retention, event_type, outcome } =
            RowKinds::parse(&r.tier, &r.retention, r.event_type.as_deref(), r.outcome.as_deref())?;
        let metadata: Map<String, Value> = match json("metadata", &r.metadata)? {
            Value::Object(map) => map,
            _ => return Err(corrupt("metadata", &r.metadata)),
        };
        Ok(Memory {
            id: r.id,
            tier,
            agent_id: r.agent_id,
            user_id: r.user_id,
            session_id: r.session_id,
            content: r.content,
            importance: r.importance,
            retention,
            metadata,
            private: r.private,
            occurred_at: from_micros(r.occurred_at)?,
            created_at: from_micros(r.created_at)?,
            updated_at: from_micros(r.updated_at)?,
            expires_at: opt_time(r.expires_at)?,
            access_count: r.access_count,
            last_accessed_at: opt_time(r.last_accessed_at)?,
            embedding_model: r.embedding_model,
            event_type,
            outcome,
            namespace: r.namespace,
            subject: r.subject,
            predicate: r.predicate,
            object: r.object,
            confidence: r.confidence,
            valid_from: opt_time(r.valid_from)?,
            valid_until: opt_time(r.valid_until)?,
            supersedes: r.supersedes,
            source_episode_id: r.source_episode_id,
            skill_name: r.skill_name,
            trigger_pattern: r.trigger_pattern,
            policy: r.policy.as_deref().map(|p| json("policy", p)).transpose()?,
            tool_sequence: r.tool_sequence.as_deref().map(|t| json("tool_sequence", t)).transpose()?,
            success_count: r.success_count,
            failure_count: r.failure_count,
            success_rate: r.success_rate,
            avg_reward: r.avg_reward,
            version: r.version,
            source: r.source.as_deref().map(crate::store::parse_source).transpose()?,
            contested_by: r.contested_by,
            provenance: r
                .provenance
                .as_deref()
                .map(|p| serde_json::from_str(p).map_err(|_| corrupt("provenance", p)))
                .transpose()?,
        })
    }
}

/// A vector as stored: its f32s, little-endian, back to back.
pub fn encode_vector(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn decode_vector(bytes: &[u8]) -> Result<Vec<f32>, StoreError> {
    if !bytes.len().is_multiple_of(4) {
        return Err(StoreError::Internal(anyhow::anyhow!(
            "stored vector has {} bytes, not a multiple of 4",
            bytes.len()
        )));
    }
    Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// JSON for a text column.
pub fn to_json_text(v: &impl serde::Serialize) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Internal(e.into()))
}
