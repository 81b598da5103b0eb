//! Extractive summaries: the most telling sentences of a group of
//! episodes, verbatim.

use std::collections::HashSet;
use std::sync::LazyLock;

use regex::Regex;

use super::patterns::re;
use super::{facts_in, sentences};

/// An extractive summary of a group of episodes (oldest first).
///
/// Every sentence of every text is scored:
/// - facts: +2 when [`facts_in`] finds a fact in it;
/// - decisions and outcomes: +2 when it carries a decision, outcome or error
///   cue ("decided", "fixed", "failed", "error", ...);
/// - preferences and emphasis: +1 for "prefer", "always", "never",
///   "remember", "important" and the like;
/// - length: +1 for six to forty words, −1 for three words or fewer;
/// - questions: −1.
///
/// Sentences are then taken best first, ties going to the newer one (later
/// input, later position), skipping any whose words mostly repeat a sentence
/// already taken. The chosen sentences are returned in input order, joined by
/// a space, each exactly as it appears in its text.
pub fn summarise(texts: &[&str], max_sentences: usize) -> String {
    static DECISION: LazyLock<Regex> = LazyLock::new(|| {
        re(concat!(
            r"(?i)\b(?:decided|decision|decide|chose|chosen|agreed|settled\s+on|switched|went\s+with|will\s+use",
            r"|plan(?:ned)?|fixed|resolved|solved|failed|fails|failure|error|errors|bug|broke|broken|crash(?:ed|es)?",
            r"|timeout|timed\s+out|succeeded|success|successful|worked|works\s+now|passed|outcome|result|because",
            r"|learned|turns\s+out|root\s+cause|rolled\s+back|deployed|shipped)\b",
        ))
    });
    static PREFERENCE: LazyLock<Regex> = LazyLock::new(|| {
        re(
            r"(?i)\b(?:prefer|prefers|preferred|always|never|remember|important|must|allergic|favou?rite|love|hate|don't\s+like|deadline)\b",
        )
    });

    let mut candidates = Vec::new();
    for (t, text) in texts.iter().enumerate() {
        for (k, sentence) in sentences(text).into_iter().enumerate() {
            let words = sentence.split_whitespace().count();
            let mut score = 0i32;
            if !facts_in(sentence).is_empty() {
                score += 2;
            }
            if DECISION.is_match(sentence) {
                score += 2;
            }
            if PREFERENCE.is_match(sentence) {
                score += 1;
            }
            if (6..=40).contains(&words) {
                score += 1;
            } else if words <= 3 {
                score -= 1;
            }
            if sentence.ends_with('?') {
                score -= 1;
            }
            candidates.push((score, t, k, sentence));
        }
    }
    candidates.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(b.2.cmp(&a.2)));

    let mut chosen: Vec<(usize, usize, &str)> = Vec::new();
    let mut chosen_words: Vec<HashSet<String>> = Vec::new();
    for (_, t, k, sentence) in candidates {
        if chosen.len() >= max_sentences {
            break;
        }
        let words = word_set(sentence);
        if chosen_words.iter().any(|w| overlap(w, &words) >= 0.8) {
            continue;
        }
        chosen.push((t, k, sentence));
        chosen_words.push(words);
    }
    chosen.sort_by_key(|&(t, k, _)| (t, k));
    chosen.iter().map(|&(_, _, s)| s).collect::<Vec<_>>().join(" ")
}

fn word_set(s: &str) -> HashSet<String> {
    s.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase).collect()
}

/// Share of the smaller set's words found in the other: near 1 for a
/// repeated sentence, even with a word or two changed.
fn overlap(a: &HashSet<String>, b: &HashSet<String>) -> f64 {
    let smaller = a.len().min(b.len());
    if smaller == 0 {
        return 1.0;
    }
    a.intersection(b).count() as f64 / smaller as f64
}
