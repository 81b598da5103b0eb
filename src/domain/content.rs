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
    let mut out = String::with_capacity(text.len());
    normalize_into(text, &mut out);
    out
}

/// [`normalize`] into a buffer the caller reuses (recall normalises every
/// candidate it deduplicates): one pass, no allocation once `out` is large
/// enough.
pub fn normalize_into(text: &str, out: &mut String) {
    out.clear();
    // ASCII is already in NFKC and lowercases byte by byte: the same result
    // without the normaliser.
    if text.is_ascii() {
        push_collapsed(text.bytes().map(|b| char::from(b.to_ascii_lowercase())), out);
    } else {
        push_collapsed(text.nfkc().flat_map(char::to_lowercase), out);
    }
    let kept = out.trim_end_matches(['.', '!', '?', ';', ' ']).len();
    out.truncate(kept);
}

/// Pushes `chars` with each whitespace run between words as one space and
/// none at either end.
fn push_collapsed(chars: impl Iterator<Item = char>, out: &mut String) {
    let mut gap = false;
    for c in chars {
        if c.is_whitespace() {
            gap = !out.is_empty();
        } else {
            if gap {
                out.push(' ');
                gap = false;
            }
            out.push(c);
        }
    }
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
    fn normalising_into_a_buffer_is_the_same_as_splitting_and_joining() {
        // The rule written the obvious way, against the one-pass version.
        fn by_words(text: &str) -> String {
            let folded: String = text.nfkc().flat_map(char::to_lowercase).collect();
            let collapsed = folded.split_whitespace().collect::<Vec<_>>().join(" ");
            collapsed.trim_end_matches(['.', '!', '?', ';', ' ']).to_string()
        }
        let mut buffer = String::from("left over from an earlier text");
        for text in [
            "",
            "   ",
            " . ",
            "One",
            "\t Two  words \n",
            "Ends with stops . ! ?;",
            "Inner. Stops; stay!  Then  space ",
            "Ｕser\u{3000}prefers\u{a0}Dark MODE…",
            "İstanbul ΣΑΣ straße ﬁne. ",
            "tab\tand\r\nnewline",
        ] {
            normalize_into(text, &mut buffer);
            assert_eq!(buffer, by_words(text), "{text:?}");
            assert_eq!(normalize(text), by_words(text), "{text:?}");
        }
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
