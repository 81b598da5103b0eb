//! Request and response bodies of the memory routes, and their conversion
//! into domain values (with every range check naming its field).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;
use uuid::Uuid;

use super::response::MemoryResponse;
use crate::domain::draft::Draft;
use crate::domain::validate::{
    self, Check, MAX_PHRASE_CHARS, MAX_PREDICATE_CHARS, MAX_SKILL_NAME_CHARS, MAX_SUBJECT_CHARS,
};
use crate::domain::{EventType, MemoryPatch, Outcome, Retention, Tier};

/// One memory to write. Only `agent_id` and `content` are required; tier and
/// importance are decided by the classifier when absent.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateMemoryRequest {
    /// The agent the memory belongs to. An identifier: 1-64 characters, no
    /// control, bidirectional or invisible characters, no surrounding spaces.
    #[schema(min_length = 1, max_length = 64)]
    pub agent_id: String,
    /// The user it is about, if any (an identifier); scopes fact deduplication to `user:{user_id}`.
    #[schema(min_length = 1, max_length = 64)]
    pub user_id: Option<String>,
    /// Required for working memory (an identifier).
    #[schema(min_length = 1, max_length = 64)]
    pub session_id: Option<String>,
    /// The text: the interaction, the fact, or what the skill does. Not blank,
    /// at most 32768 bytes of UTF-8, no NUL (U+0000).
    #[schema(min_length = 1, max_length = 32768)]
    pub content: String,
    pub tier: Option<Tier>,
    /// 0 to 1; scored by the classifier when absent.
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub importance: Option<f64>,
    /// Defaults: working → session, episodic → medium_term, semantic → long_term, procedural → permanent.
    pub retention: Option<Retention>,
    /// Episodic only; default `conversation`.
    pub event_type: Option<EventType>,
    /// Episodic, or procedural where it moves the success/failure counters.
    pub outcome: Option<Outcome>,
    /// Private memories are never shared with other agents.
    pub private: Option<bool>,
    /// Any JSON object of at most 16 KiB serialised; keys non-empty with no
    /// hidden characters and no string holding NUL, at any depth.
    #[schema(value_type = Option<std::collections::HashMap<String, serde_json::Value>>)]
    pub metadata: Option<Map<String, Value>>,
    /// When it happened (RFC 3339, years 1-9999, at most 24 hours ahead); default now. Recency decays from here.
    pub occurred_at: Option<DateTime<Utc>>,
    /// Semantic: a fact with subject and predicate contends for that slot: it
    /// supersedes the current fact unless that one comes from a more trusted
    /// source or is more confident, in which case it is kept as a candidate
    /// (`contested_by`), never recalled. For multi-valued predicates
    /// (`facts.multi_valued_predicates`) the object is part of the slot.
    #[schema(min_length = 1, max_length = 256)]
    pub subject: Option<String>,
    #[schema(min_length = 1, max_length = 128)]
    pub predicate: Option<String>,
    #[schema(min_length = 1, max_length = 4096)]
    pub object: Option<String>,
    /// Semantic: 0 to 1, default 0.7.
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub confidence: Option<f64>,
    /// Semantic: the episode the fact was learned from.
    pub source_episode_id: Option<Uuid>,
    /// Procedural: the skill's name, unique per agent; writing it again updates
    /// the skill. No control, bidirectional or invisible characters.
    #[schema(min_length = 1, max_length = 128)]
    pub skill_name: Option<String>,
    /// Procedural: when the skill applies.
    #[schema(min_length = 1, max_length = 4096)]
    pub trigger_pattern: Option<String>,
    /// Procedural: learned parameters or steps.
    #[schema(value_type = Option<std::collections::HashMap<String, serde_json::Value>>)]
    pub policy: Option<Map<String, Value>>,
    /// Procedural: ordered tool calls.
    #[schema(value_type = Option<Vec<std::collections::HashMap<String, serde_json::Value>>>)]
    pub tool_sequence: Option<Vec<Value>>,
    /// Procedural: reward of this use, -1 to 1; averaged into `avg_reward`.
    #[schema(minimum = -1.0, maximum = 1.0)]
    pub reward: Option<f64>,
}

/// Up to 500 memories, written all or nothing.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    #[schema(min_items = 1, max_items = 500)]
    pub memories: Vec<CreateMemoryRequest>,
}

/// Either one memory or `{"memories": [...]}`.
#[derive(Deserialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum CreateMemoriesBody {
    Single(Box<CreateMemoryRequest>),
    Batch(BatchRequest),
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ListResponse {
    pub memories: Vec<MemoryResponse>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
    /// What the page left out: `working_memory_unavailable` when the
    /// session's working memory could not be read (Redis down) and the page
    /// holds the persistent tiers only. Empty otherwise.
    pub warnings: Vec<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct HistoryResponse {
    /// The fact's supersede chain, oldest first.
    pub memories: Vec<MemoryResponse>,
}

/// Fields to change (at least one); absent fields stay as they are.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(min_properties = 1)]
pub struct UpdateMemoryRequest {
    /// New text; the memory is embedded again. The rules of `content` on write.
    #[schema(min_length = 1, max_length = 32768)]
    pub content: Option<String>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub importance: Option<f64>,
    /// Merged into the stored metadata (RFC 7396: a null value removes its
    /// key). The rules of `metadata` on write.
    #[schema(value_type = Option<std::collections::HashMap<String, serde_json::Value>>)]
    pub metadata: Option<Map<String, Value>>,
    /// New retention; expires_at becomes created_at plus its duration.
    pub retention: Option<Retention>,
}

fn opt_unit(at: &str, name: &str, v: Option<f64>) -> Check<Option<f64>> {
    v.map(|x| validate::unit_interval(&format!("{at}/{name}"), x)).transpose()
}

fn opt_id(at: &str, name: &str, v: &Option<String>) -> Check<()> {
    v.as_deref().map_or(Ok(()), |x| validate::identifier(&format!("{at}/{name}"), x))
}

fn opt_text(at: &str, name: &str, v: &Option<String>, max: usize) -> Check<()> {
    v.as_deref().map_or(Ok(()), |x| validate::short_text(&format!("{at}/{name}"), x, max))
}

impl CreateMemoryRequest {
    /// Range checks, then the draft the service classifies. `at` is this
    /// memory's JSON pointer.
    pub fn into_draft(self, at: &str, now: DateTime<Utc>) -> Check<Draft> {
        validate::identifier(&format!("{at}/agent_id"), &self.agent_id)?;
        opt_id(at, "user_id", &self.user_id)?;
        opt_id(at, "session_id", &self.session_id)?;
        validate::content(&format!("{at}/content"), &self.content)?;
        let importance = opt_unit(at, "importance", self.importance)?;
        let confidence = opt_unit(at, "confidence", self.confidence)?;
        let reward = self.reward.map(|r| validate::reward(&format!("{at}/reward"), r)).transpose()?;
        opt_text(at, "subject", &self.subject, MAX_SUBJECT_CHARS)?;
        opt_text(at, "predicate", &self.predicate, MAX_PREDICATE_CHARS)?;
        opt_text(at, "object", &self.object, MAX_PHRASE_CHARS)?;
        if let Some(name) = &self.skill_name {
            validate::name(&format!("{at}/skill_name"), name, MAX_SKILL_NAME_CHARS)?;
        }
        opt_text(at, "trigger_pattern", &self.trigger_pattern, MAX_PHRASE_CHARS)?;
        let metadata = self.metadata.unwrap_or_default();
        validate::metadata(&format!("{at}/metadata"), &metadata)?;
        let policy = self.policy.map(Value::Object);
        if let Some(p) = &policy {
            validate::storable_json(&format!("{at}/policy"), p)?;
        }
        let tool_sequence = self.tool_sequence.map(Value::Array);
        if let Some(t) = &tool_sequence {
            validate::storable_json(&format!("{at}/tool_sequence"), t)?;
        }
        if let Some(t) = self.occurred_at {
            validate::occurred_at(&format!("{at}/occurred_at"), t, now)?;
        }
        Ok(Draft {
            tier: self.tier,
            agent_id: self.agent_id,
            user_id: self.user_id,
            session_id: self.session_id,
            content: self.content,
            importance,
            retention: self.retention,
            metadata,
            private: self.private.unwrap_or(false),
            occurred_at: self.occurred_at,
            event_type: self.event_type,
            outcome: self.outcome,
            subject: self.subject,
            predicate: self.predicate,
            object: self.object,
            confidence,
            source_episode_id: self.source_episode_id,
            skill_name: self.skill_name,
            trigger_pattern: self.trigger_pattern,
            policy,
            tool_sequence,
            reward,
        })
    }
}

impl UpdateMemoryRequest {
    pub fn into_patch(self) -> Check<MemoryPatch> {
        if self.content.is_none() && self.importance.is_none() && self.metadata.is_none() && self.retention.is_none() {
            return Err(validate::FieldError::new("", "give at least one of content, importance, metadata, retention"));
        }
        if let Some(c) = &self.content {
            validate::content("/content", c)?;
        }
        if let Some(m) = &self.metadata {
            validate::metadata("/metadata", m)?;
        }
        Ok(MemoryPatch {
            content: self.content,
            importance: opt_unit("", "importance", self.importance)?,
            metadata: self.metadata,
            retention: self.retention,
            lifetime: None,
        })
    }
}
