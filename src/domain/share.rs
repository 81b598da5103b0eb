//! Sharing between agents: who may share with whom (grants, teams), which
//! memories may leave the sender, what a copy looks like and where it came
//! from (provenance).
//!
//! A share copies: each shared memory is written into every target agent's
//! memory through the ordinary write path, so dedup and the contradiction
//! rule apply there as to any write, with the trust of a shared memory
//! (`facts::Source::Shared`, below the target's own facts). A copy is a
//! snapshot: later changes to the original do not reach it. What identifies
//! a person or opens a door is redacted before the copy is made
//! (`domain::redact`); the copy records which redactions were applied.
//!
//! Must not: read or write storage, or know about HTTP.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::draft::Draft;
use super::memory::{Memory, Tier};

/// Where a shared copy came from, stored with the copy and shown with it
/// on every route.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// The agent that shared the memory.
    pub source_agent_id: String,
    /// The memory the copy was made from (it may have changed or gone since).
    pub source_memory_id: Uuid,
    /// The id of the API key that shared it (`keyless` without keys).
    pub shared_by: String,
    pub shared_at: DateTime<Utc>,
    /// The grant that allowed it.
    pub grant_id: Uuid,
    /// What was redacted from the copy: kind → how many.
    pub redactions: BTreeMap<String, u64>,
}

/// How long a copy lives from `now`: its own retention's `lifetime`, but
/// never past its source's expiry. A copy is a snapshot of the content, not
/// a way to keep data longer than the sender's retention allows; `None` is
/// forever.
pub fn copy_lifetime(
    lifetime: Option<chrono::Duration>,
    source_expires_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Option<chrono::Duration> {
    match (lifetime, source_expires_at) {
        (Some(own), Some(end)) => Some(own.min(end - now)),
        (None, Some(end)) => Some(end - now),
        (own, None) => own,
    }
}

/// Whom a grant lets an agent share with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrantTarget {
    /// These agents.
    Agents(Vec<String>),
    /// Every member of the team at the time of a share.
    Team(String),
}

/// Permission for one agent to share with others, within a tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Grant {
    pub id: Uuid,
    pub from_agent_id: String,
    pub target: GrantTarget,
    /// The key id that made it (`config` for grants from the configuration).
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

impl Grant {
    pub fn active(&self) -> bool {
        self.revoked_at.is_none()
    }
}

/// The tenant's teams: name → member agents.
pub type Teams = BTreeMap<String, BTreeSet<String>>;

/// The grant that lets `from` share with `to`, if any: the oldest active one
/// naming `to`, or naming a team `to` belongs to.
pub fn grant_for<'a>(grants: &'a [Grant], teams: &Teams, from: &str, to: &str) -> Option<&'a Grant> {
    grants
        .iter()
        .filter(|g| g.active() && g.from_agent_id == from)
        .filter(|g| match &g.target {
            GrantTarget::Agents(agents) => agents.iter().any(|a| a == to),
            GrantTarget::Team(team) => teams.get(team).is_some_and(|members| members.contains(to)),
        })
        .min_by_key(|g| (g.created_at, g.id))
}

/// Why a memory was not shared; reported per memory, never dropped silently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    /// No live memory of the sender has this id.
    NotFound,
    /// Marked private: never shared.
    Private,
    /// Working memory is the sender's scratchpad: never shared.
    WorkingMemory,
    /// A fact that is no longer current (superseded, or a candidate).
    NotCurrent,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NotFound => "not_found",
            Refusal::Private => "private",
            Refusal::WorkingMemory => "working_memory",
            Refusal::NotCurrent => "not_current",
        }
    }
}

/// Whether `m` may leave `sender` at `now`.
pub fn refusal(m: &Memory, sender: &str, now: DateTime<Utc>) -> Option<Refusal> {
    if m.agent_id != sender || m.is_expired(now) {
        Some(Refusal::NotFound)
    } else if m.tier == Tier::Working {
        Some(Refusal::WorkingMemory)
    } else if m.private {
        Some(Refusal::Private)
    } else if m.tier == Tier::Semantic && (m.valid_until.is_some() || m.contested_by.is_some()) {
        Some(Refusal::NotCurrent)
    } else {
        None
    }
}

/// Text redaction as sharing uses it: the redacted text, and kind → count.
pub type Redact<'a> = &'a dyn Fn(&str) -> (String, BTreeMap<String, u64>);

/// The draft of `m`'s copy for agent `to`, every text it carries redacted
/// (content, metadata values, a fact's subject/predicate/object, a skill's
/// name, trigger and the text inside its policy and tool sequence), and
/// what was redacted. Counters, access statistics and the session are not
/// copied: the copy starts its own life in the target.
pub fn copy_draft(m: &Memory, to: &str, redact: Redact<'_>) -> (Draft, BTreeMap<String, u64>) {
    let mut applied: BTreeMap<String, u64> = BTreeMap::new();
    let mut text = |s: &str| {
        let (out, found) = redact(s);
        for (kind, n) in found {
            *applied.entry(kind).or_default() += n;
        }
        out
    };
    let content = text(&m.content);
    let metadata = redact_map(&m.metadata, &mut text);
    let subject = m.subject.as_deref().map(&mut text);
    let predicate = m.predicate.as_deref().map(&mut text);
    let object = m.object.as_deref().map(&mut text);
    let skill_name = m.skill_name.as_deref().map(&mut text);
    let trigger_pattern = m.trigger_pattern.as_deref().map(&mut text);
    let policy = m.policy.as_ref().map(|v| redact_value(v, &mut text));
    let tool_sequence = m.tool_sequence.as_ref().map(|v| redact_value(v, &mut text));
    let draft = Draft {
        tier: Some(m.tier),
        agent_id: to.to_string(),
        user_id: m.user_id.clone(),
        session_id: None,
        content,
        importance: Some(m.importance),
        retention: Some(m.retention),
        metadata,
        private: false,
        occurred_at: Some(m.occurred_at),
        event_type: m.event_type,
        outcome: m.outcome,
        subject,
        predicate,
        object,
        confidence: m.confidence,
        // The episode it came from is the sender's, not the target's.
        source_episode_id: None,
        skill_name,
        trigger_pattern,
        policy,
        tool_sequence,
        reward: None,
    };
    (draft, applied)
}

fn redact_map(map: &Map<String, Value>, text: &mut dyn FnMut(&str) -> String) -> Map<String, Value> {
    map.iter().map(|(k, v)| (k.clone(), redact_value(v, text))).collect()
}

/// Every string inside `v` redacted; keys and other values unchanged.
fn redact_value(v: &Value, text: &mut dyn FnMut(&str) -> String) -> Value {
    match v {
        Value::String(s) => Value::String(text(s)),
        Value::Array(items) => Value::Array(items.iter().map(|i| redact_value(i, text)).collect()),
        Value::Object(map) => Value::Object(redact_map(map, text)),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(day: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, day, 12, 0, 0).unwrap()
    }

    fn grant(id: u128, from: &str, target: GrantTarget, day: u32) -> Grant {
        Grant {
            id: Uuid::from_u128(id),
            from_agent_id: from.into(),
            target,
            created_by: "k".into(),
            created_at: at(day),
            revoked_at: None,
        }
    }

    #[test]
    fn a_grant_names_the_agent_or_a_team_it_belongs_to_and_the_oldest_wins() {
        let teams: Teams = BTreeMap::from([("ops".into(), BTreeSet::from(["c".into(), "d".into()]))]);
        let mut grants = vec![
            grant(1, "a", GrantTarget::Agents(vec!["b".into()]), 2),
            grant(2, "a", GrantTarget::Team("ops".into()), 3),
            grant(3, "a", GrantTarget::Agents(vec!["c".into()]), 1),
        ];
        assert_eq!(grant_for(&grants, &teams, "a", "b").map(|g| g.id), Some(Uuid::from_u128(1)));
        assert_eq!(grant_for(&grants, &teams, "a", "c").map(|g| g.id), Some(Uuid::from_u128(3)));
        assert_eq!(grant_for(&grants, &teams, "a", "d").map(|g| g.id), Some(Uuid::from_u128(2)));
        // Grants are one way, and name agents exactly.
        assert!(grant_for(&grants, &teams, "b", "a").is_none());
        assert!(grant_for(&grants, &teams, "a", "B").is_none());
        assert!(grant_for(&grants, &teams, "a", "e").is_none());
        // A revoked grant allows nothing.
        grants[2].revoked_at = Some(at(4));
        assert_eq!(grant_for(&grants, &teams, "a", "c").map(|g| g.id), Some(Uuid::from_u128(2)));
        // A team that does not exist has no members.
        let grants = vec![grant(4, "a", GrantTarget::Team("nobody".into()), 1)];
        assert!(grant_for(&grants, &teams, "a", "c").is_none());
    }

    fn memory(tier: Tier) -> Memory {
        let mut m: Memory = serde_json::from_value(serde_json::json!({
            "id": Uuid::from_u128(9), "tier": tier.as_str(), "agent_id": "a", "user_id": "u", "session_id": "s",
            "content": "Mail ann@example.com", "importance": 0.4, "retention": "long_term",
            "metadata": {"note": "call ann@example.com", "n": 3, "list": ["ann@example.com", 1]},
            "private": false, "occurred_at": at(1), "created_at": at(1), "updated_at": at(1),
            "expires_at": null, "access_count": 7, "last_accessed_at": at(2), "embedding_model": null
        }))
        .unwrap();
        if tier == Tier::Semantic {
            m.subject = Some("ann@example.com".into());
            m.predicate = Some("works_at".into());
            m.object = Some("Acme".into());
            m.confidence = Some(0.8);
        }
        m
    }

    #[test]
    fn only_the_senders_current_shareable_memories_leave() {
        let now = at(3);
        assert_eq!(refusal(&memory(Tier::Episodic), "a", now), None);
        assert_eq!(refusal(&memory(Tier::Episodic), "b", now), Some(Refusal::NotFound));
        assert_eq!(refusal(&memory(Tier::Working), "a", now), Some(Refusal::WorkingMemory));
        let mut private = memory(Tier::Procedural);
        private.private = true;
        assert_eq!(refusal(&private, "a", now), Some(Refusal::Private));
        let mut old = memory(Tier::Semantic);
        old.valid_until = Some(at(2));
        assert_eq!(refusal(&old, "a", now), Some(Refusal::NotCurrent));
        let mut expired = memory(Tier::Episodic);
        expired.expires_at = Some(at(2));
        assert_eq!(refusal(&expired, "a", now), Some(Refusal::NotFound));
    }

    #[test]
    fn a_copy_carries_every_text_redacted_and_counts_what_went() {
        let redact = |s: &str| {
            let n = s.matches("ann@example.com").count() as u64;
            let found = if n > 0 { BTreeMap::from([("email".to_string(), n)]) } else { BTreeMap::new() };
            (s.replace("ann@example.com", "[email]"), found)
        };
        let (draft, applied) = copy_draft(&memory(Tier::Semantic), "b", &redact);
        assert_eq!(draft.agent_id, "b");
        assert_eq!(draft.content, "Mail [email]");
        assert_eq!(draft.subject.as_deref(), Some("[email]"));
        assert_eq!(draft.object.as_deref(), Some("Acme"));
        assert_eq!(
            Value::Object(draft.metadata),
            serde_json::json!({"note": "call [email]", "n": 3, "list": ["[email]", 1]})
        );
        assert_eq!(applied, BTreeMap::from([("email".to_string(), 4)]));
        // The copy starts its own life: no session, not private, the same user.
        assert_eq!((draft.session_id, draft.private, draft.user_id.as_deref()), (None, false, Some("u")));
        assert_eq!((draft.importance, draft.confidence), (Some(0.4), Some(0.8)));
    }

    #[test]
    fn a_copy_never_outlives_its_source() {
        let now = at(10);
        let day = chrono::Duration::days(1);
        assert_eq!(super::copy_lifetime(Some(day * 30), Some(at(12)), now), Some(at(12) - now));
        assert_eq!(super::copy_lifetime(Some(day), Some(now + day * 30), now), Some(day));
        assert_eq!(super::copy_lifetime(None, Some(at(12)), now), Some(at(12) - now));
        assert_eq!(super::copy_lifetime(Some(day), None, now), Some(day));
        assert_eq!(super::copy_lifetime(None, None, now), None);
    }
}
