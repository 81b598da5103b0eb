//! How long memories are kept, and which ones are forgotten before that.
//!
//! Two rules, both pure and both decided here, never in a backend:
//! - **Expiry** (`RetentionPolicy`): a memory expires a configured duration
//!   after it was ingested (`created_at`, never `occurred_at`: a client
//!   back-dating an event must not make it vanish at once). The duration is
//!   read when the expiry is computed — at the write, or when a patch changes
//!   the retention — and stored as `expires_at`; changing the configuration
//!   later does not move the expiry of rows already stored.
//! - **Decay** (`DecayRule`): the seed design's `retention_score` blends
//!   importance, recency of last access and access frequency; a memory whose
//!   score falls below the threshold is forgotten, unless its retention is
//!   `permanent` or it was ingested less than `min_age` ago.
//!
//! Must not: know where rows live. Backends give candidates and delete ids.

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use super::memory::{Retention, Tier};

/// A length of time written as a whole number and a unit: `90s`, `30m`,
/// `1h`, `7d`. The form configuration keys under `[retention]` take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Period {
    secs: i64,
}

/// A hundred years: longer lifetimes are `permanent`, and bounded ones must
/// stay far from the end of chrono's calendar.
const MAX_PERIOD_SECS: i64 = 36_500 * 86_400;

impl Period {
    pub const fn secs(secs: i64) -> Period {
        Period { secs }
    }

    pub const fn hours(h: i64) -> Period {
        Period { secs: h * 3600 }
    }

    pub const fn days(d: i64) -> Period {
        Period { secs: d * 86_400 }
    }

    pub fn duration(self) -> Duration {
        Duration::seconds(self.secs)
    }

    pub fn as_secs(self) -> i64 {
        self.secs
    }

    /// Parses `<number><unit>`, unit one of `s`, `m`, `h`, `d`; more than
    /// zero and at most 36500 days.
    pub fn parse(text: &str) -> Result<Period, String> {
        let text = text.trim();
        let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let scale = match unit {
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            "d" => 86_400,
            _ => return Err(format!("{text:?} is not a duration like 90s, 30m, 1h or 7d")),
        };
        let n: i64 = number.parse().map_err(|_| format!("{text:?} is not a duration like 90s, 30m, 1h or 7d"))?;
        match n.checked_mul(scale) {
            Some(secs) if secs > 0 && secs <= MAX_PERIOD_SECS => Ok(Period { secs }),
            _ => Err(format!("{text:?} must be more than 0 and at most 36500d")),
        }
    }
}

impl std::fmt::Display for Period {
    /// The largest unit that divides the period exactly.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.secs;
        match () {
            _ if s % 86_400 == 0 => write!(f, "{}d", s / 86_400),
            _ if s % 3600 == 0 => write!(f, "{}h", s / 3600),
            _ if s % 60 == 0 => write!(f, "{}m", s / 60),
            _ => write!(f, "{s}s"),
        }
    }
}

impl TryFrom<String> for Period {
    type Error = String;
    fn try_from(s: String) -> Result<Period, String> {
        Period::parse(&s)
    }
}

impl From<Period> for String {
    fn from(p: Period) -> String {
        p.to_string()
    }
}

/// How long each retention keeps a memory, counted from its ingestion.
/// `permanent` is not here: it never expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionPolicy {
    pub transient: Period,
    pub session: Period,
    pub short_term: Period,
    pub medium_term: Period,
    pub long_term: Period,
}

impl Default for RetentionPolicy {
    /// 1 h, 24 h, 7 d, 90 d, 365 d.
    fn default() -> Self {
        Self {
            transient: Period::hours(1),
            session: Period::hours(24),
            short_term: Period::days(7),
            medium_term: Period::days(90),
            long_term: Period::days(365),
        }
    }
}

impl RetentionPolicy {
    /// The lifetime of a memory of `retention`; `None` is forever.
    pub fn duration(&self, retention: Retention) -> Option<Duration> {
        let period = match retention {
            Retention::Transient => self.transient,
            Retention::Session => self.session,
            Retention::ShortTerm => self.short_term,
            Retention::MediumTerm => self.medium_term,
            Retention::LongTerm => self.long_term,
            Retention::Permanent => return None,
        };
        Some(period.duration())
    }

    /// When a memory of `retention` ingested at `ingested_at` expires.
    pub fn expires_at(&self, retention: Retention, ingested_at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.duration(retention).map(|d| ingested_at + d)
    }
}

/// Why a sweep deletes a memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// Past its `expires_at`.
    Expired,
    /// Its retention score decayed below the threshold.
    Decayed,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Expired => "expired",
            Reason::Decayed => "decayed",
        }
    }
}

/// What decay looks at in a stored memory.
#[derive(Debug, Clone, PartialEq)]
pub struct DecayCandidate {
    pub tenant: String,
    pub id: uuid::Uuid,
    pub tier: Tier,
    pub retention: Retention,
    pub importance: f64,
    /// Ingestion time.
    pub created_at: DateTime<Utc>,
    /// The last counted retrieval (see `search.access_interval_secs`).
    pub last_accessed_at: Option<DateTime<Utc>>,
    pub access_count: i64,
}

/// Forgetting by decay: the seed design's `retention_score` and `should_forget`.
#[derive(Debug, Clone, PartialEq)]
pub struct DecayRule {
    /// Tiers decay applies to.
    pub tiers: Vec<Tier>,
    /// Recency halves every this many days.
    pub half_life_days: f64,
    /// A memory scoring below this is forgotten.
    pub threshold: f64,
    /// Nothing ingested less than this long ago decays.
    pub min_age: Period,
}

/// Weights of the score's three parts (the seed design's).
const IMPORTANCE_WEIGHT: f64 = 0.5;
const RECENCY_WEIGHT: f64 = 0.35;
const FREQUENCY_WEIGHT: f64 = 0.15;
/// Access count at which frequency reaches 1 (as in recall's scoring).
const FREQUENCY_SATURATION: f64 = 50.0;

impl Default for DecayRule {
    /// Episodic only: episodes are the raw stream, numerous and mostly
    /// unimportant, and what mattered in them is kept as facts. Facts are
    /// curated (deduplicated, superseded explicitly) and skills are upserted
    /// and usually permanent: losing an unread fact or skill silently costs
    /// more than keeping it.
    fn default() -> Self {
        Self { tiers: vec![Tier::Episodic], half_life_days: 7.0, threshold: 0.15, min_age: Period::days(7) }
    }
}

impl DecayRule {
    pub fn applies_to(&self, tier: Tier) -> bool {
        self.tiers.contains(&tier)
    }

    /// 0.5 · importance + 0.35 · 2^(−age / half-life) + 0.15 · min(1, ln(1 + accesses) / ln 50),
    /// age in days since the last counted access, or since ingestion when
    /// the memory was never retrieved (a memory nobody reads fades from the
    /// moment it is written; one that is read starts fading again).
    pub fn score(&self, c: &DecayCandidate, now: DateTime<Utc>) -> f64 {
        let since = c.last_accessed_at.unwrap_or(c.created_at).max(c.created_at);
        let age_days = ((now - since).num_milliseconds() as f64 / 86_400_000.0).max(0.0);
        let recency = (-std::f64::consts::LN_2 * age_days / self.half_life_days).exp();
        let frequency = ((c.access_count.max(0) as f64).ln_1p() / FREQUENCY_SATURATION.ln()).min(1.0);
        IMPORTANCE_WEIGHT * c.importance + RECENCY_WEIGHT * recency + FREQUENCY_WEIGHT * frequency
    }

    /// Whether decay forgets the memory at `now`.
    pub fn should_forget(&self, c: &DecayCandidate, now: DateTime<Utc>) -> bool {
        self.applies_to(c.tier)
            && c.retention != Retention::Permanent
            && c.created_at <= self.ingested_before(now)
            && self.score(c, now) < self.threshold
    }

    /// Only memories ingested at or before this can decay.
    pub fn ingested_before(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        now - self.min_age.duration()
    }

    /// Importance at or above this never decays (recency and frequency are
    /// at least 0), so backends list only memories below it.
    pub fn importance_below(&self) -> f64 {
        self.threshold / IMPORTANCE_WEIGHT
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 31, 12, 0, 0).unwrap()
    }

    fn candidate(importance: f64, last_access_days_ago: Option<i64>, accesses: i64) -> DecayCandidate {
        DecayCandidate {
            tenant: "t".into(),
            id: uuid::Uuid::nil(),
            tier: Tier::Episodic,
            retention: Retention::MediumTerm,
            importance,
            created_at: t0() - Duration::days(60),
            last_accessed_at: last_access_days_ago.map(|d| t0() - Duration::days(d)),
            access_count: accesses,
        }
    }

    #[test]
    fn the_default_policy_is_the_tiers_table() {
        let p = RetentionPolicy::default();
        // 1 h, 24 h, 7 d, 90 d, 365 d, never.
        let at = |y, m, d, h| Some(Utc.with_ymd_and_hms(y, m, d, h, 0, 0).unwrap());
        assert_eq!(p.expires_at(Retention::Transient, t0()), at(2026, 1, 31, 13));
        assert_eq!(p.expires_at(Retention::Session, t0()), at(2026, 2, 1, 12));
        assert_eq!(p.expires_at(Retention::ShortTerm, t0()), at(2026, 2, 7, 12));
        // Jan 31 + 90 days = May 1 (1 + 28 + 31 + 30 = 90).
        assert_eq!(p.expires_at(Retention::MediumTerm, t0()), at(2026, 5, 1, 12));
        assert_eq!(p.expires_at(Retention::LongTerm, t0()), at(2027, 1, 31, 12));
        assert_eq!(p.expires_at(Retention::Permanent, t0()), None);
    }

    #[test]
    fn a_configured_duration_counts_from_ingestion() {
        let p = RetentionPolicy { short_term: Period::parse("36h").unwrap(), ..RetentionPolicy::default() };
        assert_eq!(p.expires_at(Retention::ShortTerm, t0()), Some(Utc.with_ymd_and_hms(2026, 2, 2, 0, 0, 0).unwrap()));
        assert_eq!(p.expires_at(Retention::Transient, t0()), Some(t0() + Duration::hours(1)));
    }

    #[test]
    fn periods_parse_and_print_with_their_unit() {
        assert_eq!(Period::parse("90s"), Ok(Period::secs(90)));
        assert_eq!(Period::parse("30m"), Ok(Period::secs(1800)));
        assert_eq!(Period::parse("1h"), Ok(Period::hours(1)));
        assert_eq!(Period::parse("7d"), Ok(Period::days(7)));
        assert_eq!(Period::parse("48h").unwrap().to_string(), "2d");
        assert_eq!(Period::parse("90m").unwrap().to_string(), "90m");
        for bad in ["", "7", "d", "0h", "-1h", "1.5h", "7 days", "36501d", "99999999999999999d"] {
            assert!(Period::parse(bad).is_err(), "{bad:?} must not parse");
        }
    }

    #[test]
    fn an_unread_unimportant_episode_decays_after_eight_and_a_half_days() {
        let rule = DecayRule::default();
        // Never accessed: age from ingestion, 60 days: 0.35 · 2^(−60/7) = 0.35 · 0.00262871 = 0.00092005.
        let c = candidate(0.0, None, 0);
        assert!((rule.score(&c, t0()) - 0.000_920_05).abs() < 1e-8, "{}", rule.score(&c, t0()));
        assert!(rule.should_forget(&c, t0()));
        // Read 7 days ago once: 0.35 · 0.5 + 0.15 · ln 2 / ln 50 = 0.175 + 0.15 · 0.177185 = 0.2015778.
        let c = candidate(0.0, Some(7), 1);
        assert!((rule.score(&c, t0()) - 0.201_577_8).abs() < 1e-6, "{}", rule.score(&c, t0()));
        assert!(!rule.should_forget(&c, t0()));
        // Read 14 days ago, never counted: 0.35 · 0.25 = 0.0875 < 0.15.
        let c = candidate(0.0, Some(14), 0);
        assert!((rule.score(&c, t0()) - 0.0875).abs() < 1e-12);
        assert!(rule.should_forget(&c, t0()));
        // Importance 0.2, read 14 days ago: 0.1 + 0.0875 = 0.1875, kept.
        let c = candidate(0.2, Some(14), 0);
        assert!((rule.score(&c, t0()) - 0.1875).abs() < 1e-7);
        assert!(!rule.should_forget(&c, t0()));
        // Importance 0.3 or more never decays: 0.15 alone meets the threshold.
        assert_eq!(rule.importance_below(), 0.3);
        assert!(!rule.should_forget(&candidate(0.3, None, 0), t0()));
        // 50 accesses or more give the whole frequency part: 0.15, kept.
        assert!(!rule.should_forget(&candidate(0.0, Some(365), 50), t0()));
    }

    #[test]
    fn permanent_young_and_other_tiers_never_decay() {
        let rule = DecayRule::default();
        let mut c = candidate(0.0, None, 0);
        c.retention = Retention::Permanent;
        assert!(!rule.should_forget(&c, t0()));
        // Ingested 6 days ago (min age 7 days), never read: 0.35 · 2^(−6/7) = 0.1931, kept anyway;
        // even with the half-life at one day (score 0.0055) it is too young.
        let mut c = candidate(0.0, None, 0);
        c.created_at = t0() - Duration::days(6);
        let fast = DecayRule { half_life_days: 1.0, ..DecayRule::default() };
        assert!((fast.score(&c, t0()) - 0.35 / 64.0).abs() < 1e-12);
        assert!(!fast.should_forget(&c, t0()));
        c.created_at = t0() - Duration::days(7);
        assert!(fast.should_forget(&c, t0()), "exactly the minimum age decays");
        let mut c = candidate(0.0, None, 0);
        c.tier = Tier::Semantic;
        assert!(!rule.should_forget(&c, t0()));
        let all = DecayRule { tiers: vec![Tier::Semantic], ..DecayRule::default() };
        assert!(all.should_forget(&c, t0()));
    }

    #[test]
    fn age_never_counts_from_before_ingestion() {
        // Imported rows can carry any timestamps; age never counts from
        // before the memory was ingested here.
        let rule = DecayRule::default();
        let mut c = candidate(0.0, Some(100), 0);
        c.created_at = t0() - Duration::days(14);
        assert!((rule.score(&c, t0()) - 0.0875).abs() < 1e-12);
    }
}
