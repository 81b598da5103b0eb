//! Input rules shared by every entry point (HTTP today, import tomorrow).
//!
//! Each check names the offending field as a JSON pointer so a client can
//! point at the exact value in a batch of hundreds.

use chrono::{DateTime, Duration, Utc};
use serde_json::{Map, Value};

/// Longest identifier (agent, user, session) in characters.
pub const MAX_ID_CHARS: usize = 64;
/// Longest content in bytes. Longer texts belong in a document store; a memory
/// is something an agent reads back into a prompt.
pub const MAX_CONTENT_BYTES: usize = 32 * 1024;
/// Largest metadata object, serialised.
pub const MAX_METADATA_BYTES: usize = 16 * 1024;
/// Most memories in one write.
pub const MAX_BATCH: usize = 500;
/// How far in the future `occurred_at` may lie (clock skew, time zones).
pub const MAX_FUTURE_SKEW_HOURS: i64 = 24;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// JSON pointer of the field, e.g. `/memories/3/importance`.
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { field: field.into(), message: message.into() }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for FieldError {}

pub type Check<T> = Result<T, FieldError>;

/// An identifier: 1 to 64 characters, no control characters, no surrounding
/// whitespace.
pub fn identifier(field: &str, value: &str) -> Check<()> {
    if value.is_empty() {
        return Err(FieldError::new(field, "must not be empty"));
    }
    if value.chars().count() > MAX_ID_CHARS {
        return Err(FieldError::new(field, format!("must be at most {MAX_ID_CHARS} characters")));
    }
    if value.chars().any(char::is_control) || value.trim() != value {
        return Err(FieldError::new(field, "must not contain control characters or surrounding spaces"));
    }
    Ok(())
}

/// Free text of at most `max` characters (subject, predicate, skill name).
pub fn short_text(field: &str, value: &str, max: usize) -> Check<()> {
    if value.trim().is_empty() {
        return Err(FieldError::new(field, "must not be empty"));
    }
    if value.chars().count() > max {
        return Err(FieldError::new(field, format!("must be at most {max} characters")));
    }
    Ok(())
}

/// Memory content: not blank, at most [`MAX_CONTENT_BYTES`].
pub fn content(field: &str, value: &str) -> Check<()> {
    if value.trim().is_empty() {
        return Err(FieldError::new(field, "must not be empty"));
    }
    if value.len() > MAX_CONTENT_BYTES {
        return Err(FieldError::new(field, format!("must be at most {MAX_CONTENT_BYTES} bytes")));
    }
    Ok(())
}

/// A number in [0, 1] (importance, confidence).
pub fn unit_interval(field: &str, value: f64) -> Check<f64> {
    if !value.is_finite() || !(0.0..=1.0).contains(&value) {
        return Err(FieldError::new(field, "must be a number between 0 and 1"));
    }
    Ok(value)
}

/// A reward in [-1, 1].
pub fn reward(field: &str, value: f64) -> Check<f64> {
    if !value.is_finite() || !(-1.0..=1.0).contains(&value) {
        return Err(FieldError::new(field, "must be a number between -1 and 1"));
    }
    Ok(value)
}

/// Metadata: a JSON object of bounded size with non-empty keys.
pub fn metadata(field: &str, value: &Map<String, Value>) -> Check<()> {
    if value.keys().any(|k| k.is_empty()) {
        return Err(FieldError::new(field, "keys must not be empty"));
    }
    let size = serde_json::to_vec(value).map(|v| v.len()).unwrap_or(usize::MAX);
    if size > MAX_METADATA_BYTES {
        return Err(FieldError::new(field, format!("must be at most {MAX_METADATA_BYTES} bytes as JSON")));
    }
    Ok(())
}

/// `occurred_at` may not lie more than a day in the future.
pub fn occurred_at(field: &str, value: DateTime<Utc>, now: DateTime<Utc>) -> Check<()> {
    if value > now + Duration::hours(MAX_FUTURE_SKEW_HOURS) {
        return Err(FieldError::new(field, "must not be more than 24 hours in the future"));
    }
    Ok(())
}

/// A batch holds 1 to [`MAX_BATCH`] memories.
pub fn batch_size(field: &str, len: usize) -> Check<()> {
    if len == 0 {
        return Err(FieldError::new(field, "must hold at least one memory"));
    }
    if len > MAX_BATCH {
        return Err(FieldError::new(field, format!("must hold at most {MAX_BATCH} memories")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn identifiers_are_bounded_and_clean() {
        assert!(identifier("/agent_id", "agent-1").is_ok());
        assert_eq!(identifier("/agent_id", "").unwrap_err().field, "/agent_id");
        // 64 characters pass, 65 fail (multi-byte characters count once).
        assert!(identifier("/agent_id", &"é".repeat(64)).is_ok());
        assert!(identifier("/agent_id", &"é".repeat(65)).is_err());
        assert!(identifier("/agent_id", " a").is_err());
        assert!(identifier("/agent_id", "a\nb").is_err());
    }

    #[test]
    fn unit_interval_accepts_bounds_and_rejects_outside() {
        assert_eq!(unit_interval("/importance", 0.0), Ok(0.0));
        assert_eq!(unit_interval("/importance", 1.0), Ok(1.0));
        let err = unit_interval("/memories/37/importance", 1.5).unwrap_err();
        assert_eq!(err.field, "/memories/37/importance");
        assert!(unit_interval("/importance", -0.01).is_err());
        assert!(unit_interval("/importance", f64::NAN).is_err());
    }

    #[test]
    fn content_must_be_present_and_bounded() {
        assert!(content("/content", "   ").is_err());
        assert!(content("/content", &"a".repeat(MAX_CONTENT_BYTES)).is_ok());
        assert!(content("/content", &"a".repeat(MAX_CONTENT_BYTES + 1)).is_err());
    }

    #[test]
    fn occurred_at_allows_a_day_of_skew() {
        let now = Utc.with_ymd_and_hms(2026, 6, 1, 0, 0, 0).unwrap();
        assert!(occurred_at("/occurred_at", now + Duration::hours(24), now).is_ok());
        assert!(occurred_at("/occurred_at", now + Duration::hours(25), now).is_err());
        assert!(occurred_at("/occurred_at", now - Duration::days(3650), now).is_ok());
    }

    #[test]
    fn batches_hold_one_to_five_hundred() {
        assert!(batch_size("/memories", 0).is_err());
        assert!(batch_size("/memories", 1).is_ok());
        assert!(batch_size("/memories", 500).is_ok());
        assert!(batch_size("/memories", 501).is_err());
    }

    #[test]
    fn metadata_keys_must_not_be_empty() {
        let m = serde_json::json!({"": 1}).as_object().unwrap().clone();
        assert!(metadata("/metadata", &m).is_err());
    }
}
