//! The in-process full-text index of the SQLite backend: an inverted index
//! per tenant's agent, ranked with bm25, rebuilt from the `memories` table
//! at open and kept in step by the writers after each commit, as the vector
//! index is (`vectors.rs`).
//!
//! Why not SQLite's FTS5: its bm25 recounts every query word's rows for the
//! idf in each statement that asks for a rank (about 2.5 ms at 100K
//! memories), finding a tier's matches is a statement of its own, and a
//! search needs ranks for three sets of rows (the text leg's, the vector
//! leg's, the neighbours'). Here the counts are kept as the index changes,
//! so ranking every match of a long query costs about a millisecond and the
//! rank of any other row a few microseconds.
//!
//! Words are what Postgres's `to_tsvector('english', ...)` makes of the text
//! (`domain::words`). The stop words still count towards a text's length, as
//! every token does in bm25's length normalisation.
//!
//! bm25 is Robertson's, as FTS5 computes it: k1 = 1.2, b = 0.75, idf =
//! ln((N - n + 0.5) / (n + 0.5)) floored at 1e-6, where N, n and the average
//! length are the agent's (its memories of every tier), so one tenant's
//! rows never move another's ranks.
//!
//! Each entry carries the same filter fields as the vector index's. The SQL
//! that fetches the best rows applies every filter again: the index may be
//! stale in the permissive direction, never the strict one.
//!
//! Must not: decide what is visible on its own, or read the database after `load`.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use sqlx::SqlitePool;
use uuid::Uuid;

use super::vectors::{Entry, ScanFilter};
use crate::domain::words::{STEMMER, body_of, tokens};
pub use crate::domain::words::{body, query_terms};
use crate::domain::{Memory, Tier};

/// bm25's term-frequency saturation and length normalisation (FTS5's values).
const K1: f64 = 1.2;
const B: f64 = 0.75;

/// Which rows one search ranks together: one tenant's agent.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct GroupKey {
    tenant: String,
    agent: String,
}

/// A document; its length and tier are in `Group::lens` and `Group::tiers`.
struct Doc {
    entry: Entry,
    /// (term, occurrences) of its search words, sorted by term.
    terms: Box<[(u32, u32)]>,
    /// Hash of the text, so a rewrite with the same text only refreshes.
    text_hash: u64,
}

/// `Group::lens` of a removed document.
const GONE: u32 = u32::MAX;

#[derive(Default)]
struct Group {
    /// Stem -> term.
    words: HashMap<Box<str>, u32>,
    /// Word as written (lowercased) -> term: most words recur, and stemming
    /// is most of the cost of indexing a text.
    surface: HashMap<Box<str>, u32>,
    /// Per term: (slot, occurrences), slots ascending.
    postings: Vec<Vec<(u32, u32)>>,
    /// Per term: live documents holding it.
    df: Vec<u32>,
    /// By slot; removed documents stay as holes until `compact`.
    docs: Vec<Doc>,
    /// By slot, dense for the ranking loop: each document's length in
    /// tokens, stop words included (bm25's document length; `GONE` once
    /// removed), and its tier.
    lens: Vec<u32>,
    tiers: Vec<Tier>,
    slots: HashMap<Uuid, u32>,
    live: u32,
    total_len: u64,
}

impl Group {
    fn add(&mut self, entry: Entry, text: &str) {
        let slot = self.docs.len() as u32;
        let mut len = 0u32;
        let mut counts: HashMap<u32, u32> = HashMap::new();
        tokens(text, |word, stop| {
            len += 1;
            if stop {
                return;
            }
            let term = match self.surface.get(word) {
                Some(&t) => t,
                None => {
                    let stem = STEMMER.stem(word);
                    let t = match self.words.get(stem.as_ref()) {
                        Some(&t) => t,
                        None => {
                            let t = self.postings.len() as u32;
                            self.words.insert(stem.into(), t);
                            self.postings.push(Vec::new());
                            self.df.push(0);
                            t
                        }
                    };
                    self.surface.insert(word.into(), t);
                    t
                }
            };
            *counts.entry(term).or_default() += 1;
        });
        let mut terms: Vec<(u32, u32)> = counts.into_iter().collect();
        terms.sort_unstable();
        for &(term, count) in &terms {
            self.postings[term as usize].push((slot, count));
            self.df[term as usize] += 1;
        }
        self.slots.insert(entry.id, slot);
        self.live += 1;
        self.total_len += u64::from(len);
        self.lens.push(len);
        self.tiers.push(entry.tier);
        self.docs.push(Doc { entry, terms: terms.into(), text_hash: hash(text) });
    }

    fn remove(&mut self, id: Uuid) {
        let Some(slot) = self.slots.remove(&id) else { return };
        let len = std::mem::replace(&mut self.lens[slot as usize], GONE);
        for &(term, _) in self.docs[slot as usize].terms.iter() {
            self.df[term as usize] -= 1;
        }
        self.live -= 1;
        self.total_len -= u64::from(len);
        let holes = self.docs.len() - self.live as usize;
        if holes > 1_024 && holes > self.docs.len() / 4 {
            self.compact();
        }
    }

    /// Drops the holes: slots are renumbered in their order, so postings stay sorted.
    fn compact(&mut self) {
        let mut new_slot = vec![u32::MAX; self.docs.len()];
        let mut next = 0u32;
        for (old, len) in self.lens.iter().enumerate() {
            if *len != GONE {
                new_slot[old] = next;
                next += 1;
            }
        }
        let mut old = 0;
        self.docs.retain(|_| {
            old += 1;
            new_slot[old - 1] != u32::MAX
        });
        self.lens.retain(|len| *len != GONE);
        self.tiers = self.docs.iter().map(|d| d.entry.tier).collect();
        for list in &mut self.postings {
            list.retain_mut(|(slot, _)| {
                *slot = new_slot[*slot as usize];
                *slot != u32::MAX
            });
        }
        for slot in self.slots.values_mut() {
            *slot = new_slot[*slot as usize];
        }
    }

    /// The query's terms in this group, with their idf; unknown words and
    /// words no live row holds are left out.
    fn weighted(&self, terms: &[String]) -> Vec<(u32, f64)> {
        let n = f64::from(self.live);
        terms
            .iter()
            .filter_map(|t| self.words.get(t.as_str()))
            .filter(|&&t| self.df[t as usize] > 0)
            .map(|&t| {
                let df = f64::from(self.df[t as usize]);
                (t, ((n - df + 0.5) / (df + 0.5)).ln().max(1e-6))
            })
            .collect()
    }

    fn average_len(&self) -> f64 {
        if self.live == 0 { 1.0 } else { self.total_len as f64 / f64::from(self.live) }
    }
}

/// bm25's length normalisation for one group's average length, the
/// constants taken out of the ranking loop.
#[derive(Clone, Copy)]
struct Bm25 {
    base: f64,
    per_token: f64,
}

impl Bm25 {
    fn new(average_len: f64) -> Bm25 {
        Bm25 { base: K1 * (1.0 - B), per_token: K1 * B / average_len }
    }

    /// One term's share of a document's bm25.
    #[inline]
    fn score(self, idf: f64, occurrences: u32, len: u32) -> f64 {
        let tf = f64::from(occurrences);
        idf * tf * (K1 + 1.0) / (tf + self.base + self.per_token * f64::from(len))
    }
}

fn hash(text: &str) -> u64 {
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// A match: its id, tier and bm25 (larger is better).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ranked {
    pub id: Uuid,
    pub tier: Tier,
    pub rank: f64,
}

#[derive(Default)]
pub struct TextIndex {
    groups: HashMap<GroupKey, Group>,
    /// (tenant, id) -> its agent, to find an entry again on update or delete.
    locations: HashMap<(String, Uuid), String>,
}

impl TextIndex {
    /// Reads every stored memory's text, in chunks of rows handed over as
    /// one JSON row each (row by row, the driver's hand-over between
    /// threads would cost more than the indexing).
    pub async fn load(pool: &SqlitePool) -> Result<TextIndex, sqlx::Error> {
        type LoadRow = (
            i64,
            String,
            String,
            Uuid,
            String,
            Option<String>,
            i64,
            Option<i64>,
            i64,
            u8,
            u8,
            String,
            Option<String>,
            Option<String>,
        );
        // Smaller in tests, so that their stores span several chunks.
        const CHUNK: i64 = if cfg!(test) { 1_000 } else { 5_000 };
        let mut index = TextIndex::default();
        let mut after = i64::MIN;
        loop {
            let chunk: String = sqlx::query_scalar(
                "with r as (select seq, tenant_id, agent_id, hex(id) as id, tier, user_id, occurred_at, expires_at, \
                 created_at, valid_until is null as valid, contested_by is not null as candidate, content, skill_name, \
                 trigger_pattern from memories where seq > ? \
                 order by seq limit ?) \
                 select json_group_array(json_array(seq, tenant_id, agent_id, id, tier, user_id, occurred_at, \
                 expires_at, created_at, valid, candidate, content, skill_name, trigger_pattern) order by seq) from r",
            )
            .bind(after)
            .bind(CHUNK)
            .fetch_one(pool)
            .await?;
            let rows: Vec<LoadRow> = serde_json::from_str(&chunk).map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
            let Some(last) = rows.last() else { break };
            after = last.0;
            for (
                _,
                tenant,
                agent,
                id,
                tier,
                user_id,
                occurred_at,
                expires_at,
                created_at,
                valid,
                candidate,
                content,
                name,
                trigger,
            ) in rows
            {
                let Some(tier) = Tier::parse(&tier) else { continue };
                let entry = Entry {
                    id,
                    tier,
                    valid: valid != 0,
                    candidate: candidate != 0,
                    user_id: user_id.map(Into::into),
                    occurred_at,
                    expires_at,
                    created_at,
                };
                let text = body_of(tier, &content, name.as_deref(), trigger.as_deref());
                index.insert(&tenant, &agent, entry, &text);
            }
        }
        Ok(index)
    }

    /// How many memories the index holds.
    pub fn len(&self) -> usize {
        self.locations.len()
    }

    /// Whether the index holds this memory.
    pub fn contains(&self, tenant: &str, id: Uuid) -> bool {
        self.locations.contains_key(&(tenant.to_string(), id))
    }

    pub fn is_empty(&self) -> bool {
        self.locations.is_empty()
    }

    /// Adds the memory, or brings its entry up to date. Its text is indexed
    /// again only when it changed.
    pub fn put(&mut self, tenant: &str, m: &Memory) {
        let text = body(m);
        let key = GroupKey { tenant: tenant.into(), agent: m.agent_id.clone() };
        if let Some(group) = self.groups.get_mut(&key)
            && let Some(&slot) = group.slots.get(&m.id)
            && group.docs[slot as usize].text_hash == hash(&text)
        {
            group.docs[slot as usize].entry = Entry::of(m);
            return;
        }
        self.remove(tenant, m.id);
        self.insert(tenant, &m.agent_id, Entry::of(m), &text);
    }

    fn insert(&mut self, tenant: &str, agent: &str, entry: Entry, text: &str) {
        let key = GroupKey { tenant: tenant.into(), agent: agent.into() };
        self.locations.insert((tenant.to_string(), entry.id), agent.to_string());
        self.groups.entry(key).or_default().add(entry, text);
    }

    fn doc_mut(&mut self, tenant: &str, id: Uuid) -> Option<&mut Doc> {
        let agent = self.locations.get(&(tenant.to_string(), id))?;
        let group = self.groups.get_mut(&GroupKey { tenant: tenant.into(), agent: agent.clone() })?;
        let slot = *group.slots.get(&id)?;
        Some(&mut group.docs[slot as usize])
    }

    /// Updates the filter fields of an entry whose text did not change.
    pub fn refresh(&mut self, tenant: &str, entry: Entry) {
        if let Some(doc) = self.doc_mut(tenant, entry.id) {
            doc.entry = entry;
        }
    }

    /// Marks a fact superseded.
    pub fn retire(&mut self, tenant: &str, id: Uuid) {
        if let Some(doc) = self.doc_mut(tenant, id) {
            doc.entry.valid = false;
        }
    }

    /// Forgets the memory.
    pub fn remove(&mut self, tenant: &str, id: Uuid) {
        let Some(agent) = self.locations.remove(&(tenant.to_string(), id)) else { return };
        let key = GroupKey { tenant: tenant.into(), agent };
        let Some(group) = self.groups.get_mut(&key) else { return };
        group.remove(id);
        if group.live == 0 {
            self.groups.remove(&key);
        }
    }

    /// The `want` best-ranked admitted matches of each tier, tier by tier in
    /// the filter's order, best first (ties: the older row first).
    pub fn best(
        &self,
        tenant: &str,
        agent: &str,
        terms: &[String],
        filter: &ScanFilter<'_>,
        want: usize,
    ) -> Vec<Ranked> {
        let key = GroupKey { tenant: tenant.into(), agent: agent.into() };
        let Some(group) = self.groups.get(&key) else { return Vec::new() };
        let weighted = group.weighted(terms);
        if weighted.is_empty() || want == 0 {
            return Vec::new();
        }
        // The loop reads only the dense `lens` (a document is 4 bytes there).
        let bm25 = Bm25::new(group.average_len());
        let mut scores = vec![0f64; group.lens.len()];
        let mut matched: Vec<u32> = Vec::new();
        for (term, idf) in weighted {
            for &(slot, occurrences) in &group.postings[term as usize] {
                let len = group.lens[slot as usize];
                if len == GONE {
                    continue;
                }
                let score = &mut scores[slot as usize];
                if *score == 0.0 {
                    matched.push(slot);
                }
                *score += bm25.score(idf, occurrences, len);
            }
        }
        let mut by_tier: Vec<Vec<(f64, u32)>> = vec![Vec::new(); filter.tiers.len()];
        for slot in matched {
            if let Some(t) = filter.tiers.iter().position(|t| *t == group.tiers[slot as usize]) {
                by_tier[t].push((scores[slot as usize], slot));
            }
        }
        let order = |a: &(f64, u32), b: &(f64, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        let mut out = Vec::new();
        for (&tier, mut ranked) in filter.tiers.iter().zip(by_tier) {
            // Only the best need the filters' check: sort a margin beyond
            // `want`, and all of them only when the filters reject that many.
            let mut sorted = 0;
            let mut taken = 0;
            let mut at = 0;
            while taken < want && at < ranked.len() {
                if at == sorted {
                    let next = (sorted + (want - taken) * 2 + 16).min(ranked.len());
                    if next < ranked.len() {
                        ranked[sorted..].select_nth_unstable_by(next - sorted - 1, order);
                    }
                    ranked[sorted..next].sort_unstable_by(order);
                    sorted = next;
                }
                let (rank, slot) = ranked[at];
                at += 1;
                let entry = &group.docs[slot as usize].entry;
                if filter.admits(entry) {
                    out.push(Ranked { id: entry.id, tier, rank });
                    taken += 1;
                }
            }
        }
        out
    }

    /// The bm25 of each of the given memories of the agent that the index
    /// holds (0 when it matches no query word).
    pub fn ranks(&self, tenant: &str, agent: &str, terms: &[String], ids: &[Uuid]) -> HashMap<Uuid, f64> {
        let key = GroupKey { tenant: tenant.into(), agent: agent.into() };
        let Some(group) = self.groups.get(&key) else { return HashMap::new() };
        let weighted = group.weighted(terms);
        let bm25 = Bm25::new(group.average_len());
        ids.iter()
            .filter_map(|id| {
                let slot = *group.slots.get(id)? as usize;
                let (doc, len) = (&group.docs[slot], group.lens[slot]);
                let rank = weighted
                    .iter()
                    .filter_map(|&(term, idf)| {
                        let at = doc.terms.binary_search_by_key(&term, |(t, _)| *t).ok()?;
                        Some(bm25.score(idf, doc.terms[at].1, len))
                    })
                    .sum();
                Some((*id, rank))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn entry(id: u128, tier: Tier) -> Entry {
        Entry {
            id: Uuid::from_u128(id),
            tier,
            valid: true,
            candidate: false,
            user_id: None,
            occurred_at: 0,
            expires_at: None,
            created_at: 0,
        }
    }

    fn index_of(texts: &[(u128, &str)]) -> TextIndex {
        let mut index = TextIndex::default();
        for (id, text) in texts {
            index.insert("t", "a", entry(*id, Tier::Episodic), text);
        }
        index
    }

    fn best(index: &TextIndex, query: &str) -> Vec<(u128, f64)> {
        let tiers = [Tier::Episodic];
        let none = HashSet::new();
        index
            .best("t", "a", &query_terms(query), &ScanFilter::all(&tiers, &none), 100)
            .iter()
            .map(|r| (r.id.as_u128(), r.rank))
            .collect()
    }

    #[test]
    fn query_terms_are_stemmed_folded_and_free_of_stop_words() {
        assert_eq!(query_terms("What is the capital of France?"), ["capit", "franc"]);
        assert_eq!(query_terms("the of and"), Vec::<String>::new());
        assert_eq!(query_terms(""), Vec::<String>::new());
        assert_eq!(query_terms("NEAR(a b) OR \"x* -y ^z"), ["near", "b", "x", "y", "z"]);
        assert_eq!(query_terms("Don't repeat, repeats REPEATING"), ["repeat"]);
        assert_eq!(query_terms("Café crème"), ["cafe", "creme"]);
    }

    #[test]
    fn ranks_are_bm25_over_the_agents_rows() {
        // Five rows of 2, 5, 3, 2 and 2 tokens; "kiwi" in two of them.
        let index = index_of(&[
            (1, "kiwi kiwis"),
            (2, "a kiwi and a plum"),
            (3, "plum plum tart"),
            (4, "a pear"),
            (5, "the fig"),
        ]);
        let (n, avg) = (5.0f64, 14.0f64 / 5.0);
        let idf = |df: f64| ((n - df + 0.5) / (df + 0.5)).ln().max(1e-6);
        let share = |idf: f64, tf: f64, len: f64| idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * len / avg));
        let got = best(&index, "kiwi");
        assert_eq!(got.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [1, 2]);
        assert!((got[0].1 - share(idf(2.0), 2.0, 2.0)).abs() < 1e-12);
        assert!((got[1].1 - share(idf(2.0), 1.0, 5.0)).abs() < 1e-12, "stop words count in the length");
        let got = best(&index, "tart plums");
        assert_eq!(got.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [3, 2]);
        let want = share(idf(1.0), 1.0, 3.0) + share(idf(2.0), 2.0, 3.0);
        assert!((got[0].1 - want).abs() < 1e-12);
        // A word in every row but one still counts, a little (idf floor).
        let common = index_of(&[(1, "kiwi"), (2, "kiwi"), (3, "fig")]);
        assert_eq!(best(&common, "kiwi")[0].1, 1e-6 * 2.2 / (1.0 + 1.2));
        // The rank of any row is the same number `best` gives it, 0 without a match.
        let ranks = index.ranks("t", "a", &query_terms("tart plums"), &[Uuid::from_u128(3), Uuid::from_u128(1)]);
        assert_eq!(ranks[&Uuid::from_u128(3)], got[0].1);
        assert_eq!(ranks[&Uuid::from_u128(1)], 0.0);
    }

    #[test]
    fn removed_rows_leave_the_ranks_of_an_index_built_without_them() {
        let texts: Vec<(u128, String)> =
            (0..3_000u128).map(|i| (i, format!("note {i} about kiwi {} and plum {}", i % 7, i % 11))).collect();
        let mut index = TextIndex::default();
        for (id, text) in &texts {
            index.insert("t", "a", entry(*id, Tier::Episodic), text);
        }
        // Enough removals to compact the group on the way.
        for id in (0..3_000u128).filter(|i| i % 3 != 0) {
            index.remove("t", Uuid::from_u128(id));
        }
        index.refresh("t", entry(3, Tier::Episodic));
        let kept: Vec<(u128, &str)> = texts.iter().filter(|(i, _)| i % 3 == 0).map(|(i, t)| (*i, t.as_str())).collect();
        let fresh = index_of(&kept);
        for query in ["kiwi 5", "plum 10 note", "about"] {
            assert_eq!(best(&index, query), best(&fresh, query), "{query}");
        }
        assert_eq!(index.len(), 1_000);
    }

    #[test]
    fn groups_never_mix_tenants_or_agents_and_filters_apply() {
        let mut index = TextIndex::default();
        index.insert("t", "a", entry(1, Tier::Semantic), "kiwi");
        index.insert("u", "a", entry(2, Tier::Semantic), "kiwi");
        index.insert("t", "b", entry(3, Tier::Semantic), "kiwi");
        index.insert("t", "a", entry(4, Tier::Episodic), "kiwi");
        let tiers = [Tier::Semantic];
        let none = HashSet::new();
        let terms = query_terms("kiwi");
        let ids = |r: Vec<Ranked>| r.iter().map(|r| r.id.as_u128()).collect::<Vec<_>>();
        assert_eq!(ids(index.best("t", "a", &terms, &ScanFilter::all(&tiers, &none), 10)), [1]);
        index.retire("t", Uuid::from_u128(1));
        assert!(index.best("t", "a", &terms, &ScanFilter::all(&tiers, &none), 10).is_empty(), "a superseded fact");
        assert!(index.ranks("t", "a", &terms, &[Uuid::from_u128(2)]).is_empty(), "another tenant's row");
    }
}
