//! Who said a memory, and whether a query names them (speaker-aware
//! matching).
//!
//! Conversations are commonly stored one turn per memory as transcript lines
//! ("Caroline: I went to a support group yesterday."). A question about a
//! person ("What did Caroline research?") is mostly answered by that
//! person's own words; the other speaker's turns that mention them
//! ("Caroline, that's great!") are replies. The name itself tells the
//! candidates apart poorly: it is in half of them, so its term weight is low,
//! and the embedding of a short turn hardly carries its speaker.
//!
//! A memory's speaker is `metadata.speaker` when that is a string, else the
//! transcript prefix of its content: one to three words, each starting with
//! a capital letter, then `:` and white space, within the first
//! `MAX_PREFIX` bytes. A query names a speaker when every word of the name is
//! a word of the query (case and accents ignored, `domain::words::tokens`).
//! A prefix that is not a person ("Note: ...") only matters to a query that
//! holds the same word.
//!
//! Must not: touch storage.

use std::borrow::Cow;
use std::collections::HashSet;

use serde_json::Value;

use crate::domain::Memory;
use crate::domain::words::tokens;

/// The longest transcript prefix read as a speaker, `:` included.
pub const MAX_PREFIX: usize = 40;
/// The most words of a speaker's name in a prefix.
const MAX_WORDS: usize = 3;

/// The memory's speaker, if it has one.
pub fn speaker(memory: &Memory) -> Option<Cow<'_, str>> {
    if let Some(Value::String(s)) = memory.metadata.get("speaker") {
        return Some(Cow::Borrowed(s.as_str()));
    }
    prefix(&memory.content).map(Cow::Borrowed)
}

/// The speaker of a transcript line: "Name: text" or "First Last: text".
pub fn prefix(content: &str) -> Option<&str> {
    let head = match content.char_indices().nth(MAX_PREFIX) {
        Some((end, _)) => &content[..end],
        None => content,
    };
    let colon = head.find(':')?;
    let name = &head[..colon];
    let after = content[colon + 1..].chars().next();
    if !after.is_some_and(char::is_whitespace) {
        return None;
    }
    let words: Vec<&str> = name.split(' ').collect();
    if words.len() > MAX_WORDS || !words.iter().all(|w| is_name_word(w)) {
        return None;
    }
    Some(name)
}

fn is_name_word(word: &str) -> bool {
    let mut chars = word.chars();
    chars.next().is_some_and(char::is_uppercase)
        && chars.all(|c| c.is_alphanumeric() || matches!(c, '\'' | '’' | '-' | '.'))
}

/// The words of a query, to tell whether it names a speaker.
pub struct QueryNames(HashSet<String>);

impl QueryNames {
    pub fn new(query: &str) -> QueryNames {
        let mut words = HashSet::new();
        tokens(query, |w, _| {
            words.insert(w.to_string());
        });
        QueryNames(words)
    }

    /// Whether every word of `speaker` is a word of the query.
    pub fn names(&self, speaker: &str) -> bool {
        let mut any = false;
        let mut all = true;
        tokens(speaker, |w, _| {
            any = true;
            all &= self.0.contains(w);
        });
        any && all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transcript_line_has_its_speaker() {
        assert_eq!(prefix("Caroline: I went to a support group."), Some("Caroline"));
        assert_eq!(prefix("Dr. Ana Lima: the results are in."), Some("Dr. Ana Lima"));
        assert_eq!(prefix("O'Neil:\tyes"), Some("O'Neil"));
        assert_eq!(prefix("User: I am allergic to peanuts."), Some("User"));
    }

    #[test]
    fn other_colons_are_not_speakers() {
        // Lowercase, a sentence, a time, a URL, too many words, too far.
        assert_eq!(prefix("note: buy milk"), None);
        assert_eq!(prefix("The meeting moved to 10:30 on Friday."), None);
        assert_eq!(prefix("Meeting at 10:30"), None);
        assert_eq!(prefix("See https://example.com"), None);
        assert_eq!(prefix("Alice Bob Carol Dave: hi"), None);
        assert_eq!(prefix("Alice said: hi"), None);
        assert_eq!(prefix(&format!("{}: hi", "A".repeat(MAX_PREFIX))), None);
        assert_eq!(prefix("Alice:"), None);
        assert_eq!(prefix("Alice:x"), None);
        assert_eq!(prefix(""), None);
    }

    #[test]
    fn a_query_names_a_speaker_by_all_of_their_words() {
        let q = QueryNames::new("What did caroline research, and what did Ana say?");
        assert!(q.names("Caroline"));
        assert!(!q.names("Ana Lima"));
        assert!(!q.names("Melanie"));
        assert!(!q.names(""));
        assert!(QueryNames::new("Où habite Zoë ?").names("Zoe"));
    }
}
