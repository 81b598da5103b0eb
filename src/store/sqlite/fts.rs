//! The full-text query language of the SQLite backend: turning a user's
//! text into an FTS5 expression that can never be a syntax error, with the
//! stop words Postgres's English configuration drops, scoped to one
//! tenant's agent and tier. No SQL runs here.

use std::collections::HashSet;

use crate::domain::Tier;

/// Postgres's English stop words (`tsearch_data/english.stop`), dropped from
/// queries as `to_tsvector('english', ...)` drops them.
// Kept compact by hand: one word per line would take 127 lines.
#[rustfmt::skip]
const STOP_WORDS: &[&str] = &[
    "i", "me", "my", "myself", "we", "our", "ours", "ourselves", "you", "your", "yours", "yourself", "yourselves",
    "he", "him", "his", "himself", "she", "her", "hers", "herself", "it", "its", "itself", "they", "them", "their",
    "theirs", "themselves", "what", "which", "who", "whom", "this", "that", "these", "those", "am", "is", "are",
    "was", "were", "be", "been", "being", "have", "has", "had", "having", "do", "does", "did", "doing", "a", "an",
    "the", "and", "but", "if", "or", "because", "as", "until", "while", "of", "at", "by", "for", "with", "about",
    "against", "between", "into", "through", "during", "before", "after", "above", "below", "to", "from", "up",
    "down", "in", "out", "on", "off", "over", "under", "again", "further", "then", "once", "here", "there", "when",
    "where", "why", "how", "all", "any", "both", "each", "few", "more", "most", "other", "some", "such", "no",
    "nor", "not", "only", "own", "same", "so", "than", "too", "very", "s", "t", "can", "will", "just", "don",
    "should", "now",
];

/// The FTS5 query for a text: its words, split as `unicode61` splits them
/// (letters and digits; everything else separates), lowercased, stop words
/// and repeats dropped, each double-quoted (a quoted string is always a
/// plain term to FTS5, whatever it contains), joined with OR. `None` when no
/// word is left.
pub(super) fn fts_query(text: &str) -> Option<String> {
    let mut seen = HashSet::new();
    let terms: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .filter(|w| !STOP_WORDS.contains(&w.as_str()))
        .filter(|w| seen.insert(w.clone()))
        .map(|w| format!("\"{}\"", w.replace('"', "\"\"")))
        .collect();
    if terms.is_empty() { None } else { Some(terms.join(" OR ")) }
}

/// The full-text expression of one tier's search: the rows of the tenant's
/// agent in that tier (their `scope` token, as the triggers compute it) that
/// match a word of the query in their text.
pub(super) fn scoped(tenant: &str, agent: &str, tier: Tier, fts: &str) -> String {
    let scope = hex::encode_upper(format!("{tenant}\u{1f}{agent}\u{1f}{}", tier.as_str()));
    format!("scope : \"{scope}\" AND body : ({fts})")
}

#[cfg(test)]
mod tests {
    use super::{Tier, fts_query, scoped};

    #[test]
    fn fts_query_drops_stop_words_and_quotes_every_term() {
        assert_eq!(fts_query("What is the capital of France?").as_deref(), Some("\"capital\" OR \"france\""));
        assert_eq!(fts_query("the of and"), None);
        assert_eq!(fts_query(""), None);
        // FTS5 syntax in the input is just more separators.
        assert_eq!(
            fts_query("NEAR(a b) OR \"x* -y ^z").as_deref(),
            Some("\"near\" OR \"b\" OR \"x\" OR \"y\" OR \"z\"")
        );
        assert_eq!(fts_query("Don't repeat, repeat REPEAT").as_deref(), Some("\"repeat\""));
    }

    #[test]
    fn scoped_expressions_name_the_tenant_agent_and_tier_in_hex() {
        // "t" 0x1f "a" 0x1f "episodic", as SQLite's hex() spells it.
        assert_eq!(
            scoped("t", "a", Tier::Episodic, "\"kiwi\""),
            "scope : \"741F611F657069736F646963\" AND body : (\"kiwi\")"
        );
    }
}
