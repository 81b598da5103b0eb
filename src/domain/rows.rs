//! How a write becomes a stored row: the fields engram sets itself
//! (timestamps, expiry, counters, validity) and the procedural upsert's
//! arithmetic. Every backend stores what these functions return, so the
//! rules are the same wherever the row lives.
//!
//! Must not: touch storage, or decide a fact's contradiction (`facts.rs`).

use chrono::{DateTime, Utc};

use super::facts::Source;
use super::{Memory, NewMemory, Outcome, Tier};

/// The row of a new persistent memory written at `now`. `expires_at` comes
/// from the retention policy; a fact's validity and provenance are filled in
/// by the write path (`source`, `supersedes`, `contested`).
pub fn new_row(m: &NewMemory, now: DateTime<Utc>, expires_at: Option<DateTime<Utc>>, source: Source) -> Memory {
    let occurred_at = m.occurred_at.unwrap_or(now);
    let semantic = m.tier == Tier::Semantic;
    let procedural = m.tier == Tier::Procedural;
    let (success, failure) = outcome_counts(m.outcome);
    Memory {
        id: m.id,
        tier: m.tier,
        agent_id: m.agent_id.clone(),
        user_id: m.user_id.clone(),
        session_id: m.session_id.clone(),
        content: m.content.clone(),
        importance: m.importance,
        retention: m.retention,
        metadata: m.metadata.clone(),
        private: m.private,
        occurred_at,
        created_at: now,
        updated_at: now,
        expires_at,
        access_count: 0,
        last_accessed_at: None,
        embedding_model: None,
        event_type: (m.tier == Tier::Episodic).then(|| m.event_type.unwrap_or(super::EventType::Conversation)),
        outcome: m.outcome.filter(|_| m.tier == Tier::Episodic),
        namespace: semantic.then(|| m.namespace()),
        subject: m.subject.clone().filter(|_| semantic),
        predicate: m.predicate.clone().filter(|_| semantic),
        object: m.object.clone().filter(|_| semantic),
        confidence: semantic.then(|| m.confidence.unwrap_or(DEFAULT_CONFIDENCE)),
        // A fact is valid from when it was observed.
        valid_from: semantic.then_some(occurred_at),
        valid_until: None,
        supersedes: None,
        source_episode_id: m.source_episode_id.filter(|_| semantic),
        source: semantic.then_some(source),
        contested_by: None,
        skill_name: m.skill_name.clone().filter(|_| procedural),
        trigger_pattern: m.trigger_pattern.clone().filter(|_| procedural),
        policy: m.policy.clone().filter(|_| procedural),
        tool_sequence: m.tool_sequence.clone().filter(|_| procedural),
        success_count: procedural.then_some(success),
        failure_count: procedural.then_some(failure),
        success_rate: procedural.then(|| success_rate(success, failure)),
        avg_reward: procedural.then(|| m.reward.unwrap_or(0.0)),
        version: procedural.then_some(1),
        provenance: None,
    }
}

/// A fact's confidence when the writer gives none.
pub const DEFAULT_CONFIDENCE: f64 = 0.7;

/// How one reported outcome moves a skill's (success, failure) counters.
fn outcome_counts(outcome: Option<Outcome>) -> (i32, i32) {
    match outcome {
        Some(Outcome::Success) => (1, 0),
        Some(Outcome::Failure) => (0, 1),
        _ => (0, 0),
    }
}

/// success / (success + failure); 0 before any outcome.
pub fn success_rate(success: i32, failure: i32) -> f64 {
    if success + failure == 0 { 0.0 } else { f64::from(success) / f64::from(success + failure) }
}

/// A stored skill and how many rewards its `avg_reward` averages.
#[derive(Debug, Clone, PartialEq)]
pub struct SkillState {
    pub skill: Memory,
    pub reward_count: i32,
}

/// Writing a skill the agent already has: the new text and the fields given
/// replace the old ones (fields not given keep theirs), an outcome moves the
/// counters, a reward moves the running mean, metadata merges shallowly (new
/// keys win), and the version goes up by one. The id, the ingestion time and
/// the access statistics stay. `upserted` is the new row as `new_row` built it.
pub fn upsert_skill(stored: &SkillState, upserted: &Memory, reward: Option<f64>) -> SkillState {
    let old = &stored.skill;
    let (success, failure) = (
        old.success_count.unwrap_or(0) + upserted.success_count.unwrap_or(0),
        old.failure_count.unwrap_or(0) + upserted.failure_count.unwrap_or(0),
    );
    let (avg_reward, reward_count) = match reward {
        None => (old.avg_reward.unwrap_or(0.0), stored.reward_count),
        Some(r) => (running_mean(old.avg_reward.unwrap_or(0.0), stored.reward_count, r), stored.reward_count + 1),
    };
    let mut metadata = old.metadata.clone();
    metadata.extend(upserted.metadata.iter().map(|(k, v)| (k.clone(), v.clone())));
    let skill = Memory {
        id: old.id,
        created_at: old.created_at,
        access_count: old.access_count,
        last_accessed_at: old.last_accessed_at,
        user_id: upserted.user_id.clone().or_else(|| old.user_id.clone()),
        session_id: upserted.session_id.clone().or_else(|| old.session_id.clone()),
        trigger_pattern: upserted.trigger_pattern.clone().or_else(|| old.trigger_pattern.clone()),
        policy: upserted.policy.clone().or_else(|| old.policy.clone()),
        tool_sequence: upserted.tool_sequence.clone().or_else(|| old.tool_sequence.clone()),
        success_count: Some(success),
        failure_count: Some(failure),
        success_rate: Some(success_rate(success, failure)),
        avg_reward: Some(avg_reward),
        version: Some(old.version.unwrap_or(1) + 1),
        metadata,
        ..upserted.clone()
    };
    SkillState { skill, reward_count }
}

/// A skill with outcomes its episodes reported added by consolidation: the
/// counters and the success rate move, and nothing else (the text, the
/// version and the rewards are the agent's to change).
pub fn count_outcomes(skill: &Memory, successes: i32, failures: i32, now: DateTime<Utc>) -> Memory {
    let success = skill.success_count.unwrap_or(0).saturating_add(successes);
    let failure = skill.failure_count.unwrap_or(0).saturating_add(failures);
    Memory {
        success_count: Some(success),
        failure_count: Some(failure),
        success_rate: Some(success_rate(success, failure)),
        updated_at: now,
        ..skill.clone()
    }
}

/// The mean of `count` rewards averaging `mean`, and one more.
fn running_mean(mean: f64, count: i32, reward: f64) -> f64 {
    (mean * f64::from(count) + reward) / f64::from(count + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use serde_json::json;
    use uuid::Uuid;

    fn skill_write(content: &str, outcome: Option<Outcome>, reward: Option<f64>) -> NewMemory {
        NewMemory {
            id: Uuid::from_u128(7),
            tier: Tier::Procedural,
            agent_id: "a1".into(),
            user_id: None,
            session_id: Some("s2".into()),
            content: content.into(),
            importance: 0.6,
            retention: crate::domain::Retention::Permanent,
            metadata: json!({"b": 2, "c": 3}).as_object().unwrap().clone(),
            private: false,
            occurred_at: None,
            event_type: None,
            outcome,
            subject: None,
            predicate: None,
            object: None,
            confidence: None,
            source_episode_id: None,
            skill_name: Some("book_flight".into()),
            trigger_pattern: None,
            policy: None,
            tool_sequence: None,
            reward,
        }
    }

    #[test]
    fn a_new_skill_starts_its_counters_from_its_outcome_and_reward() {
        let t0 = Utc.with_ymd_and_hms(2026, 3, 1, 12, 0, 0).unwrap();
        let row = new_row(&skill_write("v1", Some(Outcome::Success), Some(0.5)), t0, None, Source::Agent);
        assert_eq!((row.success_count, row.failure_count, row.success_rate), (Some(1), Some(0), Some(1.0)));
        assert_eq!((row.avg_reward, row.version, row.source), (Some(0.5), Some(1), None));
        assert_eq!(row.occurred_at, t0);
        assert_eq!(row.confidence, None);
    }

    #[test]
    fn upserting_a_skill_moves_counters_mean_version_and_merges_metadata() {
        let t0 = Utc.with_ymd_and_hms(2026, 3, 1, 12, 0, 0).unwrap();
        let t1 = t0 + chrono::Duration::hours(1);
        let mut first = new_row(&skill_write("v1", Some(Outcome::Success), Some(0.5)), t0, None, Source::Agent);
        first.metadata = json!({"a": 1, "b": 1}).as_object().unwrap().clone();
        first.trigger_pattern = Some("when booking".into());
        first.access_count = 4;
        let stored = SkillState { skill: first, reward_count: 1 };

        let mut second = skill_write("v2", Some(Outcome::Failure), Some(-0.25));
        second.id = Uuid::from_u128(8);
        let upserted = new_row(&second, t1, None, Source::Agent);
        let next = upsert_skill(&stored, &upserted, Some(-0.25));
        let s = &next.skill;
        // The stored id, ingestion time and access count stay.
        assert_eq!((s.id, s.created_at, s.access_count), (Uuid::from_u128(7), t0, 4));
        assert_eq!((s.content.as_str(), s.updated_at), ("v2", t1));
        // One success and one failure: rate 0.5. Mean of 0.5 and -0.25 = 0.125.
        assert_eq!((s.success_count, s.failure_count, s.success_rate), (Some(1), Some(1), Some(0.5)));
        assert_eq!((s.avg_reward, next.reward_count, s.version), (Some(0.125), 2, Some(2)));
        // Not given this time: kept.
        assert_eq!(s.trigger_pattern.as_deref(), Some("when booking"));
        assert_eq!(s.metadata, *json!({"a": 1, "b": 2, "c": 3}).as_object().unwrap());

        // No reward: the mean and its count stay.
        let third = upsert_skill(&next, &new_row(&skill_write("v3", None, None), t1, None, Source::Agent), None);
        assert_eq!((third.skill.avg_reward, third.reward_count, third.skill.version), (Some(0.125), 2, Some(3)));
    }

    #[test]
    fn counting_outcomes_moves_only_the_counters() {
        let t0 = DateTime::from_timestamp(1_780_000_000, 0).unwrap();
        let t1 = t0 + chrono::Duration::hours(1);
        let skill = new_row(&skill_write("v1", Some(Outcome::Success), Some(0.5)), t0, None, Source::Agent);
        let next = count_outcomes(&skill, 2, 1, t1);
        assert_eq!((next.success_count, next.failure_count), (Some(3), Some(1)));
        assert_eq!(next.success_rate, Some(0.75));
        assert_eq!((next.version, next.avg_reward, &next.content), (skill.version, skill.avg_reward, &skill.content));
        assert_eq!(next.updated_at, t1);
    }

    #[test]
    fn the_running_mean_adds_one_reward() {
        // (0.5 * 3 + 0.25) / 4 = 0.4375, exact in binary.
        assert_eq!(running_mean(0.5, 3, 0.25), 0.4375);
        assert_eq!(running_mean(0.0, 0, -1.0), -1.0);
    }
}
