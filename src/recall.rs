//! Recall: multi-tier search with priority scoring, and token-budgeted
//! context assembly on top of it.
//!
//! A search runs concurrently the embedding of the query, the store's vector
//! and full-text legs over the persistent tiers (the embedded backend ranks
//! full-text matches while the query is being embedded; the vector leg waits
//! for the vector) and a read of the session's working memory. Each
//! candidate gets the five score components (`domain::scoring`); candidates are deduplicated across tiers (same
//! normalised text, then cosine ≥ `search.dedup_cosine`; the better scored
//! stays; a consolidation summary gives way to an episode it covers) and the
//! best `top_k` returned. Access counts are updated off the
//! response path, in batches.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Instant;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::domain::consolidate;
use crate::domain::content::normalize_into;
use crate::domain::context::{self, Allocation, Candidate, PackedItem, Tokenizer};
use crate::domain::scoring::{self, Components, Weights};
use crate::domain::speaker::{QueryNames, speaker};
use crate::domain::tokens::{Bpe, Encoding};
use crate::domain::validate::FieldError;
use crate::domain::when::QueryDates;
use crate::domain::words::{QueryTerms, TermWeights, body};
use crate::domain::{Memory, Tier};
use crate::service::{MemoryService, ServiceError, ServiceResult};
use crate::store::{Embedding, Hit, SearchQuery};

/// A validated search.
#[derive(Debug, Clone)]
pub struct SearchParams {
    pub agent_id: String,
    pub user_id: Option<String>,
    pub session_id: Option<String>,
    pub query: String,
    pub top_k: usize,
    /// Empty means all four.
    pub tiers: Vec<Tier>,
    pub weights: Option<Weights>,
    pub metadata: Vec<(String, Value)>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    pub min_relevance: Option<f64>,
    /// What the agent knew at this time (`store::SearchQuery::as_of`).
    pub as_of: Option<DateTime<Utc>>,
    /// Facts that held at this time (`store::SearchQuery::valid_at`).
    pub valid_at: Option<DateTime<Utc>>,
    /// Also recall candidates (facts that lost their slot, `contested_by` set).
    pub include_candidates: bool,
}

/// A recalled memory with its score (the API answers with
/// `http::response::ScoredMemoryResponse`).
#[derive(Debug, Clone)]
pub struct ScoredMemory {
    pub memory: Memory,
    pub score: f64,
    pub components: Components,
}

/// Where a search spent its time, in milliseconds. The embedding, the two
/// legs and the working-memory read run concurrently, so the parts can add
/// up to more than `total_ms`; a leg's time leaves out any wait for the
/// query vector.
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct Timings {
    pub embedding_ms: f64,
    pub vector_ms: f64,
    pub text_ms: f64,
    /// Reading the episodes next to the best episodic candidates.
    pub neighbours_ms: f64,
    pub working_ms: f64,
    /// Weighing the candidates' words, fusing, scoring and deduplicating.
    pub scoring_ms: f64,
    pub total_ms: f64,
}

pub struct SearchOutcome {
    pub results: Vec<ScoredMemory>,
    pub timings: Timings,
    /// What the results left out (`WORKING_MEMORY_UNAVAILABLE`).
    pub warnings: Vec<String>,
}

/// The warning of a recall that could not read the session's working
/// memory (Redis down, or its circuit breaker open) and went on without it.
pub const WORKING_MEMORY_UNAVAILABLE: &str = "working_memory_unavailable";

/// A validated context request.
#[derive(Debug, Clone)]
pub struct ContextParams {
    pub search: SearchParams,
    pub max_context_tokens: i64,
    pub system_prompt: Option<String>,
    pub system_prompt_tokens: Option<i64>,
    pub output_reserve_tokens: i64,
    pub allocation: Allocation,
    pub encoding: Encoding,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ContextUsage {
    /// The budget: max_context_tokens − system prompt − query − output reserve.
    pub tokens_available: usize,
    /// Tokens of the rendered context block; never above tokens_available.
    pub tokens_used: usize,
    /// Tokens per tier.
    pub per_tier: BTreeMap<Tier, usize>,
    /// Candidates left out.
    pub dropped: usize,
    /// Memories shortened to fit.
    pub shortened: usize,
    pub dropped_ids: Vec<Uuid>,
}

pub struct ContextOutcome {
    pub context: String,
    pub sections: BTreeMap<Tier, Vec<PackedItem>>,
    pub usage: ContextUsage,
    pub timings: Timings,
    pub warnings: Vec<String>,
}

/// Accesses of one search: the tenant and the (tier, id) of each memory returned.
pub type AccessBatch = (String, Vec<(Tier, Uuid)>);

/// Batches access counts to the store, off the request path.
#[derive(Clone)]
pub struct AccessRecorder {
    tx: mpsc::Sender<AccessBatch>,
}

impl AccessRecorder {
    pub fn new(capacity: usize) -> (AccessRecorder, mpsc::Receiver<AccessBatch>) {
        let (tx, rx) = mpsc::channel(capacity);
        (AccessRecorder { tx }, rx)
    }

    /// Never waits: when the queue is full, these accesses go uncounted.
    pub fn record(&self, tenant: &str, hits: Vec<(Tier, Uuid)>) {
        if !hits.is_empty() && self.tx.try_send((tenant.to_string(), hits)).is_err() {
            metrics::counter!("engram_access_updates_dropped_total").increment(1);
        }
    }
}

/// The query's words of three letters or more, lower case: working memory,
/// which has no stored vector, is scored by the share of them a text holds.
pub struct QueryWords(Vec<String>);

impl QueryWords {
    pub fn new(query: &str) -> QueryWords {
        let mut words: Vec<String> = long_words(query).map(str::to_lowercase).collect();
        words.sort_unstable();
        words.dedup();
        QueryWords(words)
    }

    /// Share of the query's words found in `text`. A session's every entry
    /// is matched on every search: the few query words are compared by
    /// length and bytes, with no hashing and no copy of an ASCII word.
    pub fn overlap(&self, text: &str) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        let mut found = vec![false; self.0.len()];
        let mut count = 0;
        for w in text.split(|c: char| !c.is_alphanumeric()) {
            let hit = if w.is_ascii() {
                if w.len() < 3 {
                    continue;
                }
                self.0.iter().position(|q| q.len() == w.len() && q.as_bytes().eq_ignore_ascii_case(w.as_bytes()))
            } else {
                if w.chars().count() < 3 {
                    continue;
                }
                let lower = w.to_lowercase();
                self.0.iter().position(|q| *q == lower)
            };
            if let Some(i) = hit
                && !found[i]
            {
                found[i] = true;
                count += 1;
                if count == found.len() {
                    break;
                }
            }
        }
        count as f64 / self.0.len() as f64
    }
}

fn long_words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !c.is_alphanumeric()).filter(|w| w.chars().count() >= 3)
}

/// Cosine of two stored (unit-length) vectors.
fn cosine(a: &[f32], b: &[f32]) -> f64 {
    f64::from(crate::embed::dot(a, b))
}

struct Scored {
    memory: Memory,
    components: Components,
    score: f64,
    vector: Option<Vec<f32>>,
    /// Relevance to the query of the memory alone, before neighbours and
    /// normalisation.
    own: f64,
}

/// What the text leg weighs a search's candidates by: the query's terms,
/// each candidate's matches, and the terms' weights among the candidates.
struct TextWeights {
    terms: QueryTerms,
    matches: HashMap<Uuid, u64>,
    weights: TermWeights,
}

impl TextWeights {
    fn new(query: &str, hits: &[Hit]) -> TextWeights {
        let mut terms = QueryTerms::new(query);
        let matches: HashMap<Uuid, u64> = hits.iter().map(|h| (h.memory.id, terms.matches(&body(&h.memory)))).collect();
        let weights = TermWeights::new(terms.len(), matches.values().copied());
        TextWeights { terms, matches, weights }
    }

    /// Adds candidates found later (neighbours) without changing the weights.
    fn add(&mut self, hit: &Hit) {
        let m = self.terms.matches(&body(&hit.memory));
        self.matches.insert(hit.memory.id, m);
    }

    fn coverage(&self, id: Uuid) -> f64 {
        self.weights.coverage(self.matches.get(&id).copied().unwrap_or(0))
    }
}

/// Spreads the candidates' relevance over [0, 1]: the best candidate's is
/// 1, the median candidate's and below 0, linear between. Dividing by the
/// best alone kept the spread of the raw values, which is narrow when every
/// candidate shares the query's topic (a name in every memory, cosines of
/// 0.72 and 0.76), so importance or recency decided instead of relevance.
/// A search's candidates are its best matches and their neighbours, so the
/// median marks "plausible" for this query; a single candidate, or all
/// equal, keep relevance relative to the best.
fn stretch(relevance: &mut [f64]) {
    let best = relevance.iter().copied().fold(0.0, f64::max);
    if best <= 0.0 {
        return;
    }
    // A context scores hundreds of candidates: select the median, no sort.
    let mut scratch = relevance.to_vec();
    let middle = (scratch.len() - 1) / 2;
    let (_, &mut median, _) = scratch.select_nth_unstable_by(middle, f64::total_cmp);
    if best > median {
        relevance.iter_mut().for_each(|r| *r = ((*r - median) / (best - median)).max(0.0));
    } else {
        relevance.iter_mut().for_each(|r| *r /= best);
    }
}

/// The median of `values` (0 when there are none).
fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    if v.is_empty() {
        return 0.0;
    }
    let middle = (v.len() - 1) / 2;
    *v.select_nth_unstable_by(middle, f64::total_cmp).1
}

/// Most candidates whose neighbours are looked up.
const MAX_ANCHORS: usize = 20;

impl MemoryService {
    fn weights_for(&self, params: &SearchParams) -> Weights {
        params.weights.or_else(|| self.agent_weights.get(&params.agent_id).copied()).unwrap_or_default()
    }

    /// A candidate's relevance from the two legs: its cosine to the query,
    /// and the share of the query's term weight its text holds
    /// (`TextWeights`). Both mean the same whatever the other candidates
    /// are, so a relevance compares across queries; the stores' own text
    /// ranks only choose the text leg's candidates.
    fn fused(&self, h: &Hit, text: &TextWeights, vector_leg: bool, text_leg: bool) -> f64 {
        let text_leg = text_leg && !text.terms.is_empty();
        scoring::fuse(h.similarity, Some(text.coverage(h.memory.id)), vector_leg, text_leg, self.vector_share)
    }

    /// The episodic candidates whose neighbours are worth reading: the most
    /// relevant, at most `keep` and `MAX_ANCHORS`; none when neighbours count
    /// for nothing.
    fn anchors(&self, hits: &[Hit], text: &TextWeights, vector_leg: bool, text_leg: bool, keep: usize) -> Vec<Uuid> {
        if self.neighbour_share == 0.0 {
            return Vec::new();
        }
        let mut episodes: Vec<(f64, Uuid)> = hits
            .iter()
            .filter(|h| h.memory.tier == Tier::Episodic)
            .map(|h| (self.fused(h, text, vector_leg, text_leg), h.memory.id))
            .collect();
        episodes.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        episodes.into_iter().take(keep.min(MAX_ANCHORS)).map(|(_, id)| id).collect()
    }

    /// The best candidates, scored, best first, deduplicated: at most `keep`
    /// of the persistent tiers and `total` in all (see `dedup`).
    async fn recall(
        &self,
        tenant: &str,
        p: &SearchParams,
        per_leg: usize,
        keep: usize,
        total: usize,
    ) -> ServiceResult<(Vec<Scored>, Timings, Vec<String>)> {
        let started = Instant::now();
        let now = self.clock.now();
        let wants = |t: Tier| p.tiers.is_empty() || p.tiers.contains(&t);
        let mut timings = Timings::default();
        let mut warnings = Vec::new();

        let mut query = SearchQuery {
            agent_id: p.agent_id.clone(),
            user_id: p.user_id.clone(),
            tiers: [Tier::Episodic, Tier::Semantic, Tier::Procedural].into_iter().filter(|t| wants(*t)).collect(),
            text: p.query.clone(),
            vector: None,
            metadata: p.metadata.clone(),
            since: p.since,
            until: p.until,
            per_leg,
            include_candidates: p.include_candidates,
            as_of: p.as_of,
            valid_at: p.valid_at,
        };
        // The store starts with what needs no vector while the query is
        // being embedded, and gets the vector when it is ready.
        let (ready, pending) = oneshot::channel();
        let embedding = async {
            let t = Instant::now();
            let vector = match &self.embedder {
                Some(e) => e
                    .embed_in(std::slice::from_ref(&p.query), crate::embed::Lane::Query)
                    .await
                    .map(|mut v| v.pop().map(|vector| Embedding { model: e.model_id().to_string(), vector })),
                None => Ok(None),
            };
            // A failed embedding leaves the search without a vector leg; its
            // error is the answer.
            let _ = ready.send(vector.as_ref().ok().cloned().flatten());
            (vector, t.elapsed().as_secs_f64() * 1e3)
        };
        let persistent =
            self.store.search_embedding(tenant, &query, Box::pin(async { pending.await.ok().flatten() }), now);
        let working = async {
            let t = Instant::now();
            let entries = match (&p.session_id, wants(Tier::Working)) {
                (Some(session), true) => Some(self.working.session(tenant, &p.agent_id, session).await),
                _ => None,
            };
            (entries, t.elapsed().as_secs_f64() * 1e3)
        };
        let ((vector, embedding_ms), persistent, (working, working_ms)) = tokio::join!(embedding, persistent, working);
        timings.embedding_ms = embedding_ms;
        query.vector = vector?;
        let legs = persistent?;
        timings.vector_ms = legs.vector_ms;
        timings.text_ms = legs.text_ms;
        timings.working_ms = working_ms;
        let working = match working {
            Some(Ok(entries)) => entries.into_iter().filter(|m| !self.erasing.hides(tenant, m)).collect(),
            Some(Err(e)) if p.tiers == [Tier::Working] => return Err(e.into()),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "searching without working memory: Redis unavailable");
                warnings.push(WORKING_MEMORY_UNAVAILABLE.to_string());
                Vec::new()
            }
            None => Vec::new(),
        };

        // Episodes next to the best episodic candidates: a turn that answers
        // a question often shares no word with it ("Adoption agencies.")
        // while the turn before it does ("What did you research?").
        let mut hits = legs.hits;
        // Weighing the candidates' words is part of the scoring's time.
        let weighing = Instant::now();
        let mut text = TextWeights::new(&p.query, &hits);
        let weighing = weighing.elapsed();
        let mut next_to: HashMap<Uuid, Vec<Uuid>> = HashMap::new();
        let anchors = self.anchors(&hits, &text, legs.vector_leg, legs.text_leg, keep);
        if !anchors.is_empty() {
            let t = Instant::now();
            let mut known: HashSet<Uuid> = hits.iter().map(|h| h.memory.id).collect();
            let adjacent = self.store.neighbours(tenant, &query, &anchors, &known, now).await?;
            timings.neighbours_ms = t.elapsed().as_secs_f64() * 1e3;
            for a in adjacent {
                if let Some(hit) = a.hit
                    && known.insert(a.id)
                {
                    text.add(&hit);
                    hits.push(hit);
                }
                if known.contains(&a.id) {
                    next_to.entry(a.anchor).or_default().push(a.id);
                    next_to.entry(a.id).or_default().push(a.anchor);
                }
            }
        }

        let t = Instant::now();
        let weights = self.weights_for(p);
        // Each candidate's own relevance (what `min_relevance` is compared
        // with), then plus the share of its better neighbour's above the
        // median.
        let own: HashMap<Uuid, f64> =
            hits.iter().map(|h| (h.memory.id, self.fused(h, &text, legs.vector_leg, legs.text_leg))).collect();
        // And plus the speaker's share when the query names who said it.
        let names = (self.speaker_share > 0.0).then(|| QueryNames::new(&p.query));
        // And plus the date's share when it happened on a date the query names.
        let dates = (self.date_share > 0.0).then(|| QueryDates::new(&p.query)).flatten();
        // A neighbour lends what sets it above the median candidate, not
        // what every candidate has: in a small store of facts on one topic
        // (all alike to the query), two facts written one after the other
        // would otherwise lift each other past the one that answers.
        let floor = median(own.values().copied());
        let mut relevance: Vec<f64> = hits
            .iter()
            .map(|h| {
                let id = h.memory.id;
                let neighbour =
                    next_to.get(&id).into_iter().flatten().filter_map(|n| own.get(n).copied()).fold(0.0, f64::max);
                let neighbour = (neighbour - floor).max(0.0);
                let named = names.as_ref().is_some_and(|q| speaker(&h.memory).is_some_and(|s| q.names(&s)));
                let dated = dates.as_ref().is_some_and(|d| d.contains(h.memory.occurred_at));
                own[&id]
                    + self.neighbour_share * neighbour
                    + if named { self.speaker_share } else { 0.0 }
                    + if dated { self.date_share } else { 0.0 }
            })
            .collect();
        if self.relative_relevance {
            stretch(&mut relevance);
        }
        let mut scored: Vec<Scored> = Vec::with_capacity(hits.len() + working.len());
        let mut push = |memory: Memory, own: f64, relevance: f64, vector: Option<Vec<f32>>| {
            let components = Components {
                relevance,
                recency: scoring::recency(memory.occurred_at, now),
                importance: memory.importance,
                frequency: scoring::frequency(memory.access_count),
                tier_bonus: scoring::tier_bonus(memory.tier),
            };
            let score = components.score(&weights);
            scored.push(Scored { memory, components, score, vector, own });
        };
        for (h, relevance) in hits.into_iter().zip(relevance) {
            let own = own[&h.memory.id];
            push(h.memory, own, relevance, h.vector);
        }
        let query_words = QueryWords::new(&p.query);
        for m in working {
            let in_window = p.since.is_none_or(|s| m.occurred_at >= s) && p.until.is_none_or(|u| m.occurred_at < u);
            let meta_ok = p.metadata.iter().all(|(k, v)| m.metadata.get(k) == Some(v));
            let user_ok = crate::domain::memory::in_user_scope(p.user_id.as_deref(), m.user_id.as_deref());
            let known = p.as_of.is_none_or(|t| m.created_at <= t);
            if in_window && meta_ok && user_ok && known && !m.is_expired(now) {
                let relevance = query_words.overlap(&m.content);
                push(m, relevance, relevance, None);
            }
        }
        if let Some(min) = p.min_relevance {
            scored.retain(|s| s.own >= min);
        }
        // Ordered through indexes: a `Scored` is large, and a context sorts
        // over a thousand of them.
        let mut order: Vec<usize> = (0..scored.len()).collect();
        order.sort_unstable_by(|&a, &b| {
            let (a, b) = (&scored[a], &scored[b]);
            b.score.total_cmp(&a.score).then(a.memory.id.cmp(&b.memory.id))
        });
        let mut slots: Vec<Option<Scored>> = scored.into_iter().map(Some).collect();
        let scored = self.dedup(order.into_iter().filter_map(|i| slots[i].take()), keep, total);
        timings.scoring_ms = (t.elapsed() + weighing).as_secs_f64() * 1e3;
        timings.total_ms = started.elapsed().as_secs_f64() * 1e3;
        Ok((scored, timings, warnings))
    }

    /// Keeps the first (best scored) of each group of duplicates: the same
    /// normalised text, or vectors at least `dedup_cosine` alike. At most
    /// `keep` memories of the persistent tiers are kept (the comparisons grow
    /// with the square of what is kept); the session's working memory is
    /// always considered. Stops at `total` kept: a search returns only its
    /// best `top_k`, so the rest of a long session is never compared.
    ///
    /// A consolidation summary and an episode it covers are duplicates too,
    /// whichever ranks higher: the episode, the record itself, is kept and
    /// the summary, its gist, goes (it stands for episodes that were not
    /// found, or no longer exist).
    fn dedup(&self, scored: impl Iterator<Item = Scored>, keep: usize, total: usize) -> Vec<Scored> {
        let mut seen_text: HashSet<String> = HashSet::new();
        let mut text = String::new();
        let mut kept: Vec<Scored> = Vec::with_capacity(keep.min(scored.size_hint().1.unwrap_or(0)));
        let mut persistent = 0;
        // Episodes the kept summaries cover, with the summary's id.
        let mut covered: HashMap<Uuid, Uuid> = HashMap::new();
        for s in scored {
            if kept.len() == total {
                break;
            }
            let is_persistent = s.memory.tier != Tier::Working;
            if is_persistent && persistent == keep && !covered.contains_key(&s.memory.id) {
                continue;
            }
            normalize_into(&s.memory.content, &mut text);
            if !seen_text.insert(text.clone()) {
                continue;
            }
            let near = s.vector.as_ref().is_some_and(|v| {
                kept.iter().any(|k| k.vector.as_ref().is_some_and(|kv| cosine(v, kv) >= self.dedup_cosine))
            });
            if near {
                continue;
            }
            let sources = consolidate::summarised(&s.memory);
            if sources.iter().any(|id| kept.iter().any(|k| k.memory.id == *id)) {
                continue;
            }
            if let Some(summary) = covered.get(&s.memory.id).copied() {
                kept.retain(|k| k.memory.id != summary);
                covered.retain(|_, by| *by != summary);
                persistent -= 1;
            }
            covered.extend(sources.into_iter().map(|id| (id, s.memory.id)));
            persistent += usize::from(is_persistent);
            kept.push(s);
        }
        kept
    }

    fn record_access(&self, tenant: &str, memories: &[&Memory]) {
        if let Some(recorder) = &self.access {
            let hits = memories.iter().filter(|m| m.tier != Tier::Working).map(|m| (m.tier, m.id)).collect();
            recorder.record(tenant, hits);
        }
    }

    pub async fn search(&self, tenant: &str, p: &SearchParams) -> ServiceResult<SearchOutcome> {
        let per_leg = (p.top_k * 2).clamp(40, 400);
        let (mut scored, timings, warnings) = self.recall(tenant, p, per_leg, p.top_k, p.top_k).await?;
        scored.truncate(p.top_k);
        self.record_access(tenant, &scored.iter().map(|s| &s.memory).collect::<Vec<_>>());
        let results = scored
            .into_iter()
            .map(|s| ScoredMemory { memory: s.memory, score: s.score, components: s.components })
            .collect();
        Ok(SearchOutcome { results, timings, warnings })
    }

    pub async fn context(&self, tenant: &str, p: &ContextParams) -> ServiceResult<ContextOutcome> {
        let bpe = Bpe::new(p.encoding);
        let system = match (&p.system_prompt, p.system_prompt_tokens) {
            (Some(text), _) => bpe.count(text) as i64,
            (None, Some(n)) => n,
            (None, None) => 0,
        };
        let query_tokens = bpe.count(&p.search.query) as i64;
        // In i128: each term is a client's i64, and their difference can
        // leave i64's range (a huge system prompt against a small budget).
        let budget = i128::from(p.max_context_tokens)
            - i128::from(system)
            - i128::from(query_tokens)
            - i128::from(p.output_reserve_tokens);
        if budget < 0 {
            return Err(ServiceError::Invalid(FieldError::new(
                "/max_context_tokens",
                format!(
                    "max_context_tokens ({}) is smaller than system prompt ({system}) + query ({query_tokens}) + \
                     output_reserve_tokens ({}) tokens",
                    p.max_context_tokens, p.output_reserve_tokens
                ),
            )));
        }
        let budget = usize::try_from(budget).unwrap_or(usize::MAX);
        let (scored, timings, warnings) =
            self.recall(tenant, &p.search, self.context_candidates, self.context_candidates, usize::MAX).await?;
        let candidates: Vec<Candidate> = scored
            .iter()
            .map(|s| Candidate {
                id: s.memory.id,
                tier: s.memory.tier,
                content: std::borrow::Cow::Borrowed(&s.memory.content),
                score: s.score,
                created_at: s.memory.created_at,
            })
            .collect();
        let packed = context::pack(&candidates, &p.search.query, budget, &p.allocation, &bpe as &dyn Tokenizer);
        let included: HashSet<Uuid> = packed.items.iter().map(|i| i.id).collect();
        self.record_access(
            tenant,
            &scored.iter().map(|s| &s.memory).filter(|m| included.contains(&m.id)).collect::<Vec<_>>(),
        );
        let mut sections: BTreeMap<Tier, Vec<PackedItem>> = Tier::ALL.iter().map(|t| (*t, Vec::new())).collect();
        for item in &packed.items {
            sections.entry(item.tier).or_default().push(item.clone());
        }
        let usage = ContextUsage {
            tokens_available: budget,
            tokens_used: packed.tokens_used,
            per_tier: Tier::ALL.iter().map(|t| (*t, packed.per_tier().get(t).copied().unwrap_or(0))).collect(),
            dropped: packed.dropped_ids.len(),
            shortened: packed.items.iter().filter(|i| i.shortened).count(),
            dropped_ids: packed.dropped_ids.clone(),
        };
        Ok(ContextOutcome { context: packed.rendered, sections, usage, timings, warnings })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relevance_spans_the_median_to_the_best_candidate() {
        let mut r = vec![0.76, 0.72, 0.65, 0.58, 0.57];
        stretch(&mut r);
        // The median is 0.65: 0.72 lies 0.07 of the 0.11 above it.
        assert!((r[0] - 1.0).abs() < 1e-12 && (r[1] - 0.07 / 0.11).abs() < 1e-9, "{r:?}");
        assert_eq!(r[2..], [0.0, 0.0, 0.0]);
        let mut one = vec![0.4];
        stretch(&mut one);
        assert_eq!(one, [1.0]);
        let mut none = vec![0.0, 0.0];
        stretch(&mut none);
        assert_eq!(none, [0.0, 0.0]);
    }

    #[test]
    fn overlap_is_the_share_of_query_words_found() {
        // Query words ≥ 3 letters: {flight, lisbon, delayed}; the text has flight and lisbon → 2/3.
        let words = QueryWords::new("Is my flight to Lisbon delayed?");
        assert!((words.overlap("Booked the flight to Lisbon") - 2.0 / 3.0).abs() < 1e-9);
        assert!((words.overlap("LISBON lisbon Lisbon") - 1.0 / 3.0).abs() < 1e-9);
        assert_eq!(QueryWords::new("a an").overlap("anything"), 0.0);
        // Words outside ASCII match whatever their case; short ones never count.
        let words = QueryWords::new("Café crème für Ökonomen, ok?");
        assert!((words.overlap("CAFÉ and ökonomen; OK") - 2.0 / 4.0).abs() < 1e-9);
        assert!((words.overlap("cafe creme") - 0.0).abs() < 1e-9);
    }
}
