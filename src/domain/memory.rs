//! The memory record as engram stores and recalls it (the API answers with
//! `http::response::MemoryResponse`), the validated input of a write, and the
//! enums (tier, retention, event type, outcome) with their rules.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;
use uuid::Uuid;

/// The four memory tiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// The current session: held in Redis with a TTL.
    Working,
    /// Past interactions: time-stamped rows with a vector.
    Episodic,
    /// Facts: deduplicated by content, superseded on contradiction.
    Semantic,
    /// Learned skills: upserted by skill name with success counters.
    Procedural,
}

impl Tier {
    pub const ALL: [Tier; 4] = [Tier::Working, Tier::Episodic, Tier::Semantic, Tier::Procedural];

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Working => "working",
            Tier::Episodic => "episodic",
            Tier::Semantic => "semantic",
            Tier::Procedural => "procedural",
        }
    }

    pub fn parse(s: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// The retention a memory of this tier gets when the writer names none.
    pub fn default_retention(self) -> Retention {
        match self {
            Tier::Working => Retention::Session,
            Tier::Episodic => Retention::MediumTerm,
            Tier::Semantic => Retention::LongTerm,
            Tier::Procedural => Retention::Permanent,
        }
    }
}

/// How long a memory is kept after it was ingested; the server's
/// configuration (`[retention]`) sets each duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Retention {
    /// One hour by default (`retention.transient`).
    Transient,
    /// 24 hours by default (`retention.session`).
    Session,
    /// 7 days by default (`retention.short_term`).
    ShortTerm,
    /// 90 days by default (`retention.medium_term`).
    MediumTerm,
    /// 365 days by default (`retention.long_term`).
    LongTerm,
    /// Never expires, and never decays.
    Permanent,
}

impl Retention {
    pub const ALL: [Retention; 6] = [
        Retention::Transient,
        Retention::Session,
        Retention::ShortTerm,
        Retention::MediumTerm,
        Retention::LongTerm,
        Retention::Permanent,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Retention::Transient => "transient",
            Retention::Session => "session",
            Retention::ShortTerm => "short_term",
            Retention::MediumTerm => "medium_term",
            Retention::LongTerm => "long_term",
            Retention::Permanent => "permanent",
        }
    }

    pub fn parse(s: &str) -> Option<Retention> {
        Retention::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// What kind of interaction an episode records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventType {
    Conversation,
    Action,
    Observation,
    Outcome,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Conversation => "conversation",
            EventType::Action => "action",
            EventType::Observation => "observation",
            EventType::Outcome => "outcome",
        }
    }

    pub fn parse(s: &str) -> Option<EventType> {
        [EventType::Conversation, EventType::Action, EventType::Observation, EventType::Outcome]
            .into_iter()
            .find(|e| e.as_str() == s)
    }
}

/// How an episode or a use of a skill ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Success,
    Failure,
    Partial,
    Unknown,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Failure => "failure",
            Outcome::Partial => "partial",
            Outcome::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Option<Outcome> {
        [Outcome::Success, Outcome::Failure, Outcome::Partial, Outcome::Unknown].into_iter().find(|o| o.as_str() == s)
    }
}

/// A memory as engram stores and recalls it. The API answers with
/// `http::response::MemoryResponse`, built from this.
///
/// The serde derives are a storage encoding, not the wire schema: working
/// memory and the skill cache keep memories as this JSON (in Redis, or in
/// the embedded database), and export files carry it (`transfer`). Fields
/// that belong to one tier only are left out of the other tiers' JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    pub id: Uuid,
    pub tier: Tier,
    pub agent_id: String,
    pub user_id: Option<String>,
    pub session_id: Option<String>,
    /// The text: the interaction, the fact, or what the skill does.
    pub content: String,
    /// 0 to 1, as written (or as the classifier scored it).
    pub importance: f64,
    pub retention: Retention,
    pub metadata: Map<String, Value>,
    /// Private memories are never shared with other agents.
    pub private: bool,
    /// When the remembered thing happened (client-given; defaults to the write time).
    pub occurred_at: DateTime<Utc>,
    /// When engram ingested it.
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// When engram forgets it; null is never.
    pub expires_at: Option<DateTime<Utc>>,
    pub access_count: i64,
    pub last_accessed_at: Option<DateTime<Utc>>,
    /// The model whose vector is stored for this memory; null when none is.
    pub embedding_model: Option<String>,

    // Episodic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_type: Option<EventType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,

    // Semantic.
    /// `user:{user_id}` or `agent:{agent_id}`: the scope of deduplication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_from: Option<DateTime<Utc>>,
    /// Set when a newer fact superseded this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_until: Option<DateTime<Utc>>,
    /// The fact this one replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supersedes: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_episode_id: Option<Uuid>,
    /// Where the fact came from (set by engram, not the writer): it decides
    /// contradictions before confidence does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<super::facts::Source>,
    /// Set on a candidate: a fact that lost its slot to this current fact.
    /// Candidates are listed with `include_superseded` and in history, never recalled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contested_by: Option<Uuid>,

    // Procedural.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger_pattern: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_sequence: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_count: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_count: Option<i32>,
    /// success / (success + failure); 0 before any outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_rate: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub avg_reward: Option<f64>,
    /// Incremented on every upsert of the skill.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<i32>,

    /// Set on a copy another agent shared: where it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<super::share::Provenance>,
}

impl Memory {
    /// Whether engram has forgotten this memory as of `now`, even if no sweep
    /// has deleted it yet.
    pub fn is_expired(&self, now: DateTime<Utc>) -> bool {
        self.expires_at.is_some_and(|e| e <= now)
    }
}

/// A memory as a write left it.
#[derive(Debug, Clone)]
pub struct WrittenMemory {
    pub memory: Memory,
    /// True when an identical fact already existed and its id is returned.
    pub deduplicated: bool,
}

/// A validated write, tier and importance already decided.
#[derive(Debug, Clone, PartialEq)]
pub struct NewMemory {
    pub id: Uuid,
    pub tier: Tier,
    pub agent_id: String,
    pub user_id: Option<String>,
    pub session_id: Option<String>,
    pub content: String,
    pub importance: f64,
    pub retention: Retention,
    pub metadata: Map<String, Value>,
    pub private: bool,
    pub occurred_at: Option<DateTime<Utc>>,
    pub event_type: Option<EventType>,
    pub outcome: Option<Outcome>,
    pub subject: Option<String>,
    pub predicate: Option<String>,
    pub object: Option<String>,
    pub confidence: Option<f64>,
    pub source_episode_id: Option<Uuid>,
    pub skill_name: Option<String>,
    pub trigger_pattern: Option<String>,
    pub policy: Option<Value>,
    pub tool_sequence: Option<Value>,
    pub reward: Option<f64>,
}

impl NewMemory {
    /// The dedup scope of a fact: the user's when one is named, else the agent's.
    pub fn namespace(&self) -> String {
        namespace(&self.agent_id, self.user_id.as_deref())
    }
}

/// Whether a memory owned by `owner` (its `user_id`) is in a search's user
/// scope: with a user given, that user's memories and the memories of no
/// user (the agent's own knowledge, its skills), never another user's;
/// without one, every memory of the agent. Search and context scope this
/// way on every backend; listing filters by `user_id` exactly.
pub fn in_user_scope(scope: Option<&str>, owner: Option<&str>) -> bool {
    match (scope, owner) {
        (Some(s), Some(o)) => s == o,
        _ => true,
    }
}

pub fn namespace(agent_id: &str, user_id: Option<&str>) -> String {
    match user_id {
        Some(u) => format!("user:{u}"),
        None => format!("agent:{agent_id}"),
    }
}

/// A validated partial update.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemoryPatch {
    pub content: Option<String>,
    pub importance: Option<f64>,
    /// A JSON merge patch (RFC 7396) applied to the stored metadata.
    pub metadata: Option<Map<String, Value>>,
    pub retention: Option<Retention>,
    /// With `retention`: how long the policy keeps a memory of that
    /// retention (`None`: forever), set by the service from the policy.
    pub lifetime: Option<chrono::Duration>,
}

impl MemoryPatch {
    /// Applies the patch to a memory at `now`. A new retention counts from
    /// the memory's ingestion, not from the patch.
    pub fn apply(&self, m: &mut Memory, now: DateTime<Utc>) {
        if let Some(c) = &self.content {
            m.content = c.clone();
        }
        if let Some(i) = self.importance {
            m.importance = i;
        }
        if let Some(md) = &self.metadata {
            merge_metadata(&mut m.metadata, md);
        }
        if let Some(r) = self.retention {
            m.retention = r;
            m.expires_at = self.lifetime.map(|d| m.created_at + d);
        }
        m.updated_at = now;
    }
}

/// Applies an RFC 7396 merge patch to a metadata object: keys set to null are
/// removed, objects merge recursively, anything else replaces.
pub fn merge_metadata(target: &mut Map<String, Value>, patch: &Map<String, Value>) {
    for (k, v) in patch {
        match v {
            Value::Null => {
                target.remove(k);
            }
            Value::Object(p) => {
                let entry = target.entry(k.clone()).or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(t) = entry {
                    merge_metadata(t, p);
                } else {
                    let mut fresh = Map::new();
                    merge_metadata(&mut fresh, p);
                    *entry = Value::Object(fresh);
                }
            }
            other => {
                target.insert(k.clone(), other.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_tier_has_its_default_retention() {
        assert_eq!(Tier::Working.default_retention(), Retention::Session);
        assert_eq!(Tier::Episodic.default_retention(), Retention::MediumTerm);
        assert_eq!(Tier::Semantic.default_retention(), Retention::LongTerm);
        assert_eq!(Tier::Procedural.default_retention(), Retention::Permanent);
    }

    #[test]
    fn namespace_is_the_users_when_given_else_the_agents() {
        assert_eq!(namespace("a1", Some("u9")), "user:u9");
        assert_eq!(namespace("a1", None), "agent:a1");
    }

    #[test]
    fn metadata_merge_patch_sets_removes_and_merges() {
        let mut target = json!({"a": 1, "b": {"c": 2, "d": 3}, "e": "x"}).as_object().unwrap().clone();
        let patch = json!({"a": null, "b": {"c": null, "f": 4}, "g": true}).as_object().unwrap().clone();
        merge_metadata(&mut target, &patch);
        assert_eq!(Value::Object(target), json!({"b": {"d": 3, "f": 4}, "e": "x", "g": true}));
    }
}
