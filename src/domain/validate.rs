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
/// Longest fact subject, in characters.
pub const MAX_SUBJECT_CHARS: usize = 256;
/// Longest fact predicate, in characters.
pub const MAX_PREDICATE_CHARS: usize = 128;
/// Longest fact object and skill trigger pattern, in characters.
pub const MAX_PHRASE_CHARS: usize = 4096;
/// Longest skill name, in characters.
pub const MAX_SKILL_NAME_CHARS: usize = 128;
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

/// Whether a character is invisible or reorders text around it: control
/// characters, bidirectional controls (U+200E/F, U+202A-U+202E,
/// U+2066-U+2069), zero-width and joining characters (U+200B-U+200D, U+2060,
/// U+FEFF), line and paragraph separators, and the other default-ignorable
/// code points. Two identifiers that look the same must be the same, so none
/// of these may appear in one.
pub fn is_hidden(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{115F}' | '\u{1160}' | '\u{17B4}' | '\u{17B5}'
            | '\u{180B}'..='\u{180F}' | '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}' | '\u{3164}' | '\u{FE00}'..='\u{FE0F}' | '\u{FEFF}' | '\u{FFA0}'
            | '\u{FFF0}'..='\u{FFFB}' | '\u{1BCA0}'..='\u{1BCA3}' | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0000}'..='\u{E0FFF}')
}

/// No hidden characters (see [`is_hidden`]): names, identifiers and metadata keys.
pub fn visible(field: &str, value: &str) -> Check<()> {
    match value.chars().find(|c| is_hidden(*c)) {
        Some(c) => Err(FieldError::new(
            field,
            format!("must not contain control, bidirectional or invisible characters (found U+{:04X})", u32::from(c)),
        )),
        None => Ok(()),
    }
}

/// Text a backend can store. The one character refused is NUL (U+0000):
/// Postgres cannot hold it in `text` or `jsonb`, and the embedded backend
/// refuses it too, so that both answer alike and an export from either
/// imports into the other.
pub fn storable(field: &str, value: &str) -> Check<()> {
    if value.contains('\0') {
        return Err(FieldError::new(field, "must not contain the NUL character (U+0000)"));
    }
    Ok(())
}

/// The largest magnitude a number inside a JSON value may have. Postgres
/// keeps a `jsonb` number as an exact decimal and writes `-1.79e308` back as
/// a 309-digit integer, which the JSON reader turns into infinity and
/// refuses; well below that bound every number reads back as written. The
/// same bound on both backends, so an export from either imports into the
/// other.
pub const MAX_JSON_NUMBER: f64 = 1e300;

/// Any JSON value a backend can store (policy, tool sequence, filters): no
/// NUL in any string or key and no number beyond `MAX_JSON_NUMBER`, at any
/// depth. The error names the exact value.
pub fn storable_json(field: &str, value: &Value) -> Check<()> {
    walk(field, value, &|at, key| storable(at, key))
}

/// Visits every string and key of a JSON value with its pointer; `key`
/// checks object keys (strings are checked for NUL).
fn walk(field: &str, value: &Value, key: &dyn Fn(&str, &str) -> Check<()>) -> Check<()> {
    match value {
        Value::String(s) => storable(field, s),
        Value::Array(items) => items.iter().enumerate().try_for_each(|(i, v)| walk(&format!("{field}/{i}"), v, key)),
        Value::Object(map) => map.iter().try_for_each(|(k, v)| {
            let at = format!("{field}/{}", k.replace('~', "~0").replace('/', "~1"));
            key(&at, k)?;
            walk(&at, v, key)
        }),
        Value::Number(n) => match n.as_f64() {
            Some(x) if x.abs() <= MAX_JSON_NUMBER => Ok(()),
            _ => Err(FieldError::new(field, "must be a number between -1e300 and 1e300")),
        },
        Value::Null | Value::Bool(_) => Ok(()),
    }
}

/// An identifier: 1 to 64 characters, no control, bidirectional or invisible
/// characters, no surrounding whitespace. Any other letter is welcome
/// (`josé@example.com`, `北京`).
pub fn identifier(field: &str, value: &str) -> Check<()> {
    if value.is_empty() {
        return Err(FieldError::new(field, "must not be empty"));
    }
    if value.chars().count() > MAX_ID_CHARS {
        return Err(FieldError::new(field, format!("must be at most {MAX_ID_CHARS} characters")));
    }
    visible(field, value)?;
    if value.trim() != value {
        return Err(FieldError::new(field, "must not begin or end with spaces"));
    }
    Ok(())
}

/// Free text of at most `max` characters (subject, predicate, object, trigger).
pub fn short_text(field: &str, value: &str, max: usize) -> Check<()> {
    if value.trim().is_empty() {
        return Err(FieldError::new(field, "must not be empty"));
    }
    if value.chars().count() > max {
        return Err(FieldError::new(field, format!("must be at most {max} characters")));
    }
    storable(field, value)
}

/// A name a client looks things up by (a skill's): short text with no hidden
/// characters.
pub fn name(field: &str, value: &str, max: usize) -> Check<()> {
    short_text(field, value, max)?;
    visible(field, value)
}

/// Memory content and query text: not blank, at most [`MAX_CONTENT_BYTES`].
pub fn content(field: &str, value: &str) -> Check<()> {
    if value.trim().is_empty() {
        return Err(FieldError::new(field, "must not be empty"));
    }
    if value.len() > MAX_CONTENT_BYTES {
        return Err(FieldError::new(field, format!("must be at most {MAX_CONTENT_BYTES} bytes")));
    }
    storable(field, value)
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

/// Metadata: a JSON object of bounded size whose keys, at any depth, are
/// non-empty and visible, and whose strings are storable.
pub fn metadata(field: &str, value: &Map<String, Value>) -> Check<()> {
    value.iter().try_for_each(|(k, v)| {
        let at = format!("{field}/{}", k.replace('~', "~0").replace('/', "~1"));
        let key = |at: &str, k: &str| {
            if k.is_empty() {
                return Err(FieldError::new(at, "keys must not be empty"));
            }
            storable(at, k)?;
            visible(at, k)
        };
        key(&at, k)?;
        walk(&at, v, &key)
    })?;
    let size = serde_json::to_vec(value).map(|v| v.len()).unwrap_or(usize::MAX);
    if size > MAX_METADATA_BYTES {
        return Err(FieldError::new(field, format!("must be at most {MAX_METADATA_BYTES} bytes as JSON")));
    }
    Ok(())
}

/// A timestamp both backends store: years 1 to 9999 (RFC 3339's four digits;
/// Postgres ends in 294276, SQLite's date functions at 9999).
pub fn timestamp(field: &str, value: DateTime<Utc>) -> Check<()> {
    use chrono::Datelike;
    if !(1..=9999).contains(&value.year()) {
        return Err(FieldError::new(field, "must lie between the years 1 and 9999"));
    }
    Ok(())
}

/// `occurred_at` may not lie more than a day in the future.
pub fn occurred_at(field: &str, value: DateTime<Utc>, now: DateTime<Utc>) -> Check<()> {
    timestamp(field, value)?;
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

    #[test]
    fn identifiers_refuse_hidden_characters_and_keep_letters() {
        for bad in
            ["a\u{202E}b", "a\u{2066}b", "a\u{200E}", "a\u{200B}b", "a\u{200D}b", "\u{FEFF}a", "a\u{2060}b", "a\0b"]
        {
            assert!(identifier("/agent_id", bad).is_err(), "{bad:?}");
        }
        for good in ["josé@example.com", "Zoë-Ångström", "北京", "user 42"] {
            assert_eq!(identifier("/agent_id", good), Ok(()), "{good:?}");
        }
    }

    #[test]
    fn nul_is_refused_at_any_depth_with_its_pointer() {
        let m = serde_json::json!({"a": {"b/c": ["x", "y\u{0000}"]}}).as_object().unwrap().clone();
        assert_eq!(metadata("/metadata", &m).unwrap_err().field, "/metadata/a/b~1c/1");
        let m = serde_json::json!({"a": {"k\u{0000}": 1}}).as_object().unwrap().clone();
        assert_eq!(metadata("/metadata", &m).unwrap_err().field, "/metadata/a/k\u{0000}");
        let m = serde_json::json!({"a\u{202E}": 1}).as_object().unwrap().clone();
        assert!(metadata("/metadata", &m).is_err());
        assert!(content("/content", "a\0b").is_err());
        assert!(short_text("/object", "a\0b", 10).is_err());
        assert!(storable_json("/policy", &serde_json::json!({"ok": ["fine", 1, null]})).is_ok());
        assert!(storable_json("/policy", &serde_json::json!({"ok": [-1e300, 2.2e-311, 1e300]})).is_ok());
        let err = storable_json("/policy", &serde_json::json!({"a": [1, -1.7976931348623157e308]})).unwrap_err();
        assert_eq!(err.field, "/policy/a/1");
    }
}
