//! Priority scoring of recalled memories: five components, each a raw value
//! in [0, 1], combined as a weighted sum.
//!
//! - relevance: how well the memory matches the query (see [`fuse`]);
//! - recency = 0.5^(age_days / 7), age from `occurred_at` (a one-week half-life);
//! - importance: as stored;
//! - frequency = min(1, ln(1 + access_count) / ln 50): 49 accesses saturate it;
//! - tier_bonus: 0.3 working (session continuity), 0.2 procedural, 0 otherwise.
//!
//! score = w_rel·relevance + w_rec·recency + w_imp·importance + w_freq·frequency + w_tier·tier_bonus,
//! with default weights 0.35 / 0.20 / 0.20 / 0.10 / 0.15.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::memory::Tier;
use super::validate::FieldError;

/// Recency half-life in days.
pub const HALF_LIFE_DAYS: f64 = 7.0;
/// Access count at which frequency reaches 1.
pub const FREQUENCY_SATURATION: f64 = 50.0;
/// Default share of relevance given to vector similarity when both legs ran
/// (`search.vector_share`); the rest goes to the full-text score.
pub const VECTOR_SHARE: f64 = 0.5;
/// Default share of the better neighbouring episode's relevance added to an
/// episode's (`search.neighbour_share`).
pub const NEIGHBOUR_SHARE: f64 = 0.3;
/// Default relevance added to a memory whose speaker the query names
/// (`search.speaker_share`, `domain::speaker`).
pub const SPEAKER_SHARE: f64 = 0.2;
/// Default relevance added to a memory that occurred within a date the
/// query names (`search.date_share`, `domain::when`).
pub const DATE_SHARE: f64 = 0.2;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Weights {
    #[schema(minimum = 0.0, maximum = 10.0)]
    pub relevance: f64,
    #[schema(minimum = 0.0, maximum = 10.0)]
    pub recency: f64,
    #[schema(minimum = 0.0, maximum = 10.0)]
    pub importance: f64,
    #[schema(minimum = 0.0, maximum = 10.0)]
    pub frequency: f64,
    #[schema(minimum = 0.0, maximum = 10.0)]
    pub tier_bonus: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Self { relevance: 0.35, recency: 0.20, importance: 0.20, frequency: 0.10, tier_bonus: 0.15 }
    }
}

impl Weights {
    /// Each weight finite and in [0, 10], and not all zero. `at` is the
    /// pointer of the weights object.
    pub fn check(&self, at: &str) -> Result<(), FieldError> {
        for (name, w) in [
            ("relevance", self.relevance),
            ("recency", self.recency),
            ("importance", self.importance),
            ("frequency", self.frequency),
            ("tier_bonus", self.tier_bonus),
        ] {
            if !w.is_finite() || !(0.0..=10.0).contains(&w) {
                return Err(FieldError::new(format!("{at}/{name}"), "must be a number between 0 and 10"));
            }
        }
        if self.relevance + self.recency + self.importance + self.frequency + self.tier_bonus == 0.0 {
            return Err(FieldError::new(at, "at least one weight must be above 0"));
        }
        Ok(())
    }
}

/// The raw components of a score, each in [0, 1].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Components {
    pub relevance: f64,
    pub recency: f64,
    pub importance: f64,
    pub frequency: f64,
    pub tier_bonus: f64,
}

impl Components {
    pub fn score(&self, w: &Weights) -> f64 {
        w.relevance * self.relevance
            + w.recency * self.recency
            + w.importance * self.importance
            + w.frequency * self.frequency
            + w.tier_bonus * self.tier_bonus
    }
}

/// 0.5^(age_days / 7); a future `occurred_at` counts as now.
pub fn recency(occurred_at: DateTime<Utc>, now: DateTime<Utc>) -> f64 {
    let age_days = ((now - occurred_at).num_milliseconds() as f64 / 86_400_000.0).max(0.0);
    0.5f64.powf(age_days / HALF_LIFE_DAYS)
}

/// min(1, ln(1 + n) / ln 50).
pub fn frequency(access_count: i64) -> f64 {
    ((1.0 + access_count.max(0) as f64).ln() / FREQUENCY_SATURATION.ln()).min(1.0)
}

pub fn tier_bonus(tier: Tier) -> f64 {
    match tier {
        Tier::Working => 0.3,
        Tier::Procedural => 0.2,
        Tier::Episodic | Tier::Semantic => 0.0,
    }
}

/// Relevance from the two retrieval legs.
///
/// - `vector`: cosine similarity to the query, clamped to [0, 1] (negative
///   similarity carries no information worth ranking on).
/// - `text`: the share of the query's term weight the memory's text holds,
///   each term weighed by how rare it is among the search's candidates
///   (`words::TermWeights`), in [0, 1]: a word every candidate holds adds
///   almost nothing, and the value does not depend on how well the best
///   candidate matched.
///
/// When both legs ran: share·vector + (1 − share)·text (`VECTOR_SHARE`). Each leg also scores the
/// other leg's candidates (the store computes the cosine of full-text hits
/// and the text rank of vector hits), so a 0 here means a real miss: no query
/// word in the text, or no vector of the query's model. When only one ran (no embedder, or no
/// searchable words in the query), that leg alone. Scores are fused by value,
/// not by rank: rank fusion throws away how much better the first hit is than
/// the tenth, and measured worse than either leg alone on conversational recall.
///
/// A cosine with an all-zero vector (a query with nothing to embed) is
/// undefined: pgvector answers NaN, the embedded index's dot product 0. Both
/// count as 0, so the score stays a number and the backends agree.
pub fn fuse(vector: Option<f64>, text: Option<f64>, vector_leg: bool, text_leg: bool, vector_share: f64) -> f64 {
    let unit = |x: Option<f64>| x.filter(|x| !x.is_nan()).unwrap_or(0.0).clamp(0.0, 1.0);
    let v = unit(vector);
    let t = unit(text);
    match (vector_leg, text_leg) {
        (true, true) => vector_share * v + (1.0 - vector_share) * t,
        (true, false) => v,
        (false, true) => t,
        (false, false) => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn an_undefined_cosine_fuses_as_zero() {
        assert_eq!(fuse(Some(f64::NAN), Some(0.5), true, true, 0.6), 0.4 * 0.5);
        assert_eq!(fuse(Some(f64::NAN), None, true, false, 0.6), 0.0);
    }

    #[test]
    fn recency_halves_every_week() {
        let now = Utc::now();
        assert!(close(recency(now, now), 1.0));
        assert!(close(recency(now - Duration::days(7), now), 0.5));
        assert!(close(recency(now - Duration::days(14), now), 0.25));
        // 3.5 days: 0.5^0.5 = 0.70710678...
        assert!(close(recency(now - Duration::hours(84), now), std::f64::consts::FRAC_1_SQRT_2));
        assert!(close(recency(now + Duration::days(2), now), 1.0));
    }

    #[test]
    fn frequency_saturates_at_49_accesses() {
        assert!(close(frequency(0), 0.0));
        // ln 2 / ln 50 = 0.6931472 / 3.9120230 = 0.1771838
        assert!((frequency(1) - 0.1771838).abs() < 1e-6);
        assert!(close(frequency(49), 1.0));
        assert!(close(frequency(1000), 1.0));
    }

    #[test]
    fn score_is_the_weighted_sum_with_default_weights() {
        // A working memory: relevance 0.8, written 7 days ago (0.5), importance 0.6,
        // accessed once (0.1771838), bonus 0.3.
        let c = Components { relevance: 0.8, recency: 0.5, importance: 0.6, frequency: frequency(1), tier_bonus: 0.3 };
        // 0.35·0.8 + 0.20·0.5 + 0.20·0.6 + 0.10·0.1771838 + 0.15·0.3
        // = 0.28 + 0.10 + 0.12 + 0.01771838 + 0.045 = 0.56271838
        assert!((c.score(&Weights::default()) - 0.5627184).abs() < 1e-6);
    }

    #[test]
    fn fusion_weighs_the_legs_that_ran() {
        // At share 0.6: 0.6·0.9 + 0.4·0.5 = 0.54 + 0.20 = 0.74.
        assert!(close(fuse(Some(0.9), Some(0.5), true, true, 0.6), 0.74));
        // No text score (no query word in it): text counts 0 → 0.6·0.9 = 0.54.
        assert!(close(fuse(Some(0.9), None, true, true, 0.6), 0.54));
        assert!(close(fuse(None, Some(0.5), false, true, VECTOR_SHARE), 0.5));
        assert!(close(fuse(Some(-0.2), None, true, false, VECTOR_SHARE), 0.0));
        // Another share: 0.5·0.9 + 0.5·0.5 = 0.70.
        assert!(close(fuse(Some(0.9), Some(0.5), true, true, 0.5), 0.70));
    }

    #[test]
    fn weights_are_checked_by_name() {
        let w = Weights { recency: -1.0, ..Weights::default() };
        assert_eq!(w.check("/weights").unwrap_err().field, "/weights/recency");
        let zero = Weights { relevance: 0.0, recency: 0.0, importance: 0.0, frequency: 0.0, tier_bonus: 0.0 };
        assert_eq!(zero.check("/weights").unwrap_err().field, "/weights");
    }
}
