//! The memory as the API answers with it: `MemoryResponse` and the bodies
//! that embed it, built from domain values by `From`. The wire schema lives
//! here and nowhere else, so the domain `Memory` can change (or grow fields
//! the API must not show) without changing what clients see, and the OpenAPI
//! document describes exactly these types.
//!
//! Must not: hold rules. A conversion copies fields; it decides nothing but
//! which fields a tier's JSON leaves out.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::domain::scoring::Components;
use crate::domain::{EventType, Memory, Outcome, Retention, Tier, WrittenMemory};
use crate::recall::ScoredMemory;

/// A memory. Fields that belong to one tier only are absent from the JSON
/// of the other tiers. Numbers are the ones written: importance 0.4 reads
/// back as 0.4.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct MemoryResponse {
    pub id: Uuid,
    pub tier: Tier,
    pub agent_id: String,
    pub user_id: Option<String>,
    pub session_id: Option<String>,
    /// The text: the interaction, the fact, or what the skill does.
    pub content: String,
    /// 0 to 1.
    pub importance: f64,
    pub retention: Retention,
    #[schema(value_type = std::collections::HashMap<String, serde_json::Value>)]
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_type: Option<EventType>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,

    // Semantic.
    /// `user:{user_id}` or `agent:{agent_id}`: the scope of deduplication.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicate: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// 0 to 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub valid_from: Option<DateTime<Utc>>,
    /// Set when a newer fact superseded this one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub valid_until: Option<DateTime<Utc>>,
    /// The fact this one replaced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub supersedes: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_episode_id: Option<Uuid>,
    /// Where the fact came from, set by engram from the route and key that
    /// wrote it: user, agent, tool, shared or consolidated. It outranks
    /// confidence when facts contradict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<crate::domain::facts::Source>,
    /// Set on a candidate: a fact that lost its slot to the current fact
    /// named here. Candidates are listed with `include_superseded` and in
    /// history, never recalled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub contested_by: Option<Uuid>,

    // Procedural.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skill_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trigger_pattern: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<std::collections::HashMap<String, serde_json::Value>>)]
    pub policy: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<std::collections::HashMap<String, serde_json::Value>>>)]
    pub tool_sequence: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub success_count: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_count: Option<i32>,
    /// success / (success + failure); 0 before any outcome.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub success_rate: Option<f64>,
    /// The mean of the rewards reported, -1 to 1; 0 before any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub avg_reward: Option<f64>,
    /// Incremented on every upsert of the skill.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<i32>,

    /// Set on a copy another agent shared (`POST /v1/share`): where it came
    /// from. A copy is a snapshot: later changes to the original do not reach it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provenance: Option<ProvenanceResponse>,
}

/// Where a shared copy came from.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ProvenanceResponse {
    /// The agent that shared the memory.
    pub source_agent_id: String,
    /// The memory the copy was made from (it may have changed or gone since).
    pub source_memory_id: Uuid,
    /// The id of the API key that shared it (`keyless` without keys).
    pub shared_by: String,
    pub shared_at: DateTime<Utc>,
    /// The grant that allowed the share.
    pub grant_id: Uuid,
    /// What was redacted from the copy before it was made: kind → how many.
    pub redactions: std::collections::BTreeMap<String, u64>,
}

impl From<crate::domain::share::Provenance> for ProvenanceResponse {
    fn from(p: crate::domain::share::Provenance) -> Self {
        let crate::domain::share::Provenance {
            source_agent_id,
            source_memory_id,
            shared_by,
            shared_at,
            grant_id,
            redactions,
        } = p;
        ProvenanceResponse { source_agent_id, source_memory_id, shared_by, shared_at, grant_id, redactions }
    }
}

impl From<Memory> for MemoryResponse {
    fn from(m: Memory) -> Self {
        // Destructured, not read field by field: a field added to `Memory`
        // stops the build here until someone decides whether clients see it.
        let Memory {
            id,
            tier,
            agent_id,
            user_id,
            session_id,
            content,
            importance,
            retention,
            metadata,
            private,
            occurred_at,
            created_at,
            updated_at,
            expires_at,
            access_count,
            last_accessed_at,
            embedding_model,
            event_type,
            outcome,
            namespace,
            subject,
            predicate,
            object,
            confidence,
            valid_from,
            valid_until,
            supersedes,
            source_episode_id,
            source,
            contested_by,
            skill_name,
            trigger_pattern,
            policy,
            tool_sequence,
            success_count,
            failure_count,
            success_rate,
            avg_reward,
            version,
            provenance,
        } = m;
        MemoryResponse {
            id,
            tier,
            agent_id,
            user_id,
            session_id,
            content,
            importance,
            retention,
            metadata,
            private,
            occurred_at,
            created_at,
            updated_at,
            expires_at,
            access_count,
            last_accessed_at,
            embedding_model,
            event_type,
            outcome,
            namespace,
            subject,
            predicate,
            object,
            confidence,
            valid_from,
            valid_until,
            supersedes,
            source_episode_id,
            source,
            contested_by,
            skill_name,
            trigger_pattern,
            policy,
            tool_sequence,
            success_count,
            failure_count,
            success_rate,
            avg_reward,
            version,
            provenance: provenance.map(ProvenanceResponse::from),
        }
    }
}

/// A memory in a write response.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct WrittenMemoryResponse {
    #[serde(flatten)]
    pub memory: MemoryResponse,
    /// True when an identical fact already existed and its id is returned.
    pub deduplicated: bool,
}

impl From<WrittenMemory> for WrittenMemoryResponse {
    fn from(w: WrittenMemory) -> Self {
        WrittenMemoryResponse { memory: w.memory.into(), deduplicated: w.deduplicated }
    }
}

/// A search result: the memory, its score and the components it was summed from.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ScoredMemoryResponse {
    pub memory: MemoryResponse,
    pub score: f64,
    pub components: Components,
}

impl From<ScoredMemory> for ScoredMemoryResponse {
    fn from(s: ScoredMemory) -> Self {
        ScoredMemoryResponse { memory: s.memory.into(), score: s.score, components: s.components }
    }
}

/// The body of a write response.
#[derive(Debug, Serialize, ToSchema)]
pub struct WriteResponse {
    /// In request order.
    pub memories: Vec<WrittenMemoryResponse>,
}

/// The JSON of a write response, in request order. A fresh response and the
/// one remembered for an idempotency key are both this, so a replay answers
/// the same JSON as the first request did.
pub fn write_body(items: &[WrittenMemory]) -> Value {
    let body = WriteResponse { memories: items.iter().cloned().map(WrittenMemoryResponse::from).collect() };
    // Cannot fail: every map in these types has string keys.
    serde_json::to_value(body).expect("a write response is JSON")
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use serde_json::json;

    use super::*;

    fn memory(tier: Tier) -> Memory {
        let t = Utc.with_ymd_and_hms(2026, 5, 1, 12, 0, 0).unwrap();
        Memory {
            id: Uuid::from_u128(7),
            tier,
            agent_id: "a".into(),
            user_id: Some("u".into()),
            session_id: None,
            content: "The lemon tree stands on the balcony.".into(),
            importance: 0.4,
            retention: Retention::LongTerm,
            metadata: json!({"k": "v"}).as_object().unwrap().clone(),
            private: false,
            occurred_at: t,
            created_at: t,
            updated_at: t,
            expires_at: None,
            access_count: 2,
            last_accessed_at: None,
            embedding_model: None,
            event_type: None,
            outcome: None,
            namespace: None,
            subject: None,
            predicate: None,
            object: None,
            confidence: None,
            valid_from: None,
            valid_until: None,
            supersedes: None,
            source_episode_id: None,
            source: None,
            contested_by: None,
            skill_name: None,
            trigger_pattern: None,
            policy: None,
            tool_sequence: None,
            success_count: None,
            failure_count: None,
            success_rate: None,
            avg_reward: None,
            version: None,
            provenance: None,
        }
    }

    fn fact() -> Memory {
        Memory {
            namespace: Some("user:u".into()),
            subject: Some("lemon tree".into()),
            predicate: Some("stands on".into()),
            confidence: Some(0.9),
            valid_from: Some(Utc.with_ymd_and_hms(2026, 5, 1, 12, 0, 0).unwrap()),
            ..memory(Tier::Semantic)
        }
    }

    fn skill() -> Memory {
        Memory {
            skill_name: Some("water".into()),
            tool_sequence: Some(json!([{"tool": "can"}])),
            success_count: Some(2),
            failure_count: Some(1),
            success_rate: Some(2.0 / 3.0),
            avg_reward: Some(0.3),
            version: Some(3),
            ..memory(Tier::Procedural)
        }
    }

    #[test]
    fn a_memory_response_has_the_fields_of_its_tier_and_the_numbers_as_written() {
        let got = serde_json::to_value(MemoryResponse::from(fact())).unwrap();
        assert_eq!(
            got,
            json!({
                "id": "00000000-0000-0000-0000-000000000007", "tier": "semantic", "agent_id": "a", "user_id": "u",
                "session_id": null, "content": "The lemon tree stands on the balcony.", "importance": 0.4,
                "retention": "long_term", "metadata": {"k": "v"}, "private": false,
                "occurred_at": "2026-05-01T12:00:00Z", "created_at": "2026-05-01T12:00:00Z",
                "updated_at": "2026-05-01T12:00:00Z", "expires_at": null, "access_count": 2,
                "last_accessed_at": null, "embedding_model": null, "namespace": "user:u", "subject": "lemon tree",
                "predicate": "stands on", "confidence": 0.9, "valid_from": "2026-05-01T12:00:00Z"
            })
        );
        let text = serde_json::to_string(&MemoryResponse::from(skill())).unwrap();
        assert!(text.contains(r#""importance":0.4,"#), "{text}");
        assert!(text.contains(r#""avg_reward":0.3,"#), "{text}");
        assert!(text.contains(r#""success_rate":0.6666666666666666,"#), "{text}");
        assert!(!text.contains("confidence") && !text.contains("event_type"), "{text}");
    }

    #[test]
    fn the_wire_json_is_the_shape_the_domain_memory_was_serialised_as() {
        // Until the DTOs, the domain type was the wire type: clients must see
        // the same fields, omitted in the same places.
        for m in [memory(Tier::Working), memory(Tier::Episodic), fact(), skill()] {
            let wire = serde_json::to_value(MemoryResponse::from(m.clone())).unwrap();
            assert_eq!(wire, serde_json::to_value(&m).unwrap(), "{:?}", m.tier);
        }
    }

    #[test]
    fn a_write_body_flattens_each_memory_beside_its_dedup_flag_in_order() {
        let items = [
            WrittenMemory { memory: fact(), deduplicated: true },
            WrittenMemory { memory: skill(), deduplicated: false },
        ];
        let body = write_body(&items);
        let memories = body["memories"].as_array().unwrap();
        assert_eq!(body.as_object().unwrap().len(), 1);
        assert_eq!(memories.len(), 2);
        let mut first = serde_json::to_value(MemoryResponse::from(fact())).unwrap();
        first["deduplicated"] = json!(true);
        assert_eq!(memories[0], first);
        assert_eq!(memories[1]["deduplicated"], false);
        assert_eq!(memories[1]["avg_reward"], json!(0.3));
    }

    #[test]
    fn a_scored_memory_carries_its_memory_score_and_components() {
        let components = Components { relevance: 0.5, recency: 1.0, importance: 0.4, frequency: 0.0, tier_bonus: 0.2 };
        let scored = ScoredMemory { memory: skill(), score: 0.455, components };
        let got = serde_json::to_value(ScoredMemoryResponse::from(scored)).unwrap();
        assert_eq!(got["memory"], serde_json::to_value(MemoryResponse::from(skill())).unwrap());
        assert_eq!(got["score"], json!(0.455));
        assert_eq!(
            got["components"],
            json!({"relevance": 0.5, "recency": 1.0, "importance": 0.4, "frequency": 0.0, "tier_bonus": 0.2})
        );
    }
}
