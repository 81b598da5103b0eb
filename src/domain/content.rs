//! Content normalisation and hashing: what makes two facts "the same" for
//! deduplication.
//!
//! The rule is deliberately conservative: it ignores differences a reader would
//! not call different (Unicode compatibility forms, case, runs of whitespace,
//! a trailing full stop), and nothing else, so two facts that merely mean the
//! same thing are kept apart (the consolidator merges those later).

use sha2::{Digest, Sha256};
use unicode_normalization::UnicodeNormalization;

/// NFKC, lower case, whitespace runs collapsed to one space, trimmed, and
/// trailing sentence punctuation (`.`, `!`, `?`, `;`) removed.
pub fn normalize(text: &str) -> String {
    // ASCII is already in NFKC and lowercases byte by byte: the same result
    // without the normaliser, which recall runs on every candidate.
    let folded: String =
        if text.is_ascii() { text.to_ascii_lowercase() } else { text.nfkc().flat_map(char::to_lowercase).collect() };
    let collapsed = folded.split_whitespace().collect::<Vec<_>>().join(" ");
    collapsed.trim_end_matches(['.', '!', '?', ';', ' ']).to_string()
}

/// Hex SHA-256 of the normalised text.
pub fn content_hash(text: &str) -> String {
    hex::encode(Sha256::digest(normalize(text).as_bytes()))
}

/// Normalised subject or predicate, used to find the fact a new one
/// contradicts: trimmed, lower case, inner whitespace collapsed.
pub fn normalize_key(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalisation_ignores_case_spacing_width_and_final_stop() {
        // Full-width "Ｕ" (U+FF35) folds to "u" under NFKC, then lower case.
        assert_eq!(normalize("  Ｕser   prefers\tDark mode. "), "user prefers dark mode");
        assert_eq!(normalize("User prefers dark mode!?"), "user prefers dark mode");
        // Inner punctuation is meaning, not noise.
        assert_eq!(normalize("Dr. Who likes tea."), "dr. who likes tea");
    }

    #[test]
    fn equal_facts_hash_equal_and_different_ones_do_not() {
        assert_eq!(content_hash("User prefers dark mode."), content_hash("user  prefers DARK mode"));
        assert_ne!(content_hash("User prefers dark mode"), content_hash("User prefers light mode"));
        // sha256("user prefers dark mode"), computed with `printf %s 'user prefers dark mode' | sha256sum`.
        assert_eq!(
            content_hash("User prefers dark mode."),
            "058e6f30768bdcc4b10c6310b0b3084eaee94c6ba986b8bfef1df175b2af2058"
        );
    }

    #[test]
    fn keys_are_trimmed_lowercased_and_collapsed() {
        assert_eq!(normalize_key("  Favourite   Colour "), "favourite colour");
    }
}
