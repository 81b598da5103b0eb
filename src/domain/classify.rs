//! Write-time classification: which tier a memory belongs to and how important
//! it is, when the writer does not say.
//!
//! Classification sits behind [`Classifier`] so that a model-backed classifier
//! can replace the rules without touching the write path. The rules below are
//! cheap, deterministic and explainable: structure first (the fields a writer
//! filled in say more than the words), then a few lexical cues.

use async_trait::async_trait;

use super::memory::{EventType, Outcome, Tier};

/// What the classifier sees of a write.
#[derive(Debug, Clone, Default)]
pub struct ClassifyInput<'a> {
    pub content: &'a str,
    /// skill_name, trigger_pattern, policy or tool_sequence was given.
    pub has_skill_fields: bool,
    /// subject, predicate, object or confidence was given.
    pub has_fact_fields: bool,
    pub event_type: Option<EventType>,
    pub outcome: Option<Outcome>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Classification {
    pub tier: Tier,
    pub importance: f64,
}

#[async_trait]
pub trait Classifier: Send + Sync {
    /// Picks the tier of a write that named none.
    async fn tier(&self, input: &ClassifyInput<'_>) -> Tier;
    /// Scores the importance (0 to 1) of a write of `tier` that gave none.
    async fn importance(&self, tier: Tier, input: &ClassifyInput<'_>) -> f64;
}

/// The rule-based classifier.
///
/// Tier, first rule that applies:
/// 1. skill fields → procedural;
/// 2. fact fields → semantic;
/// 3. an event type or an outcome → episodic;
/// 4. a short third-person statement with a fact verb ("The user prefers
///    aisle seats", "Alice lives in Paris") → semantic;
/// 5. anything else → episodic. Working memory is never guessed: it is the
///    session scratchpad and writers ask for it by name.
///
/// Importance starts from the tier's base (working 0.4, episodic 0.5,
/// semantic 0.6, procedural 0.6), then: +0.2 if an emphasis word appears
/// (important, remember, always, never, must, critical, urgent, deadline,
/// allergic, password); +0.1 if a preference word appears (prefer…,
/// favorite/favourite, love…, hate…, dislike…); +0.1 for a failure outcome
/// (mistakes are worth keeping), +0.05 for a success; −0.2 for three words
/// or fewer ("ok thanks"). Clamped to [0, 1] and rounded to two decimals.
#[derive(Debug, Default, Clone)]
pub struct RuleClassifier;

const EMPHASIS: &[&str] =
    &["important", "remember", "always", "never", "must", "critical", "urgent", "deadline", "allergic", "password"];
const PREFERENCE_PREFIXES: &[&str] = &["prefer", "favorite", "favourite", "love", "hate", "dislike"];
const FACT_VERBS: &[&str] = &[
    "prefers", "likes", "loves", "hates", "dislikes", "is", "are", "has", "have", "lives", "works", "owns", "wants",
    "needs", "uses", "speaks", "was", "were",
];
const PERSONAL_PRONOUNS: &[&str] = &["i", "me", "my", "we", "our", "you", "your", "i'm", "i've", "we're"];

fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '\'')).filter(|w| !w.is_empty()).map(str::to_lowercase).collect()
}

impl RuleClassifier {
    pub fn tier_of(input: &ClassifyInput<'_>) -> Tier {
        if input.has_skill_fields {
            return Tier::Procedural;
        }
        if input.has_fact_fields {
            return Tier::Semantic;
        }
        if input.event_type.is_some() || input.outcome.is_some() {
            return Tier::Episodic;
        }
        let w = words(input.content);
        let statement = !input.content.trim_end().ends_with('?')
            && (3..=25).contains(&w.len())
            && !w.iter().any(|x| PERSONAL_PRONOUNS.contains(&x.as_str()))
            && w.iter().any(|x| FACT_VERBS.contains(&x.as_str()));
        if statement { Tier::Semantic } else { Tier::Episodic }
    }

    pub fn importance_of(tier: Tier, input: &ClassifyInput<'_>) -> f64 {
        let w = words(input.content);
        let mut score: f64 = match tier {
            Tier::Working => 0.4,
            Tier::Episodic => 0.5,
            Tier::Semantic | Tier::Procedural => 0.6,
        };
        if w.iter().any(|x| EMPHASIS.contains(&x.as_str())) {
            score += 0.2;
        }
        if w.iter().any(|x| PREFERENCE_PREFIXES.iter().any(|p| x.starts_with(p))) {
            score += 0.1;
        }
        match input.outcome {
            Some(Outcome::Failure) => score += 0.1,
            Some(Outcome::Success) => score += 0.05,
            _ => {}
        }
        if w.len() <= 3 {
            score -= 0.2;
        }
        (score.clamp(0.0, 1.0) * 100.0).round() / 100.0
    }
}

#[async_trait]
impl Classifier for RuleClassifier {
    async fn tier(&self, input: &ClassifyInput<'_>) -> Tier {
        Self::tier_of(input)
    }

    async fn importance(&self, tier: Tier, input: &ClassifyInput<'_>) -> f64 {
        Self::importance_of(tier, input)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(content: &str) -> ClassifyInput<'_> {
        ClassifyInput { content, ..Default::default() }
    }

    #[test]
    fn structure_decides_before_words() {
        let skill = ClassifyInput { has_skill_fields: true, has_fact_fields: true, ..text("x") };
        assert_eq!(RuleClassifier::tier_of(&skill), Tier::Procedural);
        let fact = ClassifyInput { has_fact_fields: true, ..text("I went hiking") };
        assert_eq!(RuleClassifier::tier_of(&fact), Tier::Semantic);
        let event = ClassifyInput { outcome: Some(Outcome::Success), ..text("The user prefers tea") };
        assert_eq!(RuleClassifier::tier_of(&event), Tier::Episodic);
    }

    #[test]
    fn third_person_fact_statements_are_semantic_and_dialogue_is_episodic() {
        assert_eq!(RuleClassifier::tier_of(&text("The user prefers aisle seats.")), Tier::Semantic);
        assert_eq!(RuleClassifier::tier_of(&text("Alice lives in Paris")), Tier::Semantic);
        // First person: something said in a conversation, not a distilled fact.
        assert_eq!(RuleClassifier::tier_of(&text("I prefer aisle seats")), Tier::Episodic);
        // A question is never a fact.
        assert_eq!(RuleClassifier::tier_of(&text("Is the user in Paris?")), Tier::Episodic);
        // No fact verb.
        assert_eq!(RuleClassifier::tier_of(&text("Booked the flight to Lisbon")), Tier::Episodic);
    }

    #[test]
    fn importance_adds_the_documented_cues() {
        // Episodic base 0.5, nothing else: 0.5.
        assert_eq!(RuleClassifier::importance_of(Tier::Episodic, &text("We talked about the weather today")), 0.5);
        // Semantic base 0.6 + preference 0.1 = 0.7.
        assert_eq!(RuleClassifier::importance_of(Tier::Semantic, &text("The user prefers aisle seats")), 0.7);
        // Semantic 0.6 + emphasis ("allergic") 0.2 = 0.8.
        assert_eq!(RuleClassifier::importance_of(Tier::Semantic, &text("The user is allergic to peanuts")), 0.8);
        // Episodic 0.5 + emphasis ("never") 0.2 + preference ("hates") 0.1 + failure 0.1 = 0.9.
        let failed = ClassifyInput {
            outcome: Some(Outcome::Failure),
            ..text("Never book red-eye flights, the user hates them")
        };
        assert_eq!(RuleClassifier::importance_of(Tier::Episodic, &failed), 0.9);
        // Working 0.4 − short (2 words) 0.2 = 0.2.
        assert_eq!(RuleClassifier::importance_of(Tier::Working, &text("ok thanks")), 0.2);
        // Procedural 0.6 + success 0.05 = 0.65.
        let ok = ClassifyInput { outcome: Some(Outcome::Success), ..text("Search flights then filter by price") };
        assert_eq!(RuleClassifier::importance_of(Tier::Procedural, &ok), 0.65);
    }

    #[test]
    fn importance_is_clamped_to_one() {
        // Semantic 0.6 + 0.2 + 0.1 + failure 0.1 + ... stays ≤ 1: 0.6+0.2+0.1+0.1 = 1.0.
        let input = ClassifyInput {
            outcome: Some(Outcome::Failure),
            ..text("Always remember: the user hates spam and must never get it")
        };
        assert_eq!(RuleClassifier::importance_of(Tier::Semantic, &input), 1.0);
    }
}
