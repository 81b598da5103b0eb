//! The two recall legs on SQLite, with the Postgres backend's contract
//! (`store/postgres/search.rs`) and their own means. Both legs ask an
//! in-process index for the best rows of each tier, then read those rows in
//! one SQL statement per tier with every filter applied. When filters the
//! indexes cannot see (metadata) drop rows, the next-best are asked for, so
//! each tier still returns up to `per_leg` rows.
//!
//! - vector: the vector index (`vectors.rs`) scans the agent's vectors of
//!   the query's model; `similarity` is the exact cosine.
//! - full text: the full-text index (`text.rs`) ranks every row of the agent
//!   that holds a word of the query (stop words dropped, stemmed, OR-ed: a
//!   question rarely contains every word of its answer) by bm25;
//!   `text_rank` is the bm25, larger is better. Unlike Postgres's leg, which
//!   ranks at most `MAX_TEXT_MATCHES` matches, every match is ranked.
//!
//! As in the Postgres backend, each leg also scores its rows on the other
//! leg's measure: the vector leg's rows get their bm25 from the full-text
//! index (0 when they hold no query word), the text leg's rows their cosine
//! and vector when they have a vector of the query's model. A memory one
//! leg found is then fused from both scores.
//!
//! The full-text leg needs no query vector to rank and read its rows: it
//! does both while the query is being embedded, and computes the cosines
//! once the vector arrives.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::Instant;

use chrono::{DateTime, Utc};
use futures::FutureExt;
use futures::future::try_join_all;
use futures::try_join;
use serde_json::Value;
use sqlx::{QueryBuilder, Row, Sqlite};
use uuid::Uuid;

use super::rows::{JSON_ROW, from_json_rows};
use super::text::query_terms;
use super::vectors::{ScanFilter, normalise};
use super::{SqliteStore, micros, observe, record, store_error};
use crate::domain::{Memory, Tier};
use crate::embed::dot;
use crate::store::{Adjacent, Hit, PendingVector, SearchHits, SearchQuery, StoreError, StoreResult};

/// `metadata.KEY` equals VALUE as JSON values (Postgres's jsonb `=`):
/// compared by JSON type and value, numbers numerically (1 = 1.0).
fn push_metadata_json(qb: &mut QueryBuilder<Sqlite>, key: &str, value: &Value) {
    qb.push(" and exists (select 1 from json_each(m.metadata) j where j.key = ").push_bind(key.to_string());
    match value {
        Value::Null => {
            qb.push(" and j.type = 'null'");
        }
        Value::Bool(true) => {
            qb.push(" and j.type = 'true'");
        }
        Value::Bool(false) => {
            qb.push(" and j.type = 'false'");
        }
        Value::Number(n) => {
            qb.push(" and j.type in ('integer', 'real') and j.value = ");
            match n.as_i64() {
                Some(i) => qb.push_bind(i),
                None => qb.push_bind(n.as_f64().unwrap_or(f64::NAN)),
            };
        }
        Value::String(s) => {
            qb.push(" and j.type = 'text' and j.value = ").push_bind(s.clone());
        }
        Value::Array(_) | Value::Object(_) => {
            let kind = if value.is_array() { "array" } else { "object" };
            qb.push(format!(" and j.type = '{kind}' and json(j.value) = json(")).push_bind(value.to_string()).push(")");
        }
    }
    qb.push(")");
}

/// The filters every leg applies, for the row alias `m`, in any of `tiers`.
fn push_filters(qb: &mut QueryBuilder<Sqlite>, tenant: &str, tiers: &[Tier], q: &SearchQuery, now: DateTime<Utc>) {
    qb.push(" m.tenant_id = ").push_bind(tenant.to_string());
    qb.push(" and m.tier in (");
    let mut sep = qb.separated(", ");
    for tier in tiers {
        sep.push_bind(tier.as_str());
    }
    qb.push(")");
    qb.push(" and m.agent_id = ").push_bind(q.agent_id.clone());
    qb.push(" and (m.expires_at is null or m.expires_at > ").push_bind(micros(now)).push(")");
    // The user scope (`domain::memory::in_user_scope`).
    if let Some(u) = &q.user_id {
        qb.push(" and (m.user_id = ").push_bind(u.clone()).push(" or m.user_id is null)");
    }
    if let Some(t) = q.since {
        qb.push(" and m.occurred_at >= ").push_bind(micros(t));
    }
    if let Some(t) = q.until {
        qb.push(" and m.occurred_at < ").push_bind(micros(t));
    }
    for (k, v) in &q.metadata {
        push_metadata_json(qb, k, v);
    }
    if let Some(t) = q.as_of {
        qb.push(" and m.created_at <= ").push_bind(micros(t));
    }
    if tiers.contains(&Tier::Semantic) {
        if let Some(t) = q.valid_at {
            push_held_at(qb, t, q.as_of);
        } else if let Some(t) = q.as_of {
            qb.push(" and (m.tier <> 'semantic' or ((m.valid_until is null or m.valid_until > ")
                .push_bind(micros(t))
                .push(") and m.contested_by is null))");
        } else if q.include_candidates {
            qb.push(" and (m.tier <> 'semantic' or m.valid_until is null or m.contested_by is not null)");
        } else {
            qb.push(" and (m.tier <> 'semantic' or m.valid_until is null)");
        }
    }
}

/// `valid_at` (`store::SearchQuery::valid_at`) for the row alias `m`, as on
/// Postgres: facts that held at `t` as known at `as_of`; other tiers pass.
pub(super) fn push_held_at(qb: &mut QueryBuilder<Sqlite>, t: DateTime<Utc>, as_of: Option<DateTime<Utc>>) {
    qb.push(" and (m.tier <> 'semantic' or (m.contested_by is null and m.valid_from <= ").push_bind(micros(t));
    qb.push(
        " and coalesce((select min(n.valid_from) from memories n \
         where n.tenant_id = m.tenant_id and n.supersedes = m.id",
    );
    if let Some(a) = as_of {
        qb.push(" and n.created_at <= ").push_bind(micros(a));
    }
    qb.push("), case when m.valid_until is null");
    if let Some(a) = as_of {
        qb.push(" or m.valid_until > ").push_bind(micros(a));
    }
    qb.push(format!(" then {} else m.valid_until end) > ", i64::MAX)).push_bind(micros(t)).push("))");
}

/// Rows the vector leg reads in one statement; twice as many or more are
/// read as two statements at once.
const SPLIT_ROWS: usize = 64;

/// A row an index proposed: its id, tier and its score there.
#[derive(Debug, Clone, Copy)]
struct Proposal {
    id: Uuid,
    tier: Tier,
    score: f64,
}

/// A proposed row that passed every filter, with the index's score.
struct Candidate {
    memory: Memory,
    score: f64,
}

/// The search's filters, owned, for the index scans off the async workers.
#[derive(Clone)]
struct Scope {
    tenant: String,
    agent: String,
    user: Option<String>,
    since: Option<i64>,
    until: Option<i64>,
    now: i64,
    candidates: bool,
    as_of: Option<i64>,
    valid_at: Option<i64>,
}

impl Scope {
    fn of(tenant: &str, q: &SearchQuery, now: DateTime<Utc>) -> Scope {
        Scope {
            tenant: tenant.to_string(),
            agent: q.agent_id.clone(),
            user: q.user_id.clone(),
            since: q.since.map(micros),
            until: q.until.map(micros),
            now: micros(now),
            candidates: q.include_candidates,
            as_of: q.as_of.map(micros),
            valid_at: q.valid_at.map(micros),
        }
    }

    fn filter<'a>(&'a self, tiers: &'a [Tier], seen: &'a HashSet<Uuid>) -> ScanFilter<'a> {
        ScanFilter {
            tiers,
            user_id: self.user.as_deref(),
            since: self.since,
            until: self.until,
            now: self.now,
            seen,
            candidates: self.candidates,
            as_of: self.as_of,
            valid_at: self.valid_at,
        }
    }
}

/// Runs an index scan off the async workers: at 100K memories it is CPU
/// work of a millisecond or more, which would stall other requests.
async fn off_workers<T: Send + 'static>(
    what: &'static str,
    scan: impl FnOnce() -> T + Send + 'static,
) -> StoreResult<T> {
    tokio::task::spawn_blocking(scan).await.map_err(|e| StoreError::Internal(anyhow::Error::new(e).context(what)))
}

/// The query vector, normalised once: the index's vectors are unit length,
/// so a dot product with it is their cosine (as the vector leg computes it).
struct Unit(Option<Vec<f32>>);

impl Unit {
    fn of(q: &SearchQuery) -> Unit {
        Unit(q.vector.as_ref().map(|e| normalise(&e.vector)))
    }

    /// A row's cosine to the query vector, given its vector from the index.
    fn similarity(&self, vector: Option<Vec<f32>>) -> (Option<f64>, Option<Vec<f32>>) {
        match (&self.0, vector) {
            (Some(q), Some(v)) => (Some(f64::from(dot(q, &v))), Some(v)),
            _ => (None, None),
        }
    }
}

impl SqliteStore {
    pub(super) async fn search_legs(
        &self,
        tenant: &str,
        q: &SearchQuery,
        vector: PendingVector,
        now: DateTime<Utc>,
    ) -> StoreResult<SearchHits> {
        let tiers: Vec<Tier> = q.tiers.iter().copied().filter(|t| *t != Tier::Working).collect();
        if tiers.is_empty() {
            return Ok(SearchHits::default());
        }
        let terms = query_terms(&q.text);
        let vector = vector.shared();
        let vector_leg = async {
            let Some(embedding) = vector.clone().await else {
                return Ok::<_, StoreError>((None, 0.0));
            };
            let started = Instant::now();
            let q = SearchQuery { vector: Some(embedding), ..q.clone() };
            let mut hits = self.vector_leg(tenant, &q, &tiers, now).await?;
            if !terms.is_empty() {
                let ids: Vec<Uuid> = hits.iter().map(|h| h.memory.id).collect();
                let ranks = self.text_ranks(tenant, &q.agent_id, &terms, &ids);
                for hit in &mut hits {
                    hit.text_rank = Some(ranks.get(&hit.memory.id).copied().unwrap_or(0.0));
                }
            }
            observe("search_vector", started);
            Ok((Some(hits), started.elapsed().as_secs_f64()))
        };
        let text_leg = async {
            if terms.is_empty() {
                return Ok::<_, StoreError>((None, 0.0));
            }
            let started = Instant::now();
            let found = self.text_leg(tenant, q, &terms, &tiers, now).await?;
            let reading = started.elapsed().as_secs_f64();
            let q = SearchQuery { vector: vector.clone().await, ..q.clone() };
            let started = Instant::now();
            let ids: Vec<Uuid> = found.iter().map(|c| c.memory.id).collect();
            let mut vectors = self.vectors_of(tenant, &q, &ids);
            let unit = Unit::of(&q);
            let hits: Vec<Hit> = found
                .into_iter()
                .map(|c| {
                    let (similarity, vector) = unit.similarity(vectors.remove(&c.memory.id));
                    Hit { memory: c.memory, similarity, text_rank: Some(c.score), vector }
                })
                .collect();
            let seconds = reading + started.elapsed().as_secs_f64();
            record("search_text", seconds);
            Ok((Some(hits), seconds))
        };
        let ((vector_hits, vector_seconds), (text_hits, text_seconds)) = try_join!(vector_leg, text_leg)?;
        let vector_leg = vector_hits.is_some();
        let mut hits: Vec<Hit> = vector_hits.unwrap_or_default();
        let mut seen: HashSet<Uuid> = hits.iter().map(|h| h.memory.id).collect();
        let text_leg = text_hits.is_some();
        hits.extend(text_hits.unwrap_or_default().into_iter().filter(|t| seen.insert(t.memory.id)));
        Ok(SearchHits { hits, vector_leg, text_leg, vector_ms: vector_seconds * 1e3, text_ms: text_seconds * 1e3 })
    }

    /// The nearest rows by cosine (their text rank is filled in by `search_legs`).
    async fn vector_leg(
        &self,
        tenant: &str,
        q: &SearchQuery,
        tiers: &[Tier],
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<Hit>> {
        let embedding = q.vector.as_ref().expect("vector leg needs a vector");
        let scope = Scope::of(tenant, q, now);
        let propose = |tiers: Vec<Tier>, seen: HashSet<Uuid>, want: usize| {
            let (inner, scope) = (self.inner.clone(), scope.clone());
            let (model, vector) = (embedding.model.clone(), embedding.vector.clone());
            off_workers("vector scan", move || {
                let index = inner.vectors.read().unwrap_or_else(|poisoned| poisoned.into_inner());
                let found =
                    index.nearest(&scope.tenant, &scope.agent, &model, &vector, &scope.filter(&tiers, &seen), want);
                found
                    .into_iter()
                    .map(|s| Proposal { id: s.id, tier: s.tier, score: f64::from(s.similarity) })
                    .collect::<Vec<_>>()
            })
        };
        let found = self.candidates(tenant, q, tiers, now, Some(&embedding.model), propose).await?;
        let ids: Vec<Uuid> = found.iter().map(|c| c.memory.id).collect();
        let mut vectors = self.vectors_of(tenant, q, &ids);
        Ok(found
            .into_iter()
            .map(|c| {
                let vector = vectors.remove(&c.memory.id);
                Hit { memory: c.memory, similarity: Some(c.score), text_rank: None, vector }
            })
            .collect())
    }

    /// The best rows by bm25 (their cosine is computed by `search_legs`
    /// once the query vector is known).
    async fn text_leg(
        &self,
        tenant: &str,
        q: &SearchQuery,
        terms: &[String],
        tiers: &[Tier],
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<Candidate>> {
        let scope = Scope::of(tenant, q, now);
        let propose = |tiers: Vec<Tier>, seen: HashSet<Uuid>, want: usize| {
            let (inner, scope, terms) = (self.inner.clone(), scope.clone(), terms.to_vec());
            off_workers("full-text ranking", move || {
                let index = inner.text.read().unwrap_or_else(|poisoned| poisoned.into_inner());
                let found = index.best(&scope.tenant, &scope.agent, &terms, &scope.filter(&tiers, &seen), want);
                found.into_iter().map(|r| Proposal { id: r.id, tier: r.tier, score: r.rank }).collect::<Vec<_>>()
            })
        };
        self.candidates(tenant, q, tiers, now, None, propose).await
    }

    /// bm25 of the agent's given rows for the query's terms (0 for a row
    /// that holds none of them).
    fn text_ranks(&self, tenant: &str, agent: &str, terms: &[String], ids: &[Uuid]) -> HashMap<Uuid, f64> {
        let index = self.inner.text.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        index.ranks(tenant, agent, terms, ids)
    }

    /// Rounds of proposals and reads: `propose(tiers, seen, want)` offers up
    /// to `want` rows per tier, best first, none of `seen`; SQL keeps those
    /// that pass every filter. A tier still short of `per_leg` while its
    /// index may have more asks again, four times wider. Returned tier by
    /// tier, in the query's order, best first (ties in the index's order).
    async fn candidates<F, Fut>(
        &self,
        tenant: &str,
        q: &SearchQuery,
        tiers: &[Tier],
        now: DateTime<Utc>,
        model: Option<&str>,
        propose: F,
    ) -> StoreResult<Vec<Candidate>>
    where
        F: Fn(Vec<Tier>, HashSet<Uuid>, usize) -> Fut,
        Fut: Future<Output = StoreResult<Vec<Proposal>>>,
    {
        let mut found: Vec<Candidate> = Vec::new();
        let mut seen: HashSet<Uuid> = HashSet::new();
        let mut active: Vec<Tier> = tiers.to_vec();
        let mut want = q.per_leg;
        while !active.is_empty() && want > 0 {
            let proposed = propose(active.clone(), seen.clone(), want).await?;
            if proposed.is_empty() {
                break;
            }
            seen.extend(proposed.iter().map(|p| p.id));
            let mut fetched = self.fetch_rows(tenant, q, &proposed, &active, model, now).await?;
            let mut short = Vec::new();
            for &tier in &active {
                let offered: Vec<&Proposal> = proposed.iter().filter(|p| p.tier == tier).collect();
                let mut have = found.iter().filter(|c| c.memory.tier == tier).count();
                for p in &offered {
                    if have >= q.per_leg {
                        break;
                    }
                    if let Some(memory) = fetched.remove(&p.id) {
                        found.push(Candidate { memory, score: p.score });
                        have += 1;
                    }
                }
                // Fewer offered than asked: the index had no more for this tier.
                if have < q.per_leg && offered.len() == want {
                    short.push(tier);
                }
            }
            active = short;
            want = want.saturating_mul(4);
        }
        // Same order as Postgres's legs: tier by tier, best first.
        let position = |c: &Candidate| tiers.iter().position(|t| *t == c.memory.tier);
        found.sort_by(|a, b| position(a).cmp(&position(b)).then(b.score.total_cmp(&a.score)));
        Ok(found)
    }

    /// The proposed rows that pass every filter (and, given a model, hold a
    /// vector of it), by id.
    async fn fetch_rows(
        &self,
        tenant: &str,
        q: &SearchQuery,
        proposed: &[Proposal],
        tiers: &[Tier],
        model: Option<&str>,
        now: DateTime<Utc>,
    ) -> StoreResult<HashMap<Uuid, Memory>> {
        let ids: Vec<Uuid> = proposed.iter().filter(|p| tiers.contains(&p.tier)).map(|p| p.id).collect();
        // The vector leg (the one given a model) runs once the query is
        // embedded, which leaves a core idle: enough rows are read as two
        // statements at once, on two pooled connections. The full-text leg
        // reads beside the embedding and keeps to one. At most 2,000 ids
        // per statement (SQLite allows 32,766 parameters).
        let split = model.is_some() && ids.len() >= 2 * SPLIT_ROWS;
        let per_statement = if split { ids.len().div_ceil(2) } else { ids.len() }.min(2_000);
        let reads = ids.chunks(per_statement.max(1)).map(|chunk| async move {
            let mut qb: QueryBuilder<Sqlite> =
                // The ids are the selective part; without statistics the
                // planner could prefer the (tenant, agent, created_at) index
                // and walk the agent's every row.
                QueryBuilder::new(format!(
                    "select json_group_array({JSON_ROW}) from memories m indexed by memories_tenant_id where"
                ));
            push_filters(&mut qb, tenant, tiers, q, now);
            if let Some(model) = model {
                qb.push(" and m.embedding_model = ").push_bind(model.to_string());
            }
            qb.push(" and m.id in (");
            let mut sep = qb.separated(", ");
            for id in chunk {
                sep.push_bind(*id);
            }
            qb.push(")");
            let rows: String = qb.build_query_scalar().fetch_one(&self.inner.pool).await.map_err(store_error)?;
            from_json_rows(&rows)
        });
        let mut out = HashMap::with_capacity(ids.len());
        for rows in try_join_all(reads).await? {
            out.extend(rows.into_iter().map(|(_, m)| (m.id, m)));
        }
        Ok(out)
    }

    /// The normalised vectors of the given rows that have one of the query
    /// vector's model, from the vector index (a row committed a moment ago
    /// may not be there yet; it then goes without, as a row of another model).
    fn vectors_of(&self, tenant: &str, q: &SearchQuery, ids: &[Uuid]) -> HashMap<Uuid, Vec<f32>> {
        let Some(e) = &q.vector else { return HashMap::new() };
        let index = self.inner.vectors.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        index.normalised(tenant, &q.agent_id, &e.model, e.vector.len(), ids)
    }

    /// The rows of the given `seq`s as hits (no text rank yet), with their
    /// cosine to the query vector when they have a vector of its model.
    async fn hits_by_seq(&self, tenant: &str, q: &SearchQuery, seqs: &[i64]) -> StoreResult<HashMap<i64, Hit>> {
        let mut qb: QueryBuilder<Sqlite> =
            QueryBuilder::new(format!("select json_group_array({JSON_ROW}) from memories m where m.seq in ("));
        let mut sep = qb.separated(", ");
        for seq in seqs {
            sep.push_bind(*seq);
        }
        qb.push(")");
        let rows: String = qb.build_query_scalar().fetch_one(&self.inner.pool).await.map_err(store_error)?;
        let rows = from_json_rows(&rows)?;
        let ids: Vec<Uuid> = rows.iter().map(|(_, m)| m.id).collect();
        let mut vectors = self.vectors_of(tenant, q, &ids);
        let unit = Unit::of(q);
        Ok(rows
            .into_iter()
            .map(|(seq, memory)| {
                let (similarity, vector) = unit.similarity(vectors.remove(&memory.id));
                (seq, Hit { memory, similarity, text_rank: None, vector })
            })
            .collect())
    }

    /// The episodic rows written just before and after each anchor by the
    /// same agent, passing the query's filters: one statement finds their
    /// `seq` (two probes per anchor on `memories_tenant_agent_created`), one
    /// reads them; their bm25 comes from the full-text index.
    pub(super) async fn adjacent(
        &self,
        tenant: &str,
        q: &SearchQuery,
        anchors: &[Uuid],
        known: &HashSet<Uuid>,
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<Adjacent>> {
        if anchors.is_empty() {
            return Ok(Vec::new());
        }
        let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
            "with a as (select m.id, m.created_at from memories m indexed by memories_tenant_id where m.tenant_id = ",
        );
        qb.push_bind(tenant.to_string());
        qb.push(" and m.tier = 'episodic' and m.id in (");
        let mut sep = qb.separated(", ");
        for id in anchors {
            sep.push_bind(*id);
        }
        qb.push(")) select a.id as anchor");
        for (name, cmp, order) in [("before", "<", "desc"), ("after", ">", "asc")] {
            qb.push(", (select m.seq from memories m where");
            push_filters(&mut qb, tenant, &[Tier::Episodic], q, now);
            qb.push(format!(
                " and (m.created_at, m.id) {cmp} (a.created_at, a.id) order by m.created_at {order}, m.id {order} \
                 limit 1) as {name}"
            ));
        }
        qb.push(" from a");
        let mut pairs: Vec<(Uuid, i64)> = Vec::new();
        for row in qb.build().fetch_all(&self.inner.pool).await.map_err(store_error)? {
            let anchor: Uuid = row.try_get("anchor").map_err(store_error)?;
            for name in ["before", "after"] {
                if let Some(seq) = row.try_get::<Option<i64>, _>(name).map_err(store_error)? {
                    pairs.push((anchor, seq));
                }
            }
        }
        if pairs.is_empty() {
            return Ok(Vec::new());
        }
        let mut seqs: Vec<i64> = pairs.iter().map(|(_, seq)| *seq).collect();
        seqs.sort_unstable();
        seqs.dedup();
        let mut rows = self.hits_by_seq(tenant, q, &seqs).await?;
        let terms = query_terms(&q.text);
        let ranks = if terms.is_empty() {
            HashMap::new()
        } else {
            let ids: Vec<Uuid> = rows.values().map(|h| h.memory.id).collect();
            self.text_ranks(tenant, &q.agent_id, &terms, &ids)
        };
        for hit in rows.values_mut() {
            hit.text_rank = Some(ranks.get(&hit.memory.id).copied().unwrap_or(0.0));
        }
        Ok(pairs
            .into_iter()
            .filter_map(|(anchor, seq)| {
                rows.get(&seq).map(|hit| {
                    let id = hit.memory.id;
                    Adjacent { anchor, id, hit: (!known.contains(&id)).then(|| hit.clone()) }
                })
            })
            .collect())
    }
}
