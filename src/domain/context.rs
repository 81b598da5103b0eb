//! Token-budgeted context assembly: which recalled memories go into an LLM
//! prompt, in what order, and what was left out.
//!
//! The rule, exactly:
//! 1. budget = max_context_tokens − system prompt tokens − query tokens −
//!    output_reserve_tokens (done by the caller; a negative budget is refused
//!    before this module runs).
//! 2. Each tier gets floor(budget × share) tokens (working 40 %, semantic 25 %,
//!    episodic 20 %, procedural 15 % by default; shares are normalised to sum 1).
//! 3. First pass, tier by tier, best score first: a memory whose rendered line
//!    fits the tier's remaining share is taken whole. One that does not fit is
//!    shortened to fit when at least [`MIN_SHORTEN_TOKENS`] remain (see
//!    [`shorten`]); otherwise it waits.
//! 4. Second pass: whatever the shares left unused (a tier with few memories
//!    leaves most of its share) is pooled, and the memories still waiting, of
//!    every tier, are taken by score with the same fit-or-shorten rule. Unused
//!    budget is never wasted while a memory is waiting.
//! 5. The block is rendered — working memory first in chronological order,
//!    then everything else by score, one line per memory, `[tier] text` — and
//!    counted as a whole. Should the whole ever exceed the budget (token
//!    boundaries between lines), the lowest-scored memory is dropped until it fits.
//!    `tokens_used` is the count of the rendered block and never exceeds the budget.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::memory::Tier;
use super::validate::FieldError;

/// Below this many tokens left, a memory is not worth shortening.
pub const MIN_SHORTEN_TOKENS: usize = 16;
/// Joins the sentences kept from a shortened memory.
pub const ELLIPSIS: &str = " … ";

/// Counts and cuts text in a model's tokens.
pub trait Tokenizer: Send + Sync {
    fn count(&self, text: &str) -> usize;
    /// A number `count(text)` is never below, much cheaper to compute: lets
    /// packing pass over a candidate that cannot fit without counting it.
    /// 0 when none is known.
    fn at_least(&self, _text: &str) -> usize {
        0
    }
    /// The longest prefix of `text` of at most `max_tokens` tokens.
    fn truncate(&self, text: &str, max_tokens: usize) -> String;
}

/// Shares of the budget per tier.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Allocation {
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub working: f64,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub semantic: f64,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub episodic: f64,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub procedural: f64,
}

impl Default for Allocation {
    fn default() -> Self {
        Self { working: 0.40, semantic: 0.25, episodic: 0.20, procedural: 0.15 }
    }
}

impl Allocation {
    pub fn check(&self, at: &str) -> Result<(), FieldError> {
        for (name, v) in [
            ("working", self.working),
            ("semantic", self.semantic),
            ("episodic", self.episodic),
            ("procedural", self.procedural),
        ] {
            if !v.is_finite() || !(0.0..=1.0).contains(&v) {
                return Err(FieldError::new(format!("{at}/{name}"), "must be a number between 0 and 1"));
            }
        }
        if self.total() == 0.0 {
            return Err(FieldError::new(at, "at least one share must be above 0"));
        }
        Ok(())
    }

    fn total(&self) -> f64 {
        self.working + self.semantic + self.episodic + self.procedural
    }

    /// floor(budget × share / sum of shares).
    pub fn tokens_for(&self, tier: Tier, budget: usize) -> usize {
        let share = match tier {
            Tier::Working => self.working,
            Tier::Semantic => self.semantic,
            Tier::Episodic => self.episodic,
            Tier::Procedural => self.procedural,
        };
        ((budget as f64) * share / self.total()).floor() as usize
    }
}

/// A recalled memory offered to the packer (its text borrowed: a context
/// offers hundreds, and packs a few dozen).
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    pub id: Uuid,
    pub tier: Tier,
    pub content: Cow<'a, str>,
    pub score: f64,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct PackedItem {
    pub id: Uuid,
    pub tier: Tier,
    /// The text that went into the context (shortened if `shortened`).
    pub text: String,
    pub score: f64,
    /// Tokens of this memory's rendered line.
    pub tokens: usize,
    pub shortened: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Packed {
    /// In output order.
    pub items: Vec<PackedItem>,
    pub rendered: String,
    pub tokens_used: usize,
    pub dropped_ids: Vec<Uuid>,
}

impl Packed {
    pub fn per_tier(&self) -> BTreeMap<Tier, usize> {
        let mut out = BTreeMap::new();
        for item in &self.items {
            *out.entry(item.tier).or_insert(0) += item.tokens;
        }
        out
    }
}

const TIER_ORDER: [Tier; 4] = [Tier::Working, Tier::Semantic, Tier::Episodic, Tier::Procedural];

/// A memory's line in the block: `[tier] ` and its words joined by single
/// spaces. Packing builds one for every candidate it weighs (a thousand for
/// a context), so it is built in one allocation.
fn line(tier: Tier, text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    out.push('[');
    out.push_str(tier.as_str());
    out.push_str("] ");
    let start = out.len();
    for_each_word(text, |word| {
        if out.len() > start {
            out.push(' ');
        }
        out.push_str(word);
    });
    out.push('\n');
    out
}

/// Calls `f` with each word of `text` as `str::split_whitespace` finds them;
/// an ASCII text (most memories) is split byte by byte, without decoding
/// characters or looking up Unicode's whitespace table.
pub fn for_each_word<'a>(text: &'a str, mut f: impl FnMut(&'a str)) {
    if !text.is_ascii() {
        text.split_whitespace().for_each(f);
        return;
    }
    // `char::is_whitespace` on ASCII: space and \t \n \x0b \x0c \r.
    let space = |b: u8| matches!(b, b' ' | b'\t'..=b'\r');
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        while i < bytes.len() && space(bytes[i]) {
            i += 1;
        }
        let start = i;
        while i < bytes.len() && !space(bytes[i]) {
            i += 1;
        }
        if start < i {
            f(&text[start..i]);
        }
    }
}

fn words(text: &str) -> HashSet<String> {
    text.split(|c: char| !c.is_alphanumeric()).filter(|w| w.chars().count() >= 3).map(str::to_lowercase).collect()
}

/// Splits on sentence ends (`.`, `!`, `?` followed by a space) and line breaks.
pub fn sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let chars: Vec<char> = text.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if c == '\n' {
            if !current.trim().is_empty() {
                out.push(current.trim().to_string());
            }
            current.clear();
            continue;
        }
        current.push(c);
        let end = matches!(c, '.' | '!' | '?') && chars.get(i + 1).is_none_or(|n| n.is_whitespace());
        if end {
            out.push(current.trim().to_string());
            current.clear();
        }
    }
    if !current.trim().is_empty() {
        out.push(current.trim().to_string());
    }
    out
}

/// Shortens a memory to fit `max_tokens` rendered, keeping its highest-value
/// sentences: sentences are ranked by how many distinct query words (three
/// letters or more) they contain, ties by position; they are added in that
/// order while the line still fits, and kept in their original order joined
/// by " … ". If not even the best sentence fits, it is cut to the tokens left
/// and ends with "…". Returns None when nothing fits.
pub fn shorten(tier: Tier, content: &str, query: &str, max_tokens: usize, tok: &dyn Tokenizer) -> Option<String> {
    let q = words(query);
    let parts = sentences(content);
    let mut ranked: Vec<(usize, usize)> =
        parts.iter().enumerate().map(|(i, s)| (words(s).intersection(&q).count(), i)).collect();
    ranked.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut chosen: Vec<usize> = Vec::new();
    for &(_, i) in &ranked {
        let mut trial = chosen.clone();
        trial.push(i);
        trial.sort_unstable();
        let text = trial.iter().map(|&j| parts[j].as_str()).collect::<Vec<_>>().join(ELLIPSIS);
        if tok.count(&line(tier, &text)) <= max_tokens {
            chosen = trial;
        }
    }
    if !chosen.is_empty() {
        return Some(chosen.iter().map(|&j| parts[j].as_str()).collect::<Vec<_>>().join(ELLIPSIS));
    }
    // Not even one sentence fits: cut the best one.
    let best = &parts[ranked.first()?.1];
    let overhead = tok.count(&line(tier, "…"));
    let room = max_tokens.checked_sub(overhead)?;
    if room == 0 {
        return None;
    }
    let mut cut = tok.truncate(best, room);
    loop {
        let text = format!("{}…", cut.trim_end());
        if tok.count(&line(tier, &text)) <= max_tokens {
            return (!cut.trim().is_empty()).then_some(text);
        }
        // Token boundaries shifted; give one more token back.
        let n = tok.count(&cut);
        if n == 0 {
            return None;
        }
        cut = tok.truncate(&cut, n - 1);
    }
}

/// Packs candidates into `budget` tokens by the rule in the module docs.
pub fn pack(
    candidates: &[Candidate],
    query: &str,
    budget: usize,
    allocation: &Allocation,
    tok: &dyn Tokenizer,
) -> Packed {
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by(|&a, &b| candidates[b].score.total_cmp(&candidates[a].score).then(a.cmp(&b)));
    let mut taken: Vec<Option<PackedItem>> = vec![None; candidates.len()];
    // Each candidate's whole-line cost, counted once: pass 2 asks again for
    // every candidate pass 1 left out.
    let mut costs: Vec<Option<usize>> = vec![None; candidates.len()];
    // And the lower bound on it, for candidates not worth counting.
    let mut least: Vec<Option<usize>> = vec![None; candidates.len()];

    let mut try_take = |i: usize, room: usize, taken: &mut Vec<Option<PackedItem>>| -> usize {
        let c = &candidates[i];
        // Every line costs at least one token.
        if room == 0 {
            return 0;
        }
        let cost = match costs[i] {
            Some(cost) => cost,
            // Surely too long: no need to build or count its line (yet).
            None if least[i].is_some_and(|l| l > room) => usize::MAX,
            None => {
                let whole = line(c.tier, &c.content);
                if *least[i].insert(tok.at_least(&whole)) > room {
                    usize::MAX
                } else {
                    *costs[i].insert(tok.count(&whole))
                }
            }
        };
        if cost <= room {
            taken[i] = Some(PackedItem {
                id: c.id,
                tier: c.tier,
                text: c.content.to_string(),
                score: c.score,
                tokens: cost,
                shortened: false,
            });
            return cost;
        }
        if room >= MIN_SHORTEN_TOKENS
            && let Some(text) = shorten(c.tier, &c.content, query, room, tok)
        {
            let cost = tok.count(&line(c.tier, &text));
            taken[i] = Some(PackedItem { id: c.id, tier: c.tier, text, score: c.score, tokens: cost, shortened: true });
            return cost;
        }
        0
    };

    // Pass 1: each tier within its share.
    let mut used = 0;
    for tier in TIER_ORDER {
        let mut room = allocation.tokens_for(tier, budget);
        for &i in order.iter().filter(|&&i| candidates[i].tier == tier) {
            let cost = try_take(i, room, &mut taken);
            room -= cost;
            used += cost;
        }
    }
    // Pass 2: the pooled leftovers, every tier, by score.
    let mut room = budget.saturating_sub(used);
    for &i in &order {
        if taken[i].is_none() {
            room -= try_take(i, room, &mut taken);
        }
    }

    loop {
        let (items, rendered) = render(candidates, &taken);
        let tokens_used = tok.count(&rendered);
        if tokens_used <= budget {
            let dropped_ids = (0..candidates.len()).filter(|&i| taken[i].is_none()).map(|i| candidates[i].id).collect();
            return Packed { items, rendered, tokens_used, dropped_ids };
        }
        // Safety net: drop the lowest-scored memory taken.
        let worst = order.iter().rev().find(|&&i| taken[i].is_some()).copied();
        match worst {
            Some(i) => taken[i] = None,
            None => unreachable!("an empty block has no tokens"),
        }
    }
}

/// Working memory first (oldest first), then the rest by score.
fn render(candidates: &[Candidate], taken: &[Option<PackedItem>]) -> (Vec<PackedItem>, String) {
    let mut working: Vec<usize> =
        (0..candidates.len()).filter(|&i| taken[i].is_some() && candidates[i].tier == Tier::Working).collect();
    working.sort_by_key(|&i| (candidates[i].created_at, candidates[i].id));
    let mut rest: Vec<usize> =
        (0..candidates.len()).filter(|&i| taken[i].is_some() && candidates[i].tier != Tier::Working).collect();
    rest.sort_by(|&a, &b| candidates[b].score.total_cmp(&candidates[a].score).then(a.cmp(&b)));
    let items: Vec<PackedItem> = working.into_iter().chain(rest).filter_map(|i| taken[i].clone()).collect();
    let rendered: String = items.iter().map(|it| line(it.tier, &it.text)).collect();
    (items, rendered)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_split_like_split_whitespace() {
        let texts = [
            "plain words here",
            "  leading and trailing  ",
            "tabs\tnew\nlines\r\nvertical\x0btab\x0cfeed",
            "no-break\u{a0}space and ideographic\u{3000}space, em\u{2003}space",
            "",
            " \t\n ",
            "one",
        ];
        for text in texts {
            let mut words = Vec::new();
            for_each_word(text, |w| words.push(w));
            assert_eq!(words, text.split_whitespace().collect::<Vec<_>>(), "{text:?}");
        }
        assert_eq!(line(Tier::Semantic, "  a\n b\x0bc  "), "[semantic] a b c\n");
    }

    /// Counts whitespace-separated words: simple enough to work the numbers
    /// out by hand. (The server uses a BPE tokenizer; see the tiktoken test.)
    struct Words;

    impl Tokenizer for Words {
        fn count(&self, text: &str) -> usize {
            text.split_whitespace().count()
        }
        fn truncate(&self, text: &str, max_tokens: usize) -> String {
            text.split_whitespace().take(max_tokens).collect::<Vec<_>>().join(" ")
        }
        fn at_least(&self, text: &str) -> usize {
            self.count(text)
        }
    }

    fn cand(n: u128, tier: Tier, content: &str, score: f64) -> Candidate<'static> {
        Candidate {
            id: Uuid::from_u128(n),
            tier,
            content: Cow::Owned(content.to_string()),
            score,
            created_at: DateTime::from_timestamp(1_700_000_000 + n as i64, 0).unwrap(),
        }
    }

    fn words_of(n: usize, stem: &str) -> String {
        (0..n).map(|i| format!("{stem}{i}")).collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn shares_split_the_budget_and_unused_share_passes_on() {
        // Budget 100 → working 40, semantic 25, episodic 20, procedural 15.
        // A line costs 1 ("[tier]") + its words.
        let cands = vec![
            cand(1, Tier::Working, &words_of(9, "w"), 0.9),    // 10 tokens
            cand(2, Tier::Semantic, &words_of(19, "s"), 0.8),  // 20 tokens, fits 25
            cand(3, Tier::Semantic, &words_of(9, "t"), 0.7),   // 10 tokens, only 5 left → waits (5 < 16)
            cand(4, Tier::Episodic, &words_of(29, "e"), 0.6), // 30 tokens > 20 → shortened? one sentence of 29 words: cut
            cand(5, Tier::Procedural, &words_of(4, "p"), 0.5), // 5 tokens
        ];
        let packed = pack(&cands, "", 100, &Allocation::default(), &Words);
        // Pass 1: working takes #1 (10 of 40); semantic takes #2 (20 of 25), #3 waits;
        // episodic: #4 costs 30 > 20 left, 20 ≥ 16 so it is cut to fit: "[episodic]" (1) + "e0 … e17…"
        // → 1 + 18 words = 19 tokens ≤ 20 (the "…" glues to the last word);
        // procedural takes #5 (5 of 15). Used: 10 + 20 + 19 + 5 = 54.
        // Pass 2: 100 − 54 = 46 left; #3 (10 tokens) now fits.
        let ids: Vec<u128> = packed.items.iter().map(|i| i.id.as_u128()).collect();
        assert_eq!(ids, [1, 2, 3, 4, 5], "working first, then by score");
        let e = packed.items.iter().find(|i| i.id.as_u128() == 4).unwrap();
        assert!(e.shortened);
        assert_eq!(e.tokens, 19);
        assert_eq!(packed.tokens_used, 10 + 20 + 10 + 19 + 5);
        assert!(packed.dropped_ids.is_empty());
        assert_eq!(packed.per_tier()[&Tier::Semantic], 30);
    }

    #[test]
    fn shorten_keeps_the_sentences_that_match_the_query_in_their_order() {
        let content = "We met in Lisbon. The weather was grey. She ordered grilled sardines and wine. Then we left.";
        // Query words ≥ 3 letters: {sardines, lisbon}. Sentence overlaps: 1, 0, 1, 0.
        // Ranked: #0 (1), #2 (1), #1 (0), #3 (0). Budget 14: "[episodic]" + "We met in Lisbon." = 5;
        // + " … She ordered grilled sardines and wine." → 5 + 7 = 12 ≤ 14; + "The weather was grey." → 16 > 14.
        // + "Then we left." → 12 + 4 = 16 > 14. Result: sentences 0 and 2.
        let got = shorten(Tier::Episodic, content, "sardines in lisbon", 14, &Words).unwrap();
        assert_eq!(got, "We met in Lisbon. … She ordered grilled sardines and wine.");
    }

    #[test]
    fn a_budget_too_small_for_anything_packs_nothing() {
        let cands = vec![cand(1, Tier::Semantic, "The user prefers aisle seats", 0.9)];
        let packed = pack(&cands, "seats", 3, &Allocation::default(), &Words);
        assert!(packed.items.is_empty());
        assert_eq!(packed.tokens_used, 0);
        assert_eq!(packed.rendered, "");
        assert_eq!(packed.dropped_ids, vec![Uuid::from_u128(1)]);
        let empty = pack(&cands, "seats", 0, &Allocation::default(), &Words);
        assert!(empty.items.is_empty());
    }

    #[test]
    fn working_memory_comes_first_in_time_order() {
        let cands = vec![
            cand(3, Tier::Working, "third turn", 0.1),
            cand(1, Tier::Working, "first turn", 0.2),
            cand(9, Tier::Semantic, "a fact", 0.99),
            cand(8, Tier::Episodic, "an episode", 0.5),
        ];
        let packed = pack(&cands, "", 1000, &Allocation::default(), &Words);
        assert_eq!(
            packed.rendered,
            "[working] first turn\n[working] third turn\n[semantic] a fact\n[episodic] an episode\n"
        );
    }

    #[test]
    fn a_real_bpe_never_exceeds_the_budget() {
        let tok = crate::domain::tokens::Bpe::new(crate::domain::tokens::Encoding::Cl100kBase);
        let cands: Vec<Candidate> = (0..40)
            .map(|i| {
                cand(
                    i,
                    Tier::ALL[(i % 4) as usize],
                    &format!("Memory {i}: the user asked about flight {i} to Lisbon. It was delayed by {i} minutes."),
                    1.0 - i as f64 / 100.0,
                )
            })
            .collect();
        for budget in [0, 5, 17, 64, 100, 333, 1000, 5000] {
            let packed = pack(&cands, "flight delayed", budget, &Allocation::default(), &tok);
            assert!(packed.tokens_used <= budget, "budget {budget}: used {}", packed.tokens_used);
            assert_eq!(packed.tokens_used, tok.count(&packed.rendered));
            assert_eq!(packed.items.len() + packed.dropped_ids.len(), 40);
        }
    }

    /// The BPE tokenizer without its cheap lower bound.
    struct CountEverything(crate::domain::tokens::Bpe);

    impl Tokenizer for CountEverything {
        fn count(&self, text: &str) -> usize {
            self.0.count(text)
        }
        fn truncate(&self, text: &str, max_tokens: usize) -> String {
            self.0.truncate(text, max_tokens)
        }
    }

    #[test]
    fn skipping_candidates_that_cannot_fit_packs_the_same() {
        let tok = crate::domain::tokens::Bpe::new(crate::domain::tokens::Encoding::Cl100kBase);
        let cands: Vec<Candidate> = (0..120)
            .map(|i| {
                let content = match i % 3 {
                    0 => format!("Memory {i}: a short note on flight {i}."),
                    1 => format!(
                        "Memory {i}: the user asked about flight {i} to Lisbon. It was delayed. {}",
                        "Then more. ".repeat(i as usize % 7)
                    ),
                    _ => format!(
                        "Memory {i}, long: {}",
                        "the crew waited at the gate for the late bags, ".repeat(1 + i as usize % 5)
                    ),
                };
                cand(i, Tier::ALL[(i % 4) as usize], &content, 1.0 - i as f64 / 1000.0)
            })
            .collect();
        for budget in [0, 5, 17, 64, 100, 333, 1000, 5000] {
            let fast = pack(&cands, "flight delayed", budget, &Allocation::default(), &tok);
            let slow = pack(&cands, "flight delayed", budget, &Allocation::default(), &CountEverything(tok));
            assert_eq!(fast, slow, "budget {budget}");
        }
    }
}
