//! A write as the client gave it, before classification decided its tier and
//! importance; and the per-tier rules checked once the tier is known.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::classify::ClassifyInput;
use super::content::normalize_key;
use super::memory::{EventType, NewMemory, Outcome, Retention, Tier};
use super::validate::FieldError;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Draft {
    pub tier: Option<Tier>,
    pub agent_id: String,
    pub user_id: Option<String>,
    pub session_id: Option<String>,
    pub content: String,
    pub importance: Option<f64>,
    pub retention: Option<Retention>,
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

impl Draft {
    pub fn classify_input(&self) -> ClassifyInput<'_> {
        ClassifyInput {
            content: &self.content,
            has_skill_fields: self.skill_name.is_some()
                || self.trigger_pattern.is_some()
                || self.policy.is_some()
                || self.tool_sequence.is_some()
                || self.reward.is_some(),
            has_fact_fields: self.subject.is_some()
                || self.predicate.is_some()
                || self.object.is_some()
                || self.confidence.is_some()
                || self.source_episode_id.is_some(),
            event_type: self.event_type,
            outcome: self.outcome,
        }
    }

    /// Checks the fields against the decided tier and builds the write.
    /// `at` is the JSON pointer of this draft (`""` or `/memories/3`).
    pub fn finish(self, at: &str, tier: Tier, importance: f64) -> Result<NewMemory, FieldError> {
        let not_for = |field: &str, tiers: &str| {
            FieldError::new(format!("{at}/{field}"), format!("applies to {tiers} memories only, not {}", tier.as_str()))
        };
        if tier != Tier::Episodic && self.event_type.is_some() {
            return Err(not_for("event_type", "episodic"));
        }
        if !matches!(tier, Tier::Episodic | Tier::Procedural) && self.outcome.is_some() {
            return Err(not_for("outcome", "episodic and procedural"));
        }
        if tier != Tier::Semantic {
            for (name, given) in [
                ("subject", self.subject.is_some()),
                ("predicate", self.predicate.is_some()),
                ("object", self.object.is_some()),
                ("confidence", self.confidence.is_some()),
                ("source_episode_id", self.source_episode_id.is_some()),
            ] {
                if given {
                    return Err(not_for(name, "semantic"));
                }
            }
        }
        if tier != Tier::Procedural {
            for (name, given) in [
                ("skill_name", self.skill_name.is_some()),
                ("trigger_pattern", self.trigger_pattern.is_some()),
                ("policy", self.policy.is_some()),
                ("tool_sequence", self.tool_sequence.is_some()),
                ("reward", self.reward.is_some()),
            ] {
                if given {
                    return Err(not_for(name, "procedural"));
                }
            }
        }
        let retention = self.retention.unwrap_or(tier.default_retention());
        match tier {
            Tier::Working => {
                if self.session_id.is_none() {
                    return Err(FieldError::new(format!("{at}/session_id"), "is required for working memory"));
                }
                if retention == Retention::Permanent {
                    return Err(FieldError::new(
                        format!("{at}/retention"),
                        "working memory must expire; use long_term at most",
                    ));
                }
            }
            Tier::Procedural if self.skill_name.is_none() => {
                return Err(FieldError::new(format!("{at}/skill_name"), "is required for procedural memory"));
            }
            Tier::Semantic if self.subject.is_some() != self.predicate.is_some() => {
                let missing = if self.subject.is_none() { "subject" } else { "predicate" };
                return Err(FieldError::new(format!("{at}/{missing}"), "subject and predicate go together"));
            }
            _ => {}
        }
        Ok(NewMemory {
            id: Uuid::now_v7(),
            tier,
            agent_id: self.agent_id,
            user_id: self.user_id,
            session_id: self.session_id,
            content: self.content,
            importance,
            retention,
            metadata: self.metadata,
            private: self.private,
            occurred_at: self.occurred_at,
            event_type: self.event_type,
            outcome: self.outcome,
            subject: self.subject.as_deref().map(normalize_key),
            predicate: self.predicate.as_deref().map(normalize_key),
            object: self.object,
            confidence: self.confidence,
            source_episode_id: self.source_episode_id,
            skill_name: self.skill_name,
            trigger_pattern: self.trigger_pattern,
            policy: self.policy,
            tool_sequence: self.tool_sequence,
            reward: self.reward,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft() -> Draft {
        Draft { agent_id: "a".into(), content: "hello there".into(), ..Default::default() }
    }

    #[test]
    fn working_memory_needs_a_session() {
        let err = draft().finish("/memories/2", Tier::Working, 0.5).unwrap_err();
        assert_eq!(err.field, "/memories/2/session_id");
        let ok = Draft { session_id: Some("s".into()), ..draft() }.finish("", Tier::Working, 0.5).unwrap();
        assert_eq!(ok.retention, Retention::Session);
    }

    #[test]
    fn fields_of_another_tier_are_refused_by_name() {
        let d = Draft { skill_name: Some("x".into()), ..draft() };
        assert_eq!(d.finish("", Tier::Episodic, 0.5).unwrap_err().field, "/skill_name");
        let d = Draft { event_type: Some(EventType::Action), ..draft() };
        assert_eq!(d.finish("", Tier::Semantic, 0.5).unwrap_err().field, "/event_type");
    }

    #[test]
    fn procedural_needs_a_skill_name_and_facts_pair_subject_with_predicate() {
        assert_eq!(draft().finish("", Tier::Procedural, 0.5).unwrap_err().field, "/skill_name");
        let d = Draft { subject: Some("user".into()), ..draft() };
        assert_eq!(d.finish("", Tier::Semantic, 0.5).unwrap_err().field, "/predicate");
    }

    #[test]
    fn subject_and_predicate_are_normalised() {
        let d = Draft { subject: Some(" The  User ".into()), predicate: Some("Favourite Colour".into()), ..draft() };
        let m = d.finish("", Tier::Semantic, 0.5).unwrap();
        assert_eq!(m.subject.as_deref(), Some("the user"));
        assert_eq!(m.predicate.as_deref(), Some("favourite colour"));
        assert_eq!(m.retention, Retention::LongTerm);
    }
}
