//! Words as full-text search reads them, for every backend: letters and
//! digits (everything else separates), lowercased, accents folded, the
//! English stop words dropped, Snowball's English stemmer applied — what
//! Postgres's `to_tsvector('english', ...)` makes of a text. The embedded
//! backend's index is built from them (`store::sqlite::text`), and recall
//! weighs a query's terms with them (`TermWeights`).
//!
//! Must not: touch storage.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::LazyLock;

use rust_stemmers::{Algorithm, Stemmer};
use unicode_normalization::UnicodeNormalization;
use unicode_normalization::char::is_combining_mark;

use super::{Memory, Tier};

/// Postgres's English stop words (`tsearch_data/english.stop`), dropped as
/// `to_tsvector('english', ...)` drops them.
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

static STOP: LazyLock<HashSet<&'static str>> = LazyLock::new(|| STOP_WORDS.iter().copied().collect());

pub static STEMMER: LazyLock<Stemmer> = LazyLock::new(|| Stemmer::create(Algorithm::English));

/// Calls `f` with each token of `text` (lowercased, accents folded) and
/// whether it is a stop word.
pub fn tokens(text: &str, mut f: impl FnMut(&str, bool)) {
    words(text, |word| f(word, STOP.contains(word)));
}

/// Calls `f` with each token of `text`, lowercased, accents folded.
fn words(text: &str, mut f: impl FnMut(&str)) {
    let mut lower = String::new();
    for word in text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
        lower.clear();
        if word.is_ascii() {
            lower.push_str(word);
            lower.make_ascii_lowercase();
        } else {
            lower.extend(word.nfd().filter(|c| !is_combining_mark(*c)).flat_map(char::to_lowercase));
        }
        f(&lower);
    }
}

/// The distinct search words of a query, stemmed, in order of appearance.
/// Empty when every word is a stop word.
pub fn query_terms(text: &str) -> Vec<String> {
    let mut terms: Vec<String> = Vec::new();
    tokens(text, |word, stop| {
        if !stop {
            let stem = STEMMER.stem(word).into_owned();
            if !terms.contains(&stem) {
                terms.push(stem);
            }
        }
    });
    terms
}

/// The text a memory is found by: its content, and for a skill its name
/// and trigger pattern too (what Postgres's `search_tsv` is generated from).
pub fn body(m: &Memory) -> Cow<'_, str> {
    body_of(m.tier, &m.content, m.skill_name.as_deref(), m.trigger_pattern.as_deref())
}

/// `body` from the columns it is made of.
pub fn body_of<'a>(tier: Tier, content: &'a str, skill_name: Option<&str>, trigger: Option<&str>) -> Cow<'a, str> {
    if tier == Tier::Procedural {
        let (name, trigger) = (skill_name.unwrap_or_default(), trigger.unwrap_or_default());
        Cow::Owned(format!("{name} {content} {trigger}"))
    } else {
        Cow::Borrowed(content)
    }
}

/// A query's search terms (at most `MAX_TERMS`, in order of appearance),
/// matched against candidates' texts.
///
/// Each distinct word is stemmed once and remembered: a context weighs
/// about a thousand candidates of a few hundred words each, which share most
/// of their words, and stemming every occurrence was the larger part of its
/// scoring.
pub struct QueryTerms {
    terms: Vec<String>,
    /// Per term, the only words that match it (with a plural "s"), when
    /// the query used it as a noun in "-ing" (`noun_in_ing`); empty: any
    /// word of its stem.
    only: Vec<Vec<String>>,
    /// The start every word of a term's stem begins with (`head`), each
    /// once: a word starting with none of them is not stemmed.
    heads: Vec<String>,
    /// Lowercased word -> the bit of the term it matches (0: none, or a
    /// stop word).
    seen: foldhash::HashMap<String, u64>,
}

/// The letters of `stem` that every word with this stem starts with: all
/// but its last three, and at least the first. Snowball's English stemmer
/// changes only a word's ending: it removes suffixes and replaces a few
/// (y by i, "ency" by "ence", "bility" by "ble", "ying" by "ie"), and the
/// letters it writes are at most the stem's last three. Words that cannot
/// have a query term's stem are then passed over without stemming, which
/// was most of the cost of weighing a context's thousand candidates.
fn head(stem: &str) -> &str {
    let keep = stem.chars().count().saturating_sub(3).max(1);
    stem.char_indices().nth(keep).map_or(stem, |(i, _)| &stem[..i])
}

/// Words that make the "-ing" word right after them a noun.
const DETERMINERS: &[&str] =
    &["a", "an", "the", "my", "your", "his", "her", "its", "our", "their", "this", "that", "these", "those"];

/// Whether a query word is a noun in "-ing" ("a living", "the evening",
/// "her painting"): the stemmer joins such a noun to words of another
/// sense ("lives", "even"), so that it matches only itself and its plural.
/// Told from the word before it; the same word as a verb ("she is
/// painting") keeps every word of its stem.
fn noun_in_ing(word: &str, previous: &str) -> bool {
    word.len() > 5 && word.ends_with("ing") && DETERMINERS.contains(&previous)
}

/// Query terms beyond this many are not weighed (a question has a handful).
pub const MAX_TERMS: usize = 64;

impl QueryTerms {
    pub fn new(query: &str) -> QueryTerms {
        let mut terms: Vec<String> = Vec::new();
        let mut only: Vec<Vec<String>> = Vec::new();
        let mut previous = String::new();
        tokens(query, |word, stop| {
            if !stop {
                let noun = noun_in_ing(word, &previous);
                let stem = STEMMER.stem(word);
                match terms.iter().position(|t| *t == stem) {
                    // Used as a noun only when every use of its stem is one.
                    Some(i) if noun && !only[i].is_empty() => only[i].push(word.to_string()),
                    Some(i) if !noun => only[i].clear(),
                    Some(_) => {}
                    None if terms.len() < MAX_TERMS => {
                        terms.push(stem.into_owned());
                        only.push(if noun { vec![word.to_string()] } else { Vec::new() });
                    }
                    None => {}
                }
            }
            previous.clear();
            previous.push_str(word);
        });
        let mut heads: Vec<String> = Vec::new();
        for t in &terms {
            let h = head(t);
            if !heads.iter().any(|k| h.starts_with(k.as_str())) {
                heads.retain(|k| !k.starts_with(h));
                heads.push(h.to_string());
            }
        }
        QueryTerms { terms, only, heads, seen: foldhash::HashMap::default() }
    }

    pub fn len(&self) -> usize {
        self.terms.len()
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// Which of the terms `text` holds: bit i for term i.
    pub fn matches(&mut self, text: &str) -> u64 {
        let mut mask = 0u64;
        if self.terms.is_empty() {
            return mask;
        }
        let (terms, only, heads, seen) = (&self.terms, &self.only, &self.heads, &mut self.seen);
        words(text, |word| {
            // The first letter first: most words fail there, without a
            // call to compare the rest.
            let starts = |h: &String| word.as_bytes().first() == h.as_bytes().first() && word.starts_with(h.as_str());
            if !heads.iter().any(starts) {
                return;
            }
            let bit = match seen.get(word) {
                Some(&bit) => bit,
                None => {
                    let bit = match STOP.contains(word) {
                        true => 0,
                        false => {
                            let stem = STEMMER.stem(word);
                            let plural_of =
                                |f: &String| word.strip_prefix(f.as_str()).is_some_and(|e| e.is_empty() || e == "s");
                            terms
                                .iter()
                                .position(|q| *q == stem)
                                .filter(|&i| only[i].is_empty() || only[i].iter().any(plural_of))
                                .map_or(0, |i| 1 << i)
                        }
                    };
                    seen.insert(word.to_string(), bit);
                    bit
                }
            };
            mask |= bit;
        });
        mask
    }
}

/// How much each query term tells the candidates of one search apart: its
/// inverse document frequency among them, so that a word every candidate
/// holds (a name in every fact of a small agent) adds almost nothing and a
/// word few hold counts most. Counted over the candidates, not the whole
/// store, so that every backend weighs alike without term statistics of its
/// own; the vector leg's candidates, found by meaning, keep the counts from
/// being only those of the rows that matched the words.
pub struct TermWeights {
    idf: Vec<f64>,
    total: f64,
}

impl TermWeights {
    /// The weights of `terms` terms over candidates given by their matches
    /// (`QueryTerms::matches`): bm25's idf with 1 added inside the
    /// logarithm, so that it stays positive for a term most of them hold.
    pub fn new(terms: usize, matches: impl IntoIterator<Item = u64>) -> TermWeights {
        let mut df = vec![0u32; terms.min(MAX_TERMS)];
        let mut n = 0u32;
        for mask in matches {
            n += 1;
            for (i, d) in df.iter_mut().enumerate() {
                *d += ((mask >> i) & 1) as u32;
            }
        }
        let n = f64::from(n);
        let idf: Vec<f64> = df.iter().map(|&d| (1.0 + (n - f64::from(d) + 0.5) / (f64::from(d) + 0.5)).ln()).collect();
        let total = idf.iter().sum();
        TermWeights { idf, total }
    }

    /// The share of the query's weight held by a text with these matches,
    /// in [0, 1]: 1 when it holds every term, 0 when none.
    pub fn coverage(&self, matches: u64) -> f64 {
        if self.total <= 0.0 {
            return 0.0;
        }
        let held: f64 = self.idf.iter().enumerate().filter(|(i, _)| (matches >> i) & 1 == 1).map(|(_, w)| w).sum();
        (held / self.total).clamp(0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_are_stemmed_without_stop_words() {
        assert_eq!(query_terms("What does Alice do for a living?"), ["alic", "live"]);
        let mut q = QueryTerms::new("Where is Alice living now?");
        assert_eq!(q.matches("Alice lives in Porto."), 0b11);
        assert_eq!(q.matches("Alice works as a nurse."), 0b01);
        assert_eq!(q.matches("Bob is a carpenter."), 0);
        // Remembered words match as when first seen.
        assert_eq!(q.matches("ALICE LIVED; Alice's living."), 0b11);
        assert_eq!(q.matches("alive"), 0);
    }

    #[test]
    fn a_noun_in_ing_matches_itself_and_its_plural_only() {
        // "a living" is a noun: "lives" and "lived" share its stem, not its sense.
        let mut q = QueryTerms::new("What does Alice do for a living?");
        assert_eq!(q.matches("Alice lives in Porto; she lived in Oslo."), 0b01);
        assert_eq!(q.matches("Alice makes a good living."), 0b11);
        assert_eq!(q.matches("Two livings."), 0b10);
        let mut q = QueryTerms::new("What did they do in the evening?");
        assert_eq!(q.matches("They were even."), 0);
        assert_eq!(q.matches("Evenings at home."), 0b1);
        // A verb in "-ing" keeps every word of its stem.
        let mut q = QueryTerms::new("What is Caroline researching?");
        assert_eq!(q.matches("Caroline researched adoption agencies."), 0b11);
        // A stem the query also uses otherwise is not a noun's alone.
        let mut q = QueryTerms::new("Where is the meeting, and when do we meet?");
        assert_eq!(q.matches("They met. We meet on Monday."), 0b1);
        let mut q = QueryTerms::new("When do we meet for the meeting?");
        assert_eq!(q.matches("We meet on Monday."), 0b1);
        // Short words in "-ing" are not such nouns ("the king", "a ring").
        let mut q = QueryTerms::new("Who is the king?");
        assert_eq!(q.matches("Kings and queens."), 0b1);
    }

    #[test]
    fn words_passed_over_unstemmed_could_not_have_matched() {
        // Endings the stemmer rewrites rather than removes, the words it
        // knows by heart, accents, and a query term per word: each query
        // matches the text through `head` as it does by stemming every word.
        let text = "Dying, lying and tying; skies, skis, idly, gently, early, only, singly, news, atlas. \
                    Visibility, ability, possibly, happily, vacancy, decency, relational, organizer, generously, \
                    aging, hoping, hopping, studies, agreed, feed, conditional, sensitivity, electricity, \
                    résumé, Café, naïve, Ökonomen, y, yes, sky, 1990s, COVID-19.";
        let mut all = Vec::new();
        tokens(text, |word, stop| all.push((word.to_string(), stop)));
        for (word, stop) in &all {
            let mut q = QueryTerms::new(word);
            // Stemming every word, as before `head`.
            let expected = u64::from(!stop);
            assert_eq!(q.matches(word), expected, "{word}");
            for (other, _) in &all {
                let same = !stop && STEMMER.stem(other) == STEMMER.stem(word);
                assert_eq!(q.matches(other) == 1, same, "query {word:?}, word {other:?}");
            }
        }
        assert_eq!(head("die"), "d");
        assert_eq!(head("possibl"), "poss");
        assert_eq!(head("résumé"), "rés");
    }

    #[test]
    fn a_term_every_candidate_holds_weighs_little() {
        let mut q = QueryTerms::new("What is Alice allergic to?");
        let docs = [
            "Alice works as a nurse.",
            "Alice is allergic to peanuts.",
            "Alice lives in Porto.",
            "Bob is allergic to shellfish.",
        ];
        let w = TermWeights::new(q.len(), docs.iter().map(|d| q.matches(d)));
        let cover: Vec<f64> = docs.iter().map(|d| w.coverage(q.matches(d))).collect();
        assert_eq!(cover[1], 1.0);
        // "alice" is in three of four, "allergic" in two: the rarer term
        // weighs more.
        assert!(cover[0] < 0.4 && cover[3] > 0.6, "{cover:?}");
        assert_eq!(cover[0], cover[2]);
        // No terms, or no candidates: nothing.
        assert_eq!(TermWeights::new(0, []).coverage(0), 0.0);
        assert_eq!(TermWeights::new(2, []).coverage(0b11), 1.0);
    }
}
