//! The two recall legs on SQLite, with the Postgres backend's contract
//! (`store/postgres/search.rs`) and their own means:
//!
//! - vector: the in-process index (`vectors.rs`) scans the agent's vectors of
//!   the query's model and proposes the nearest per tier; one SQL statement
//!   then reads those rows with every filter applied. When the filters the
//!   index cannot see (metadata) drop rows, the next-nearest are fetched, so
//!   each tier still returns up to `per_leg` rows.
//! - full text: FTS5 with `porter unicode61`, each tier's query restricted
//!   inside the index to the tenant's agent and the tier (the `scope` column,
//!   see the migration). The query's words (stop words
//!   of Postgres's English list dropped) are each quoted, so no input can be
//!   FTS5 syntax, and OR-ed: a question rarely contains every word of its
//!   answer. Ranked by bm25; `text_rank` is -bm25, larger is better. As in
//!   Postgres, the matches ranked per tier are bounded (`MAX_TEXT_MATCHES`,
//!   the newest first): a long query of common words matches most of a large
//!   agent's memories.
//!
//! As in the Postgres backend, each leg also scores its rows on the other
//! leg's measure: the vector leg's rows get their bm25 rank (0 when they
//! match no query word), the text leg's rows their cosine and vector when
//! they have a vector of the query's model. A memory one leg found is then
//! fused from both scores.
//!
//! The order of the work follows what it costs. Finding each tier's newest
//! matches is cheap and needs no vector. bm25 is not: each statement that
//! computes it first walks every query word's whole posting list (its idf,
//! about 2.5 ms at 110K memories), then reads each ranked row's token counts.
//! So the text leg ranks all its candidates in one statement (`text_ranks`),
//! while the query is being embedded. A vector row newer than its tier's
//! oldest candidate needs no statement of its own: had it matched a word, it
//! would be a candidate (ranked), otherwise it ranks 0. Only the vector rows
//! older than a cut candidate list are ranked by a second statement.

use std::collections::{HashMap, HashSet};

use std::time::Instant;

use chrono::{DateTime, Utc};
use futures::FutureExt;
use futures::try_join;
use serde_json::Value;
use sqlx::{QueryBuilder, Row, Sqlite};
use tokio::sync::oneshot;
use uuid::Uuid;

use super::fts::{fts_query, scoped};
use super::rows::{COLUMNS, MemoryRow, decode_vector};
use super::vectors::{ScanFilter, Scored};
use super::{SqliteStore, micros, observe, record, store_error};
use crate::domain::{Memory, Tier};
use crate::store::{Adjacent, Hit, PendingVector, SearchHits, SearchQuery, StoreError, StoreResult};

/// Most full-text matches ranked per tier and query, the newest first.
/// Lower than Postgres's bound: FTS5 computes bm25 row by row, with the row's
/// token counts read, about 2 µs a row on top of the statement's fixed cost.
pub const MAX_TEXT_MATCHES: i64 = 1_000;

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

/// The filters every leg applies, for the row alias `m`.
fn push_filters(qb: &mut QueryBuilder<Sqlite>, tenant: &str, tier: Tier, q: &SearchQuery, now: DateTime<Utc>) {
    qb.push(" m.tenant_id = ").push_bind(tenant.to_string());
    qb.push(" and m.tier = ").push_bind(tier.as_str());
    qb.push(" and m.agent_id = ").push_bind(q.agent_id.clone());
    qb.push(" and (m.expires_at is null or m.expires_at > ").push_bind(micros(now)).push(")");
    if let Some(u) = &q.user_id {
        qb.push(" and m.user_id = ").push_bind(u.clone());
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
    if tier == Tier::Semantic {
        qb.push(" and m.valid_until is null");
    }
}

/// The one row of JSON a full-text statement returns (`json_group_array`
/// of `seq`s, or of `[seq, text_rank]` pairs).
fn decode_json<T: serde::de::DeserializeOwned>(json: &str, what: &'static str) -> StoreResult<T> {
    serde_json::from_str(json).map_err(|e| StoreError::Internal(anyhow::Error::new(e).context(what)))
}

/// One tier's full-text candidates: its newest matches, newest first.
struct Candidates {
    tier: Tier,
    seqs: Vec<i64>,
}

impl Candidates {
    /// Where the list stops telling whether a row matches.
    fn cutoff(&self) -> Cutoff {
        let cut = self.seqs.len() as i64 >= MAX_TEXT_MATCHES;
        Cutoff { tier: self.tier, oldest: if cut { self.seqs.last().copied() } else { None } }
    }
}

/// A tier's candidate list as the vector leg sees it: when `MAX_TEXT_MATCHES`
/// cut the list, its oldest row.
struct Cutoff {
    tier: Tier,
    oldest: Option<i64>,
}

impl Cutoff {
    /// Whether a row of this tier that passes the filters may match a query
    /// word without being a candidate: only below a cut list's oldest row.
    fn unknown(&self, tier: Tier, seq: i64) -> bool {
        tier == self.tier && self.oldest.is_some_and(|oldest| seq < oldest)
    }
}

/// Cosine of two vectors of any length (0 when either is zero).
fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
    let (na, nb) = (norm(a), norm(b));
    if na == 0.0 || nb == 0.0 {
        return 0.0;
    }
    a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum::<f64>() / (na * nb)
}

/// The cosine to the query vector and the stored vector of a row, when it
/// has a vector of the query's model.
fn similarity_of(
    q: &SearchQuery,
    memory: &Memory,
    blob: Option<Vec<u8>>,
) -> StoreResult<(Option<f64>, Option<Vec<f32>>)> {
    match (&q.vector, blob) {
        (Some(e), Some(blob)) if memory.embedding_model.as_deref() == Some(e.model.as_str()) => {
            let v = decode_vector(&blob)?;
            Ok(if v.len() == e.vector.len() { (Some(cosine(&e.vector, &v)), Some(v)) } else { (None, None) })
        }
        _ => Ok((None, None)),
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
        let fts = fts_query(&q.text);
        let fts = fts.as_deref();
        let vector = vector.shared();
        // Where each tier's candidates end, for the vector leg: its rows
        // below a cut list's oldest need a bm25 statement of their own.
        let (cutoffs_tx, cutoffs_rx) = oneshot::channel::<Vec<Cutoff>>();
        let vector_leg = async {
            let Some(embedding) = vector.clone().await else {
                return Ok::<_, StoreError>((None, HashMap::new(), 0.0));
            };
            let started = Instant::now();
            let q = SearchQuery { vector: Some(embedding), ..q.clone() };
            let hits = self.vector_leg(tenant, &q, &tiers, now).await?;
            let mut ranks = HashMap::new();
            if let Some(fts) = fts {
                // No candidates (their statement failed): the error is the answer.
                let cutoffs = cutoffs_rx.await.unwrap_or_default();
                let old: Vec<i64> = hits
                    .iter()
                    .filter(|(hit, seq)| cutoffs.iter().any(|c| c.unknown(hit.memory.tier, *seq)))
                    .map(|(_, seq)| *seq)
                    .collect();
                if !old.is_empty() {
                    ranks = self.text_ranks(fts, &old).await?;
                }
            }
            observe("search_vector", started);
            Ok((Some(hits), ranks, started.elapsed().as_secs_f64()))
        };
        // The text leg needs no vector until it reads its best rows (with
        // their cosine): finding and ranking the matches runs while the
        // query is being embedded.
        let text_leg = async {
            let Some(fts) = fts else {
                return Ok::<_, StoreError>((None, HashMap::new(), 0.0));
            };
            let started = Instant::now();
            let candidates = self.text_candidates(tenant, q, fts, &tiers, now).await?;
            let _ = cutoffs_tx.send(candidates.iter().map(Candidates::cutoff).collect());
            let mut seqs: Vec<i64> = candidates.iter().flat_map(|c| c.seqs.iter().copied()).collect();
            seqs.sort_unstable();
            let ranks = self.text_ranks(fts, &seqs).await?;
            let mut best = Vec::new();
            for c in &candidates {
                let mut ranked: Vec<(i64, f64)> =
                    c.seqs.iter().map(|seq| (*seq, ranks.get(seq).copied().unwrap_or(0.0))).collect();
                ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                ranked.truncate(q.per_leg);
                best.extend(ranked);
            }
            let ranking = started.elapsed().as_secs_f64();
            let q = SearchQuery { vector: vector.clone().await, ..q.clone() };
            let started = Instant::now();
            let hits = self.text_rows(&q, best).await?;
            let seconds = ranking + started.elapsed().as_secs_f64();
            record("search_text", seconds);
            Ok((Some(hits), ranks, seconds))
        };
        let ((mut vector_hits, old_ranks, vector_seconds), (text_hits, text_ranks, text_seconds)) =
            try_join!(vector_leg, text_leg)?;
        if fts.is_some() {
            // A vector row is ranked with the candidates, or on its own when
            // older than them; otherwise it matches no query word: 0.
            for (hit, seq) in vector_hits.iter_mut().flatten() {
                let rank = text_ranks.get(seq).or_else(|| old_ranks.get(seq)).copied().unwrap_or(0.0);
                hit.text_rank = Some(rank);
            }
        }
        let vector_leg = vector_hits.is_some();
        let mut hits: Vec<Hit> = vector_hits.unwrap_or_default().into_iter().map(|(h, _)| h).collect();
        let mut seen: HashSet<Uuid> = hits.iter().map(|h| h.memory.id).collect();
        let text_leg_ran = text_hits.is_some();
        hits.extend(text_hits.unwrap_or_default().into_iter().filter(|t| seen.insert(t.memory.id)));
        Ok(SearchHits {
            hits,
            vector_leg,
            text_leg: text_leg_ran,
            vector_ms: vector_seconds * 1e3,
            text_ms: text_seconds * 1e3,
        })
    }

    /// The nearest rows by cosine, with their `seq` (their text rank is
    /// filled in by `search_legs`).
    async fn vector_leg(
        &self,
        tenant: &str,
        q: &SearchQuery,
        tiers: &[Tier],
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<(Hit, i64)>> {
        let embedding = q.vector.as_ref().expect("vector leg needs a vector");
        let mut found: Vec<(Hit, i64)> = Vec::new();
        let mut seen: HashSet<Uuid> = HashSet::new();
        let mut active: Vec<Tier> = tiers.to_vec();
        let mut want = q.per_leg;
        // Rounds: the index proposes `want` per tier; SQL keeps those that
        // pass every filter. A tier still short of `per_leg` while the index
        // may have more asks again, four times wider, skipping what was seen.
        while !active.is_empty() && want > 0 {
            // The scan is CPU work of a few milliseconds at 100K vectors:
            // off the async workers, so it never stalls other requests.
            let inner = self.inner.clone();
            let (tenant_id, agent, model, vector) =
                (tenant.to_string(), q.agent_id.clone(), embedding.model.clone(), embedding.vector.clone());
            let (tiers_now, seen_now, user) = (active.clone(), seen.clone(), q.user_id.clone());
            let (since, until, now_micros) = (q.since.map(micros), q.until.map(micros), micros(now));
            let proposed = tokio::task::spawn_blocking(move || {
                let filter = ScanFilter {
                    tiers: &tiers_now,
                    user_id: user.as_deref(),
                    since,
                    until,
                    now: now_micros,
                    seen: &seen_now,
                };
                let index = inner.vectors.read().unwrap_or_else(|poisoned| poisoned.into_inner());
                index.nearest(&tenant_id, &agent, &model, &vector, &filter, want)
            })
            .await
            .map_err(|e| StoreError::Internal(anyhow::Error::new(e).context("vector scan")))?;
            if proposed.is_empty() {
                break;
            }
            seen.extend(proposed.iter().map(|s| s.id));
            let mut fetched = self.fetch_candidates(tenant, q, &proposed, &active, now).await?;
            let mut short = Vec::new();
            for &tier in &active {
                let offered: Vec<&Scored> = proposed.iter().filter(|s| s.tier == tier).collect();
                let mut have = found.iter().filter(|(h, _)| h.memory.tier == tier).count();
                for s in &offered {
                    if have >= q.per_leg {
                        break;
                    }
                    if let Some((seq, memory, vector)) = fetched.remove(&s.id) {
                        let similarity = Some(f64::from(s.similarity));
                        found.push((Hit { memory, similarity, text_rank: None, vector: Some(vector) }, seq));
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
        // Same order as Postgres's legs: tier by tier, nearest first.
        found.sort_by(|(a, _), (b, _)| {
            let ta = tiers.iter().position(|t| *t == a.memory.tier);
            let tb = tiers.iter().position(|t| *t == b.memory.tier);
            ta.cmp(&tb).then(b.similarity.unwrap_or(0.0).total_cmp(&a.similarity.unwrap_or(0.0)))
        });
        Ok(found)
    }

    /// The proposed rows that pass every filter: seq, memory and stored vector by id.
    async fn fetch_candidates(
        &self,
        tenant: &str,
        q: &SearchQuery,
        proposed: &[Scored],
        tiers: &[Tier],
        now: DateTime<Utc>,
    ) -> StoreResult<HashMap<Uuid, (i64, Memory, Vec<f32>)>> {
        let mut out = HashMap::new();
        for &tier in tiers {
            let ids: Vec<Uuid> = proposed.iter().filter(|s| s.tier == tier).map(|s| s.id).collect();
            // SQLite allows 32766 bound parameters per statement; stay well below.
            for chunk in ids.chunks(2_000) {
                let mut qb: QueryBuilder<Sqlite> =
                    // The ids are the selective part; without statistics the
                    // planner could prefer the (tenant, agent, created_at) index
                    // and walk the agent's every row.
                    QueryBuilder::new(format!(
                        "select {COLUMNS}, m.embedding as vec from memories m indexed by memories_tenant_id where"
                    ));
                push_filters(&mut qb, tenant, tier, q, now);
                qb.push(" and m.embedding_model = ").push_bind(q.vector.as_ref().map(|e| e.model.clone()));
                qb.push(" and m.id in (");
                let mut sep = qb.separated(", ");
                for id in chunk {
                    sep.push_bind(*id);
                }
                qb.push(")");
                let rows = qb.build().fetch_all(&self.inner.pool).await.map_err(store_error)?;
                for row in rows {
                    let blob: Vec<u8> = row.try_get("vec").map_err(store_error)?;
                    let memory = <MemoryRow as sqlx::FromRow<_>>::from_row(&row).map_err(store_error)?;
                    let seq = memory.seq;
                    let memory: Memory = memory.try_into()?;
                    out.insert(memory.id, (seq, memory, decode_vector(&blob)?));
                }
            }
        }
        Ok(out)
    }

    /// -bm25 of those of the given rows that match the query (the others
    /// match no word), in one statement. The `+` keeps SQLite from handing
    /// FTS5 the `rowid IN` constraint, which it would run as one full-text
    /// query per row, each recounting every query word's rows for bm25's idf
    /// (about 0.9 ms a row at 100K memories). So the match runs once, within
    /// the rows' rowid range, and bm25 is computed for the listed rows only.
    async fn text_ranks(&self, fts: &str, seqs: &[i64]) -> StoreResult<HashMap<i64, f64>> {
        let (Some(low), Some(high)) = (seqs.iter().min(), seqs.iter().max()) else {
            return Ok(HashMap::new());
        };
        let listed = serde_json::to_string(seqs).map_err(|e| StoreError::Internal(e.into()))?;
        let ranks: String = sqlx::query_scalar(
            "with r as materialized (select rowid as seq, -bm25(memory_fts, 1.0, 0.0) as text_rank from memory_fts \
             where memory_fts match ? and rowid between ? and ? and +rowid in (select value from json_each(?))) \
             select json_group_array(json_array(seq, text_rank)) from r",
        )
        .bind(format!("body : ({fts})"))
        .bind(low)
        .bind(high)
        .bind(listed)
        .fetch_one(&self.inner.pool)
        .await
        .map_err(store_error)?;
        Ok(decode_json::<Vec<(i64, f64)>>(&ranks, "full-text ranks")?.into_iter().collect())
    }

    /// The rows of the given `seq`s as hits (no text rank yet), with their
    /// cosine to the query vector when they have a vector of its model.
    async fn hits_by_seq(&self, q: &SearchQuery, seqs: &[i64]) -> StoreResult<HashMap<i64, Hit>> {
        let mut qb: QueryBuilder<Sqlite> =
            QueryBuilder::new(format!("select {COLUMNS}, m.embedding as vec from memories m where m.seq in ("));
        let mut sep = qb.separated(", ");
        for seq in seqs {
            sep.push_bind(*seq);
        }
        qb.push(")");
        let mut rows = HashMap::new();
        for row in qb.build().fetch_all(&self.inner.pool).await.map_err(store_error)? {
            let blob: Option<Vec<u8>> = row.try_get("vec").map_err(store_error)?;
            let memory = <MemoryRow as sqlx::FromRow<_>>::from_row(&row).map_err(store_error)?;
            let seq = memory.seq;
            let memory: Memory = memory.try_into()?;
            let (similarity, vector) = similarity_of(q, &memory, blob)?;
            rows.insert(seq, Hit { memory, similarity, text_rank: None, vector });
        }
        Ok(rows)
    }

    /// The episodic rows written just before and after each anchor by the
    /// same agent, passing the query's filters: one statement finds their
    /// `seq` (two probes per anchor on `memories_tenant_agent_created`), one
    /// reads them, then their bm25 rank as in the vector leg.
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
            push_filters(&mut qb, tenant, Tier::Episodic, q, now);
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
        let mut rows = self.hits_by_seq(q, &seqs).await?;
        rows.values_mut().for_each(|h| h.text_rank = Some(0.0));
        // Ranks only for the neighbours the caller does not have.
        let unknown: Vec<i64> =
            seqs.iter().copied().filter(|seq| rows.get(seq).is_some_and(|h| !known.contains(&h.memory.id))).collect();
        if let Some(fts) = fts_query(&q.text) {
            for (seq, rank) in self.text_ranks(&fts, &unknown).await? {
                if let Some(hit) = rows.get_mut(&seq) {
                    hit.text_rank = Some(rank);
                }
            }
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

    /// Each tier's newest `MAX_TEXT_MATCHES` full-text matches that pass
    /// the filters (their `seq`, newest first), unranked.
    async fn text_candidates(
        &self,
        tenant: &str,
        q: &SearchQuery,
        fts: &str,
        tiers: &[Tier],
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<Candidates>> {
        let mut out = Vec::with_capacity(tiers.len());
        for &tier in tiers {
            // CROSS JOIN fixes SQLite's join order: the full-text match
            // drives (FTS5 walks its rowids, that is `seq`, downwards itself)
            // and each match finds its row by rowid; the other order (walk
            // the agent's rows, run the match against each) costs one
            // full-text query per row. All in one row, as JSON: the driver
            // hands rows over one by one between threads, which for 1,000
            // rows cost more than the query.
            let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
                "with r as materialized (select m.seq from memory_fts cross join memories m \
                 on m.seq = memory_fts.rowid where memory_fts match ",
            );
            qb.push_bind(scoped(tenant, &q.agent_id, tier, fts));
            qb.push(" and");
            push_filters(&mut qb, tenant, tier, q, now);
            qb.push(" order by memory_fts.rowid desc limit ").push_bind(MAX_TEXT_MATCHES);
            qb.push(") select json_group_array(seq) from r");
            let seqs: String = qb.build_query_scalar().fetch_one(&self.inner.pool).await.map_err(store_error)?;
            out.push(Candidates { tier, seqs: decode_json(&seqs, "full-text matches")? });
        }
        Ok(out)
    }

    /// The best matches' rows as hits, each with its cosine to the query
    /// vector too when it has a vector of the query's model.
    async fn text_rows(&self, q: &SearchQuery, best: Vec<(i64, f64)>) -> StoreResult<Vec<Hit>> {
        let seqs: Vec<i64> = best.iter().map(|(seq, _)| *seq).collect();
        let mut rows = if seqs.is_empty() { HashMap::new() } else { self.hits_by_seq(q, &seqs).await? };
        let mut hits = Vec::with_capacity(seqs.len());
        for (seq, rank) in best {
            if let Some(mut hit) = rows.remove(&seq) {
                hit.text_rank = Some(rank);
                hits.push(hit);
            }
        }
        Ok(hits)
    }
}
