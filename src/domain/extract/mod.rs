//! Rule-based reading of facts out of chat text, and extractive summaries of
//! groups of episodes.
//!
//! The server stores facts as (subject, predicate, object). Writers that send
//! only free text ("Oh nice! I just adopted a puppy named Max") would
//! otherwise leave the semantic tier empty, so this module reads the few kinds
//! of personal fact that matter most for an assistant (name, job, home,
//! family, pets, allergies, likes) with hand-written patterns. It is cheap,
//! deterministic and explainable, and it is meant to be replaced or backed by
//! a model where recall matters more than cost.
//!
//! What it does not do, on purpose or for lack of means:
//! - it reads only the speaker's own statements ("I", "my", and "we"/"our"
//!   for home and pets); "my sister is a nurse" yields no job;
//! - no coreference: "She's a doctor" or "it" are never resolved;
//! - no grammar: objects are cut at punctuation, conjunctions and time words,
//!   so a long or unusual phrase may be cut short or dropped;
//! - questions, quoted speech, clauses after "if", "wish", "would" and the
//!   like, and the few sarcasm markers it knows are skipped; other sarcasm,
//!   and negation phrased in ways the patterns do not expect, are not noticed;
//! - English only; past states ("I used to live in ...") are not facts.
//!
//! It must not invent text: every object and every summary sentence is a
//! slice of the input.

use std::collections::HashSet;
use std::sync::LazyLock;

use regex::{Match, Regex};

/// A fact read off one first-person statement.
#[derive(Debug, Clone, PartialEq)]
pub struct ExtractedFact {
    /// The predicate, snake_case, one of PREDICATES.
    pub predicate: &'static str,
    /// The object exactly as it occurs in the source text (a substring of
    /// it, same case), trimmed of surrounding punctuation and of a leading
    /// lowercase article or possessive.
    pub object: String,
    /// 0..1: how sure the rule is.
    pub confidence: f64,
}

/// Every predicate the extractor emits.
pub const PREDICATES: &[&str] = &[
    "name",
    "works_as",
    "works_at",
    "lives_in",
    "from",
    "has_pet",
    "allergic_to",
    "has_child",
    "married_to",
    "has_partner",
    "likes",
    "dislikes",
    "prefers",
];

mod patterns;
mod summary;

use patterns::*;
pub use summary::summarise;

/// Splits text into sentences, as slices of it.
///
/// A sentence ends at a newline, or at ".", "!" or "?" (runs of them, and a
/// closing quote or bracket right after) followed by white space or the end.
/// A dot does not end a sentence after a known abbreviation ("Dr.", "e.g.",
/// "St."), after a single capital (an initial), or inside a number (no space
/// follows it). Each sentence is trimmed; empty ones are skipped.
pub fn sentences(text: &str) -> Vec<&str> {
    const ABBREVIATIONS: &[&str] = &[
        "dr", "mr", "mrs", "ms", "prof", "st", "jr", "sr", "vs", "etc", "e.g", "i.e", "eg", "ie", "inc", "ltd", "co",
        "mt", "no", "approx", "a.m", "p.m", "fig", "dept", "ave", "u.s", "u.k", "cf", "al",
    ];
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut start = 0;
    let mut i = 0;
    fn push<'a>(out: &mut Vec<&'a str>, s: &'a str) {
        let s = s.trim();
        if !s.is_empty() {
            out.push(s);
        }
    }
    // All the boundary characters are ASCII, so byte offsets found here are
    // always on character boundaries.
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'\n' {
            push(&mut out, &text[start..i]);
            start = i + 1;
            i += 1;
            continue;
        }
        if matches!(b, b'.' | b'!' | b'?') {
            let mut end = i + 1;
            while end < bytes.len() && matches!(bytes[end], b'.' | b'!' | b'?') {
                end += 1;
            }
            // A closing quote or bracket belongs to the sentence it closes.
            let rest = &text[end..];
            let closer = rest.chars().take_while(|c| matches!(c, '"' | '\'' | ')' | ']' | '”' | '’')).count();
            let end_with_closer = end + rest.chars().take(closer).map(char::len_utf8).sum::<usize>();
            let at_break = end_with_closer >= bytes.len() || text[end_with_closer..].starts_with(char::is_whitespace);
            let abbreviation = b == b'.' && end == i + 1 && {
                let word = text[start..i].rsplit(|c: char| c.is_whitespace() || c == '(').next().unwrap_or("");
                let lower = word.to_lowercase();
                ABBREVIATIONS.contains(&lower.as_str())
                    || (word.chars().count() == 1 && word.chars().all(|c| c.is_uppercase()))
            };
            if at_break && !abbreviation {
                push(&mut out, &text[start..end_with_closer]);
                start = end_with_closer;
            }
            i = end_with_closer.max(i + 1);
            continue;
        }
        i += 1;
    }
    push(&mut out, &text[start..]);
    out
}

/// Byte ranges of a sentence inside double quotes. An unclosed quote runs to
/// the end: the sentence splitter may have cut a quotation in two.
fn quoted_ranges(s: &str) -> Vec<(usize, usize)> {
    let mut ranges = Vec::new();
    let mut open: Option<usize> = None;
    for (i, c) in s.char_indices() {
        match (c, open) {
            ('"', None) | ('“', None) => open = Some(i),
            ('"', Some(o)) | ('”', Some(o)) => {
                ranges.push((o, i + c.len_utf8()));
                open = None;
            }
            _ => {}
        }
    }
    if let Some(o) = open {
        ranges.push((o, s.len()));
    }
    ranges
}

/// Drops one leading lowercase article or possessive. A capitalised "The"
/// is kept: it is part of a title ("The Godfather").
fn strip_leading(s: &str) -> &str {
    let mut s = s.trim_start();
    for article in ["a ", "an ", "the ", "my ", "our ", "some "] {
        if let Some(rest) = s.strip_prefix(article) {
            s = rest.trim_start();
            break;
        }
    }
    s
}

/// Cleans a candidate object: trims punctuation, sheds a lowercase article,
/// and refuses pointers, empty and overlong phrases.
fn clean(s: &str) -> Option<&str> {
    let s =
        s.trim_matches(|c: char| c.is_whitespace() || (c.is_ascii_punctuation() && c != '&') || "“”‘’…".contains(c));
    let s = strip_leading(s);
    let first = s.split_whitespace().next()?.to_lowercase();
    let first = first.trim_matches(|c: char| !c.is_alphanumeric());
    if DEICTIC.contains(&first) {
        return None;
    }
    let words = s.split_whitespace().count();
    (1..=MAX_OBJECT_WORDS).contains(&words).then_some(s)
}

/// Cuts the object that starts at the beginning of `rest`.
fn cut(rest: &str, shape: Shape) -> Vec<&str> {
    let boundary = match shape {
        Shape::List => &*CUT_LIST,
        _ => &*CUT,
    };
    let mut end = boundary.find(rest).map_or(rest.len(), |m| m.start());
    if shape == Shape::Prefer {
        end = end.min(CUT_PREFER.find(&rest[..end]).map_or(end, |m| m.start()));
    }
    if shape == Shape::Place {
        end += place_region(&rest[end..]);
    }
    let object = &rest[..end];
    if shape == Shape::List {
        // An item with a verb in it is a clause that slipped through the
        // cut ("books, Harry Potter is"), not a thing.
        static VERB: LazyLock<Regex> = LazyLock::new(|| re(r"(?i)\b(?:is|are|was|were|'s|'re|has|have)\b"));
        LIST_SEP.split(object).filter(|item| !VERB.is_match(item)).filter_map(clean).collect()
    } else {
        clean(object).into_iter().collect()
    }
}

/// The length of ", Oregon" in "Portland, Oregon." when a capitalised region
/// follows a place and nothing but an end follows the region.
fn place_region(rest: &str) -> usize {
    static REGION: LazyLock<Regex> = LazyLock::new(|| {
        re(r"^,\s+\p{Lu}[\p{L}.-]*(?:\s+\p{Lu}[\p{L}.-]*){0,2}(?:$|\s*[.,;!?)]|\s+(?:and|but|with|now|since)\b)")
    });
    static REGION_ONLY: LazyLock<Regex> = LazyLock::new(|| re(r"^,\s+\p{Lu}[\p{L}.-]*(?:\s+\p{Lu}[\p{L}.-]*){0,2}"));
    if REGION.is_match(rest) { REGION_ONLY.find(rest).map_or(0, |m| m.end()).min(rest.len()) } else { 0 }
}

/// Whether a match in a sentence may yield a fact: outside quotes, and not
/// after a wish, condition, plan or "used to" earlier in the sentence.
fn stated(sentence: &str, at: usize, quotes: &[(usize, usize)]) -> bool {
    !quotes.iter().any(|&(a, b)| at >= a && at < b) && !HYPOTHETICAL.is_match(&sentence[..at])
}

/// A fact whose object is copied from a slice of the source.
fn fact(predicate: &'static str, object: &str, confidence: f64) -> ExtractedFact {
    ExtractedFact { predicate, object: object.to_string(), confidence }
}

/// Whether the words before the head noun of `phrase` read as modifiers:
/// none is a function word, a word in `forbidden`, or someone else's
/// possessive ("my friend's dog").
fn modifiers_ok(phrase: &str, forbidden: &[&str]) -> bool {
    let words: Vec<_> = phrase.split_whitespace().collect();
    words[..words.len().saturating_sub(1)].iter().all(|w| {
        let w = w.to_lowercase();
        !STOP.contains(&w.as_str()) && !forbidden.contains(&w.as_str()) && !w.ends_with("'s") && !w.ends_with("’s")
    })
}

/// Capitalised words that follow "call me" or "my son" without being names.
fn is_name(word: &str) -> bool {
    const NOT_NAMES: &[&str] = &[
        "I",
        "I'm",
        "I’m",
        "I've",
        "I’ve",
        "I'd",
        "I’d",
        "I'll",
        "I’ll",
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Dr",
        "Mr",
        "Mrs",
        "Ms",
        "Miss",
        "Prof",
        "Sir",
    ];
    !NOT_NAMES.contains(&word)
}

/// Facts stated in the first person in `text`.
///
/// Each sentence is read on its own. A sentence ending in "?" or carrying a
/// sarcasm marker yields nothing; a match inside double quotes or after a
/// hypothetical marker ("if", "wish", "would", "used to", ...) yields nothing.
/// Negation is handled by the patterns themselves: only a few harmless
/// adverbs may stand between "I" and the verb, so "I'm not allergic" and "I
/// don't live in" never match (except "don't like", which is a dislike).
///
/// Object rules: cut at punctuation, conjunctions, time and degree phrases,
/// "for" and "with"; a leading lowercase article or "my"/"our" is dropped;
/// pronouns are refused; an object longer than [`MAX_OBJECT_WORDS`] drops
/// the fact. Likes, dislikes
/// and allergies are split into one fact per list item. Pets: the animal
/// phrase with its count and modifiers, plus a name that follows directly or
/// after "named"/"called" ("cat Luna", "puppy named Max", "two cats").
/// Children and partners: the name when one is given, else the relation
/// word ("Jake", "son", "two kids", "husband"). Duplicates (same predicate
/// and object, ignoring case) are dropped, first kept.
pub fn facts_in(text: &str) -> Vec<ExtractedFact> {
    let mut out: Vec<ExtractedFact> = Vec::new();
    for sentence in sentences(text) {
        let sentence = SPEAKER.find(sentence).map_or(sentence, |m| &sentence[m.end()..]);
        if sentence.trim_end_matches(['"', '\'', ')', '”', '’']).ends_with('?') || SARCASM.is_match(sentence) {
            continue;
        }
        read_sentence(sentence, &mut out);
    }
    let mut seen = HashSet::new();
    out.retain(|f| seen.insert((f.predicate, f.object.to_lowercase())));
    out
}

fn read_sentence(s: &str, out: &mut Vec<ExtractedFact>) {
    let quotes = quoted_ranges(s);
    let ok = |m: &Match| stated(s, m.start(), &quotes);

    for (regex, confidence) in NAME_RULES.iter() {
        for caps in regex.captures_iter(s) {
            let (Some(whole), Some(name)) = (caps.get(0), caps.get(1)) else { continue };
            let first = name.as_str().split_whitespace().next().unwrap_or("");
            if ok(&whole) && is_name(first) {
                // Stop before a capitalised word that is not a name ("Sam I'm").
                let words = name.as_str().split_whitespace().take_while(|w| is_name(w)).count();
                let Some(object) = first_words(name.as_str(), words) else { continue };
                out.push(fact("name", object, *confidence));
            }
        }
    }

    for (regex, confidence) in JOB_RULES.iter() {
        for caps in regex.captures_iter(s) {
            let (Some(whole), Some(job)) = (caps.get(0), caps.get(1)) else { continue };
            if !ok(&whole) || !modifiers_ok(job.as_str(), NOT_A_JOB) {
                continue;
            }
            let after = &s[job.end()..];
            // "a teacher's aide", "a doctor appointment": the noun is not the head.
            if after.starts_with(['\'', '’']) || after.starts_with(|c: char| c.is_alphanumeric()) {
                continue;
            }
            out.push(fact("works_as", job.as_str(), *confidence));
            let student = job.as_str().to_lowercase().ends_with("student");
            static AT: LazyLock<Regex> = LazyLock::new(|| re(r"^\s+(?:at|for|with)\s+"));
            if let (false, Some(at)) = (student, AT.find(after)) {
                for object in cut(&after[at.end()..], Shape::One) {
                    out.push(fact("works_at", object, 0.7));
                }
            }
        }
    }

    for r in RULES.iter() {
        for m in r.regex.find_iter(s) {
            if ok(&m) {
                for object in cut(&s[m.end()..], r.shape) {
                    out.push(fact(r.predicate, object, r.confidence));
                }
            }
        }
    }
    if let Some(i) = s.find("I ").or_else(|| s.find("I'")).or_else(|| s.find("I’")) {
        for caps in AND_CLAUSE.captures_iter(s) {
            let Some(m) = caps.get(0) else { continue };
            if m.start() > i && ok(&m) {
                let (predicate, shape) =
                    if caps.get(1).is_some() { ("works_at", Shape::One) } else { ("lives_in", Shape::Place) };
                for object in cut(&s[m.end()..], shape) {
                    out.push(fact(predicate, object, 0.7));
                }
            }
        }
    }
    for caps in ALLERGY_NOUN.captures_iter(s) {
        if let (Some(m), Some(allergen)) = (caps.get(0), caps.get(1))
            && ok(&m)
            && let Some(object) = clean(allergen.as_str())
        {
            out.push(fact("allergic_to", object, 0.8));
        }
    }

    read_pets(s, &quotes, out);
    read_family(s, &quotes, out);
}

/// The first `n` words of `s`, as a slice of it.
fn first_words(s: &str, n: usize) -> Option<&str> {
    let last = s.split_whitespace().nth(n.checked_sub(1)?)?;
    // `last` is a slice of `s`, so its offset is the distance between them.
    let end = last.as_ptr() as usize - s.as_ptr() as usize + last.len();
    Some(&s[..end])
}

fn read_pets(s: &str, quotes: &[(usize, usize)], out: &mut Vec<ExtractedFact>) {
    // Offsets are relative to `hay`, the slice the captures were taken from.
    fn pet_object(hay: &str, caps: &regex::Captures) -> Option<(usize, usize)> {
        let animal = caps.get(1)?;
        if !modifiers_ok(animal.as_str(), &[]) {
            return None;
        }
        let next = hay[animal.end()..].split_whitespace().next().unwrap_or("").to_lowercase();
        if NOT_A_PET_AFTER.contains(&next.trim_matches(|c: char| !c.is_alphanumeric())) {
            return None;
        }
        let end = match caps.get(2) {
            Some(name) if name.as_str().split_whitespace().last().is_some_and(is_name) => name.end(),
            _ => animal.end(),
        };
        Some((animal.start(), end))
    }
    let mut push = |start: usize, end: usize, confidence: f64| {
        if let Some(object) = clean(&s[start..end]) {
            out.push(fact("has_pet", object, confidence));
        }
    };

    for m in PET_VERB.find_iter(s) {
        if !stated(s, m.start(), quotes) {
            continue;
        }
        let mut at = m.end();
        while let Some(caps) = PET_NP.captures(&s[at..]) {
            let Some((a, b)) = pet_object(&s[at..], &caps) else { break };
            push(at + a, at + b, 0.8);
            at += b;
            match PET_JOIN.find(&s[at..]) {
                Some(j) => at += j.end(),
                None => break,
            }
        }
    }
    for caps in PET_POSSESSIVE.captures_iter(s) {
        let Some(whole) = caps.get(0) else { continue };
        if stated(s, whole.start(), quotes)
            && let Some((a, b)) = pet_object(s, &caps)
        {
            push(a, b, 0.7);
        }
    }
}

fn read_family(s: &str, quotes: &[(usize, usize)], out: &mut Vec<ExtractedFact>) {
    fn named(m: Option<Match<'_>>) -> Option<&str> {
        m.filter(|n| is_name(n.as_str())).map(|n| n.as_str())
    }

    for caps in CHILD_POSSESSIVE.captures_iter(s) {
        let (Some(whole), Some(kin)) = (caps.get(0), caps.get(2)) else { continue };
        if !stated(s, whole.start(), quotes) {
            continue;
        }
        let object = match named(caps.get(3)).or_else(|| named(caps.get(4))) {
            Some(name) => name,
            None => {
                // Keep a count ("two kids") but not other modifiers.
                let mods = caps.get(1).map_or("", |m| m.as_str());
                let count = mods
                    .split_whitespace()
                    .find(|w| ["two", "three", "four", "five", "six"].contains(&w.to_lowercase().as_str()));
                match count.and_then(|c| s[..kin.end()].rfind(c)) {
                    Some(i) => &s[i..kin.end()],
                    None => kin.as_str(),
                }
            }
        };
        out.push(fact("has_child", object, 0.7));
    }
    for caps in CHILD_HAVE.captures_iter(s) {
        let (Some(whole), Some(kin)) = (caps.get(0), caps.get(3)) else { continue };
        if !stated(s, whole.start(), quotes) {
            continue;
        }
        let object = match (named(caps.get(4)), caps.get(2)) {
            (Some(name), _) => name,
            (None, Some(count)) => &s[count.start()..kin.end()],
            (None, None) => kin.as_str(),
        };
        out.push(fact("has_child", object, 0.8));
    }
    for caps in SPOUSE.captures_iter(s) {
        let (Some(whole), Some(role)) = (caps.get(0), caps.get(1)) else { continue };
        if !stated(s, whole.start(), quotes) {
            continue;
        }
        let lower = role.as_str().to_lowercase();
        let married = ["wife", "husband", "spouse", "hubby"].contains(&lower.as_str());
        let object = named(caps.get(2)).or_else(|| named(caps.get(3))).unwrap_or(role.as_str());
        out.push(fact(if married { "married_to" } else { "has_partner" }, object, if married { 0.8 } else { 0.7 }));
    }
    for caps in MARRIED_TO.captures_iter(s) {
        let Some(whole) = caps.get(0) else { continue };
        if let Some(name) = caps.get(1).or_else(|| caps.get(2))
            && stated(s, whole.start(), quotes)
        {
            out.push(fact("married_to", name.as_str(), 0.8));
        }
    }
}

#[cfg(test)]
mod tests;
