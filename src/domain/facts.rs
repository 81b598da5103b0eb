//! The rules of semantic memory: where a fact comes from, which of two
//! contradicting facts is believed, and which predicates may hold several
//! values at once.
//!
//! A fact with a subject and a predicate is a claim about one slot
//! `(tenant, agent, namespace, subject, predicate)`. A single-valued slot
//! holds at most one current fact: a new claim either takes the slot (the
//! facts it beats are superseded: `valid_until` set, kept for history) or is
//! kept as a *candidate* (stored, listed in the current fact's history, never
//! recalled). A multi-valued predicate ("likes", "has_pet") makes the object
//! part of the slot, so "likes tea" and "likes jazz" are two slots and never
//! contradict each other; the same object said again is one slot.
//!
//! Must not: touch storage. The write path in `store::write` asks the store
//! for the slot's current facts and applies what `contest` decides.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Where a fact came from, set by the server from the route and the key that
/// wrote it, never by the client. Ordered by trust, most trusted first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Stated by the user (a key configured as speaking for users).
    User,
    /// Written by the agent through the memory routes (the default).
    Agent,
    /// Produced by a tool the agent ran.
    Tool,
    /// Received from another agent through sharing.
    Shared,
    /// Derived by background consolidation.
    Consolidated,
}

impl Source {
    pub const ALL: [Source; 5] = [Source::User, Source::Agent, Source::Tool, Source::Shared, Source::Consolidated];

    pub fn as_str(self) -> &'static str {
        match self {
            Source::User => "user",
            Source::Agent => "agent",
            Source::Tool => "tool",
            Source::Shared => "shared",
            Source::Consolidated => "consolidated",
        }
    }

    pub fn parse(s: &str) -> Option<Source> {
        Source::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// Higher is more trusted.
    fn trust(self) -> u8 {
        match self {
            Source::User => 4,
            Source::Agent => 3,
            Source::Tool => 2,
            Source::Shared => 1,
            Source::Consolidated => 0,
        }
    }
}

/// What the contradiction rule weighs of a fact.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Claim {
    pub source: Source,
    pub confidence: f64,
    /// When engram recorded the fact (its ingestion time).
    pub recorded_at: DateTime<Utc>,
}

impl Claim {
    /// Whether this claim wins the slot from `other`: the more trusted source
    /// wins; at equal trust the higher confidence; at equal confidence the
    /// later record (a belief restated with the same weight is updated).
    pub fn beats(&self, other: &Claim) -> bool {
        let key = |c: &Claim| (c.source.trust(), c.confidence);
        match key(self).partial_cmp(&key(other)) {
            Some(std::cmp::Ordering::Greater) => true,
            Some(std::cmp::Ordering::Less) => false,
            _ => self.recorded_at >= other.recorded_at,
        }
    }
}

/// What becomes of a new fact written into a slot that holds `current`.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The new fact is current; these facts are superseded, and the new one
    /// records the most recently recorded of them in `supersedes`.
    Takes { retire: Vec<Uuid>, supersedes: Option<Uuid> },
    /// A current fact beats it: it is kept as a candidate contesting that one.
    Loses { contested_by: Uuid },
}

/// Decides a new claim against the current facts of its slot (normally one;
/// rows written before this rule existed may leave several). The new fact
/// must beat every one of them to take the slot; otherwise it contests the
/// strongest, and nothing is retired.
pub fn contest(new: &Claim, current: &[(Uuid, Claim)]) -> Verdict {
    let strongest =
        current.iter().filter(|(_, c)| !new.beats(c)).fold(None, |best: Option<&(Uuid, Claim)>, x| match best {
            Some(b) if !x.1.beats(&b.1) => Some(b),
            _ => Some(x),
        });
    match strongest {
        Some((id, _)) => Verdict::Loses { contested_by: *id },
        None => Verdict::Takes {
            retire: current.iter().map(|(id, _)| *id).collect(),
            supersedes: current.iter().max_by_key(|(id, c)| (c.recorded_at, *id)).map(|(id, _)| *id),
        },
    }
}

/// Which predicates hold several values at once. Predicates compare
/// case-insensitively, with spaces and hyphens read as underscores
/// ("Has pet" is `has_pet`).
#[derive(Debug, Clone, Default)]
pub struct Cardinality {
    multi_valued: std::collections::HashSet<String>,
}

impl Cardinality {
    pub fn new<'a>(multi_valued: impl IntoIterator<Item = &'a str>) -> Cardinality {
        Cardinality { multi_valued: multi_valued.into_iter().map(normalise_predicate).collect() }
    }

    pub fn is_multi_valued(&self, predicate: &str) -> bool {
        self.multi_valued.contains(&normalise_predicate(predicate))
    }
}

fn normalise_predicate(p: &str) -> String {
    p.trim().to_lowercase().replace([' ', '-'], "_")
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(minute: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 3, 1, 12, minute, 0).unwrap()
    }

    fn claim(source: Source, confidence: f64, minute: u32) -> Claim {
        Claim { source, confidence, recorded_at: at(minute) }
    }

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    #[test]
    fn trust_outranks_confidence_and_confidence_outranks_time() {
        // A user's 0.5 beats an agent's 0.99; a tool's 0.9 loses to an agent's 0.6.
        assert!(claim(Source::User, 0.5, 0).beats(&claim(Source::Agent, 0.99, 5)));
        assert!(!claim(Source::Tool, 0.9, 5).beats(&claim(Source::Agent, 0.6, 0)));
        // Same source: confidence decides, whatever the time.
        assert!(!claim(Source::Agent, 0.6, 9).beats(&claim(Source::Agent, 0.9, 0)));
        assert!(claim(Source::Agent, 0.9, 0).beats(&claim(Source::Agent, 0.6, 9)));
        // Same source and confidence: the later record wins, an equal time too.
        assert!(claim(Source::Agent, 0.7, 2).beats(&claim(Source::Agent, 0.7, 1)));
        assert!(!claim(Source::Agent, 0.7, 1).beats(&claim(Source::Agent, 0.7, 2)));
        assert!(claim(Source::Agent, 0.7, 1).beats(&claim(Source::Agent, 0.7, 1)));
        // Consolidated facts never overrule what the agent was told.
        assert!(!claim(Source::Consolidated, 1.0, 9).beats(&claim(Source::Shared, 0.1, 0)));
    }

    #[test]
    fn a_newer_fact_that_is_not_weaker_takes_the_slot() {
        let current = [(id(1), claim(Source::Agent, 0.7, 0))];
        let v = contest(&claim(Source::Agent, 0.7, 1), &current);
        assert_eq!(v, Verdict::Takes { retire: vec![id(1)], supersedes: Some(id(1)) });
    }

    #[test]
    fn a_newer_lower_confidence_fact_becomes_a_candidate() {
        // The seed's rule: the newer fact must also be at least as confident.
        let current = [(id(1), claim(Source::Agent, 0.9, 0))];
        let v = contest(&claim(Source::Agent, 0.6, 1), &current);
        assert_eq!(v, Verdict::Loses { contested_by: id(1) });
    }

    #[test]
    fn an_empty_slot_is_taken_without_retiring_anything() {
        assert_eq!(contest(&claim(Source::Tool, 0.1, 0), &[]), Verdict::Takes { retire: vec![], supersedes: None });
    }

    #[test]
    fn with_several_current_facts_the_new_one_must_beat_them_all() {
        // Left by the older rule: two valid facts in one slot.
        let current = [(id(1), claim(Source::Agent, 0.9, 0)), (id(2), claim(Source::Agent, 0.5, 3))];
        // 0.8 beats id 2 but not id 1: it contests id 1, nothing is retired.
        assert_eq!(contest(&claim(Source::Agent, 0.8, 5), &current), Verdict::Loses { contested_by: id(1) });
        // 0.95 beats both; it supersedes the later-recorded of them (id 2).
        assert_eq!(
            contest(&claim(Source::Agent, 0.95, 5), &current),
            Verdict::Takes { retire: vec![id(1), id(2)], supersedes: Some(id(2)) }
        );
        // Losing to both, it contests the strongest: the user's fact.
        let mixed = [(id(3), claim(Source::Agent, 0.9, 0)), (id(4), claim(Source::User, 0.4, 1))];
        assert_eq!(contest(&claim(Source::Tool, 0.99, 5), &mixed), Verdict::Loses { contested_by: id(4) });
    }

    #[test]
    fn multi_valued_predicates_are_matched_loosely() {
        let c = Cardinality::new(["likes", "has_pet"]);
        assert!(c.is_multi_valued("likes"));
        assert!(c.is_multi_valued(" Has pet"));
        assert!(c.is_multi_valued("HAS-PET"));
        assert!(!c.is_multi_valued("lives_in"));
        assert!(!Cardinality::default().is_multi_valued("likes"));
    }
}
