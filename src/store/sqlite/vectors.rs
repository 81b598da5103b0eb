//! The in-process vector index of the SQLite backend: an exhaustive scan, no
//! graph, rebuilt from the `memories` table at open and kept in step by the
//! writers after each commit.
//!
//! Vectors are grouped by (tenant, agent, model, dimensions): a search only
//! ever reads the group of its agent and its query's model, so vectors of two
//! models are never compared, and one group's vectors sit back to back in
//! memory. Each group holds three copies:
//!   * `bits`: the sign of each dimension, one bit each (48 bytes for 384
//!     dimensions). The first pass reads only these and keeps, per tier,
//!     the rows that agree with the query on the most signs. At 100K x 384
//!     that is 4.8 MB per search instead of 38 MB of i8 codes or 150 MB of
//!     f32s: the i8 scan was bound by memory bandwidth at 5–6 ms.
//!   * `codes`: every vector quantised to i8 with its own scale. The first
//!     pass's rows, many times the number wanted and never fewer than
//!     [`FIRST_PASS_MIN`] per tier, are ranked by these (a quarter of the
//!     bytes of f32, and these reads jump all over the group).
//!   * `vectors`: the L2-normalised f32s. The best of the second pass (four
//!     times the number wanted) are rescored exactly from these, so the
//!     similarities returned are exact cosines. A tier with no more rows
//!     than [`FIRST_PASS_MIN`] is ranked exactly (unless quantisation moved
//!     a vector across that wide margin);
//!     a larger one is ranked as an approximate index does: a true neighbour
//!     is missed only if its signs disagree with the query's more than those
//!     of all the rows kept (the recall measured on real vectors is in
//!     the tests and the benchmark results).
//!
//! Each entry also carries the fields the search filters on that change
//! rarely (tier, validity, user, occurred_at, expiry), so the scan can skip
//! rows that could never be returned. The SQL that fetches the winners
//! applies every filter again: the index may be stale in the permissive
//! direction (a row deleted by another statement), never the strict one.
//!
//! Must not: decide what is visible on its own, or read the database after `load`.

use std::collections::{HashMap, HashSet};

use futures::TryStreamExt;
use sqlx::SqlitePool;
use uuid::Uuid;

use super::rows::decode_vector;
use crate::domain::{Memory, Tier};
use crate::embed::dot;

/// Which vectors one search may compare: one tenant's agent, one model.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct GroupKey {
    tenant: String,
    agent: String,
    model: String,
    dims: usize,
}

/// What the scan filters on, besides the vector.
#[derive(Debug, Clone)]
pub struct Entry {
    pub id: Uuid,
    pub tier: Tier,
    /// False for a superseded fact (valid_until set).
    pub valid: bool,
    /// A fact kept behind the current one it contradicts (`contested_by`).
    pub candidate: bool,
    pub user_id: Option<Box<str>>,
    /// Microseconds since the epoch, as stored.
    pub occurred_at: i64,
    pub expires_at: Option<i64>,
    /// When engram ingested it, in microseconds (for `as_of`).
    pub created_at: i64,
}

impl Entry {
    pub fn of(m: &Memory) -> Entry {
        Entry {
            id: m.id,
            tier: m.tier,
            valid: m.valid_until.is_none(),
            candidate: m.contested_by.is_some(),
            user_id: m.user_id.as_deref().map(Into::into),
            occurred_at: m.occurred_at.timestamp_micros(),
            expires_at: m.expires_at.map(|t| t.timestamp_micros()),
            created_at: m.created_at.timestamp_micros(),
        }
    }
}

#[derive(Default)]
struct Group {
    /// Normalised f32s, `dims` per entry, in entry order.
    vectors: Vec<f32>,
    /// Sign bits, `words(dims)` u64s per entry, in entry order.
    bits: Vec<u64>,
    /// i8 codes, `dims` per entry, in entry order.
    codes: Vec<i8>,
    /// Per entry: the f32 value of one code step.
    scales: Vec<f32>,
    /// Each entry's tier, in entry order: the first pass reads this, not
    /// the entries, for the rows close enough to be kept.
    tiers: Vec<Tier>,
    entries: Vec<Entry>,
    /// id -> position in the arrays above.
    slots: HashMap<Uuid, usize>,
}

/// The filters of a search, in the index's terms.
pub struct ScanFilter<'a> {
    pub tiers: &'a [Tier],
    pub user_id: Option<&'a str>,
    /// Bounds on occurred_at in microseconds: since inclusive, until exclusive.
    pub since: Option<i64>,
    pub until: Option<i64>,
    pub now: i64,
    /// Ids already proposed by an earlier round of the same search.
    pub seen: &'a HashSet<Uuid>,
    /// Admit candidate facts too.
    pub candidates: bool,
    /// What was known at this instant (microseconds): rows ingested by then,
    /// superseded facts too (the SQL keeps those valid then).
    pub as_of: Option<i64>,
    /// Facts that held at this instant (microseconds): superseded facts are
    /// admitted, the SQL judges their validity.
    pub valid_at: Option<i64>,
}

impl<'a> ScanFilter<'a> {
    /// Every live row of `tiers` not in `seen` (the indexes' tests).
    #[cfg(test)]
    pub fn all(tiers: &'a [Tier], seen: &'a HashSet<Uuid>) -> ScanFilter<'a> {
        ScanFilter {
            tiers,
            user_id: None,
            since: None,
            until: None,
            now: 0,
            seen,
            candidates: false,
            as_of: None,
            valid_at: None,
        }
    }
}

impl ScanFilter<'_> {
    pub fn admits(&self, e: &Entry) -> bool {
        self.tiers.contains(&e.tier)
            && (e.valid
                || e.tier != Tier::Semantic
                || (self.candidates && e.candidate)
                || ((self.as_of.is_some() || self.valid_at.is_some()) && !e.candidate))
            && self.as_of.is_none_or(|t| e.created_at <= t)
            && e.expires_at.is_none_or(|t| t > self.now)
            && crate::domain::memory::in_user_scope(self.user_id, e.user_id.as_deref())
            && self.since.is_none_or(|t| e.occurred_at >= t)
            && self.until.is_none_or(|t| e.occurred_at < t)
            && !self.seen.contains(&e.id)
    }
}

/// A candidate: its id, tier and exact cosine to the query.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scored {
    pub id: Uuid,
    pub tier: Tier,
    pub similarity: f32,
}

#[derive(Default)]
pub struct VectorIndex {
    groups: HashMap<GroupKey, Group>,
    /// (tenant, id) -> its group, to find an entry again on update or delete.
    locations: HashMap<(String, Uuid), GroupKey>,
}

impl VectorIndex {
    /// Reads every stored vector.
    pub async fn load(pool: &SqlitePool) -> Result<VectorIndex, sqlx::Error> {
        type LoadRow =
            (String, String, String, Uuid, String, Option<String>, i64, Option<i64>, i64, bool, bool, Vec<u8>);
        let mut index = VectorIndex::default();
        let mut rows = sqlx::query_as::<_, LoadRow>(
            "select tenant_id, agent_id, embedding_model, id, tier, user_id, occurred_at, expires_at, created_at, \
             valid_until is null, contested_by is not null, embedding from memories where embedding is not null \
             order by seq",
        )
        .fetch(pool);
        while let Some((
            tenant,
            agent,
            model,
            id,
            tier,
            user_id,
            occurred_at,
            expires_at,
            created_at,
            valid,
            candidate,
            blob,
        )) = rows.try_next().await?
        {
            let Some(tier) = Tier::parse(&tier) else { continue };
            let vector = decode_vector(&blob).map_err(|e| sqlx::Error::Decode(e.to_string().into()))?;
            let user_id = user_id.map(Into::into);
            let entry = Entry { id, tier, valid, candidate, user_id, occurred_at, expires_at, created_at };
            index.put(&tenant, &agent, &model, &vector, entry);
        }
        Ok(index)
    }

    /// How many vectors the index holds.
    pub fn len(&self) -> usize {
        self.locations.len()
    }

    /// Whether the index holds a vector of this memory.
    pub fn contains(&self, tenant: &str, id: Uuid) -> bool {
        self.locations.contains_key(&(tenant.to_string(), id))
    }

    pub fn is_empty(&self) -> bool {
        self.locations.is_empty()
    }

    /// Adds or replaces the vector of `entry.id`.
    pub fn put(&mut self, tenant: &str, agent: &str, model: &str, vector: &[f32], entry: Entry) {
        self.remove(tenant, entry.id);
        if vector.is_empty() {
            return;
        }
        let key = GroupKey { tenant: tenant.into(), agent: agent.into(), model: model.into(), dims: vector.len() };
        let group = self.groups.entry(key.clone()).or_default();
        let normalised = normalise(vector);
        group.slots.insert(entry.id, group.entries.len());
        self.locations.insert((tenant.to_string(), entry.id), key);
        let (codes, scale) = quantise(&normalised);
        group.bits.extend(signs(&normalised));
        group.codes.extend_from_slice(&codes);
        group.scales.push(scale);
        group.vectors.extend_from_slice(&normalised);
        group.tiers.push(entry.tier);
        group.entries.push(entry);
    }

    /// Updates the filter fields of an entry that keeps its vector.
    pub fn refresh(&mut self, tenant: &str, entry: Entry) {
        let Some(key) = self.locations.get(&(tenant.to_string(), entry.id)) else { return };
        if let Some(group) = self.groups.get_mut(key)
            && let Some(&slot) = group.slots.get(&entry.id)
        {
            group.tiers[slot] = entry.tier;
            group.entries[slot] = entry;
        }
    }

    /// Marks a fact superseded.
    pub fn retire(&mut self, tenant: &str, id: Uuid) {
        let Some(key) = self.locations.get(&(tenant.to_string(), id)) else { return };
        if let Some(group) = self.groups.get_mut(key)
            && let Some(&slot) = group.slots.get(&id)
        {
            group.entries[slot].valid = false;
        }
    }

    /// Forgets the vector of `id`, if it has one. The last entry of the
    /// group moves into the hole, so arrays stay dense.
    pub fn remove(&mut self, tenant: &str, id: Uuid) {
        let Some(key) = self.locations.remove(&(tenant.to_string(), id)) else { return };
        let Some(group) = self.groups.get_mut(&key) else { return };
        let Some(slot) = group.slots.remove(&id) else { return };
        let (dims, w) = (key.dims, words(key.dims));
        let last = group.entries.len() - 1;
        if slot != last {
            group.vectors.copy_within(last * dims..(last + 1) * dims, slot * dims);
            group.bits.copy_within(last * w..(last + 1) * w, slot * w);
            group.codes.copy_within(last * dims..(last + 1) * dims, slot * dims);
            group.scales[slot] = group.scales[last];
            group.entries.swap(slot, last);
            group.tiers.swap(slot, last);
            group.slots.insert(group.entries[slot].id, slot);
        }
        group.vectors.truncate(last * dims);
        group.bits.truncate(last * w);
        group.codes.truncate(last * dims);
        group.scales.truncate(last);
        group.entries.truncate(last);
        group.tiers.truncate(last);
        if group.entries.is_empty() {
            self.groups.remove(&key);
        }
    }

    /// The `want` nearest admitted vectors of each tier, best first, with
    /// exact cosines: a first pass over the sign bits keeps
    /// `first_pass(want)` rows per tier, which are then ranked exactly.
    pub fn nearest(
        &self,
        tenant: &str,
        agent: &str,
        model: &str,
        query: &[f32],
        filter: &ScanFilter<'_>,
        want: usize,
    ) -> Vec<Scored> {
        self.nearest_of(tenant, agent, model, query, filter, want, first_pass(want))
    }

    /// `nearest` with the first pass's size per tier given (`usize::MAX`:
    /// every admitted row ranked exactly).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn nearest_of(
        &self,
        tenant: &str,
        agent: &str,
        model: &str,
        query: &[f32],
        filter: &ScanFilter<'_>,
        want: usize,
        keep: usize,
    ) -> Vec<Scored> {
        let key = GroupKey { tenant: tenant.into(), agent: agent.into(), model: model.into(), dims: query.len() };
        let Some(group) = self.groups.get(&key) else { return Vec::new() };
        if want == 0 {
            return Vec::new();
        }
        let dims = key.dims;
        let q = normalise(query);
        let q_bits = signs(&q);
        let keep = keep.max(want);

        // Per tier, the rows with the fewest signs unlike the query's. A
        // large group is scanned as two halves on two threads (a search
        // gets here once its query is embedded, with a core to spare), each
        // keeping its own best; the best of both are the best of all.
        let rows = group.entries.len();
        let kept = if rows >= PARALLEL_ROWS {
            first_pass_in_halves(group, &q_bits, filter, keep)
        } else {
            first_pass_of(group, 0..rows, &q_bits, filter, keep)
        };
        // Then the kept rows by their i8 codes (a quarter of the f32s'
        // bytes, read row by row from all over the group), and a wide
        // margin of the best of those exactly: quantisation error is a few
        // thousandths of cosine, far below the gap this margin spans.
        let (q_codes, _) = quantise(&q);
        let margin = (want * 4).max(want + 64);
        let mut out = Vec::new();
        for (&tier, kept) in filter.tiers.iter().zip(kept) {
            let rows: Vec<usize> = kept.rows().collect();
            let dots = code_dots(&group.codes, dims, &rows, &q_codes);
            let mut approx: Vec<(f32, usize)> =
                rows.into_iter().zip(dots).map(|(i, d)| (d as f32 * group.scales[i], i)).collect();
            if approx.len() > margin {
                approx.select_nth_unstable_by(margin - 1, |a, b| b.0.total_cmp(&a.0));
                approx.truncate(margin);
            }
            let mut exact: Vec<Scored> = approx
                .into_iter()
                .map(|(_, i)| Scored {
                    id: group.entries[i].id,
                    tier,
                    similarity: dot(&group.vectors[i * dims..(i + 1) * dims], &q),
                })
                .collect();
            exact.sort_by(|a, b| b.similarity.total_cmp(&a.similarity).then(a.id.cmp(&b.id)));
            exact.truncate(want);
            out.extend(exact);
        }
        out
    }

    /// The normalised vectors of the given memories of `agent` that have
    /// one of `model` with `dims` dimensions (unit length: a dot product is
    /// their cosine).
    pub fn normalised(
        &self,
        tenant: &str,
        agent: &str,
        model: &str,
        dims: usize,
        ids: &[Uuid],
    ) -> HashMap<Uuid, Vec<f32>> {
        let key = GroupKey { tenant: tenant.into(), agent: agent.into(), model: model.into(), dims };
        let Some(group) = self.groups.get(&key) else { return HashMap::new() };
        ids.iter()
            .filter_map(|id| {
                let slot = *group.slots.get(id)?;
                Some((*id, group.vectors[slot * dims..(slot + 1) * dims].to_vec()))
            })
            .collect()
    }

    /// How many vectors one group holds (tests and benchmarks).
    pub fn group_len(&self, tenant: &str, agent: &str, model: &str, dims: usize) -> usize {
        let key = GroupKey { tenant: tenant.into(), agent: agent.into(), model: model.into(), dims };
        self.groups.get(&key).map_or(0, |g| g.entries.len())
    }
}

/// [`first_pass_of`] the whole group, its two halves on two threads: each
/// keeps its own best rows per tier, and the best of both are the best of
/// all (`Kept::rows` cuts the union by distance and row).
fn first_pass_in_halves(group: &Group, q_bits: &[u64], filter: &ScanFilter<'_>, keep: usize) -> Vec<Kept> {
    let (rows, middle) = (group.entries.len(), group.entries.len() / 2);
    std::thread::scope(|scope| {
        let other = scope.spawn(|| first_pass_of(group, middle..rows, q_bits, filter, keep));
        let mut kept = first_pass_of(group, 0..middle, q_bits, filter, keep);
        let theirs = other.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        for (mine, theirs) in kept.iter_mut().zip(theirs) {
            mine.rows.extend(theirs.rows);
        }
        kept
    })
}

/// The first pass over the rows `range` of `group`: per tier of the filter,
/// in its order, the `keep` admitted rows whose signs disagree with
/// `q_bits` the least (ties: the lower row). The buffer of each tier holds at
/// most 2 x `keep` and is cut back to the best `keep` when full, so no
/// allocation grows with the group.
fn first_pass_of(
    group: &Group,
    range: std::ops::Range<usize>,
    q_bits: &[u64],
    filter: &ScanFilter<'_>,
    keep: usize,
) -> Vec<Kept> {
    let w = q_bits.len();
    let mut kept: Vec<Kept> = filter.tiers.iter().map(|_| Kept::new(keep)).collect();
    // The kept buffer of each tier, by tier.
    let mut of_tier = [None; Tier::ALL.len()];
    for (k, tier) in filter.tiers.iter().enumerate() {
        of_tier[*tier as usize].get_or_insert(k);
    }
    // Rows farther than every tier's bound are passed over unread.
    let mut bound = u32::MAX;
    let mut distances = [0u32; BLOCK];
    for start in range.clone().step_by(BLOCK) {
        let end = (start + BLOCK).min(range.end);
        let d = &mut distances[..end - start];
        hamming(&group.bits[start * w..end * w], q_bits, d);
        for (i, &distance) in (start..end).zip(d.iter()) {
            if distance > bound {
                continue;
            }
            if let Some(t) = of_tier[group.tiers[i] as usize]
                && distance <= kept[t].bound
                && filter.admits(&group.entries[i])
                && kept[t].push(distance, i as u32)
            {
                bound = kept.iter().map(|k| k.bound).max().unwrap_or(u32::MAX);
            }
        }
    }
    kept
}

/// Rows of the first pass per tier for a search that wants `want`: ten
/// times as many, and at least [`FIRST_PASS_MIN`].
pub(super) fn first_pass(want: usize) -> usize {
    want.saturating_mul(FIRST_PASS_FACTOR).max(FIRST_PASS_MIN)
}

const FIRST_PASS_FACTOR: usize = 10;
/// A tier with at most this many admitted rows is ranked exactly.
pub const FIRST_PASS_MIN: usize = 1_000;

/// Groups of at least this many rows have their first pass split between
/// two threads.
const PARALLEL_ROWS: usize = 16_384;

/// Rows whose sign bits are compared in one go.
const BLOCK: usize = 1_024;

/// One tier's best rows of the first pass: (distance, row).
struct Kept {
    keep: usize,
    rows: Vec<(u32, u32)>,
    /// Rows farther than this cannot be among the best `keep` any more.
    bound: u32,
}

impl Kept {
    fn new(keep: usize) -> Kept {
        Kept { keep, rows: Vec::with_capacity(keep.saturating_mul(2).min(1 << 16)), bound: u32::MAX }
    }

    /// Adds a row; true when that cut the buffer back (and moved `bound`).
    fn push(&mut self, distance: u32, row: u32) -> bool {
        self.rows.push((distance, row));
        if self.rows.len() < self.keep.saturating_mul(2) {
            return false;
        }
        // Ties at the bound go by row, so the cut does not depend on the
        // order rows arrived in.
        self.rows.select_nth_unstable(self.keep - 1);
        self.rows.truncate(self.keep);
        self.bound = self.rows.iter().map(|(d, _)| *d).max().unwrap_or(u32::MAX);
        true
    }

    /// The best `keep` rows, in no particular order.
    fn rows(mut self) -> impl Iterator<Item = usize> {
        if self.rows.len() > self.keep {
            self.rows.select_nth_unstable(self.keep - 1);
            self.rows.truncate(self.keep);
        }
        self.rows.into_iter().map(|(_, i)| i as usize)
    }
}

/// u64 words of sign bits for `dims` dimensions.
fn words(dims: usize) -> usize {
    dims.div_ceil(64)
}

/// The L2-normalised copy of a vector. A zero vector stays zero (its cosine
/// to anything is 0).
pub(super) fn normalise(v: &[f32]) -> Vec<f32> {
    let norm = v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
    if norm > 0.0 { v.iter().map(|x| (f64::from(*x) / norm) as f32).collect() } else { vec![0.0; v.len()] }
}

/// A normalised vector's i8 codes and the value of one code step.
fn quantise(v: &[f32]) -> (Vec<i8>, f32) {
    let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    if max == 0.0 {
        return (vec![0; v.len()], 0.0);
    }
    let step = max / 127.0;
    (v.iter().map(|x| (x / step).round().clamp(-127.0, 127.0) as i8).collect(), step)
}

/// The integer dot products of the query's codes with the given rows of
/// `codes`.
fn code_dots(codes: &[i8], dims: usize, rows: &[usize], query: &[i8]) -> Vec<i32> {
    #[cfg(target_arch = "x86_64")]
    if dims.is_multiple_of(16) && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU was just checked to support AVX2, and dims is a
        // multiple of 16.
        return unsafe { code_dots_avx2(codes, dims, rows, query) };
    }
    rows.iter().map(|&i| code_dot(&codes[i * dims..(i + 1) * dims], query)).collect()
}

/// `code_dots` in AVX2 (picked at run time: release builds target baseline
/// x86-64, whose SSE2 has no 32-bit multiply): 16 codes at a time widened to
/// i16 and multiplied pairwise into i32 lanes (`vpmaddwd`), the query
/// widened once.
///
/// # Safety
/// The CPU must support AVX2, and `dims` must be a multiple of 16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn code_dots_avx2(codes: &[i8], dims: usize, rows: &[usize], query: &[i8]) -> Vec<i32> {
    use std::arch::x86_64::{
        __m128i, __m256i, _mm_add_epi32, _mm_cvtsi128_si32, _mm_hadd_epi32, _mm_loadu_si128, _mm256_add_epi32,
        _mm256_castsi256_si128, _mm256_cvtepi8_epi16, _mm256_extracti128_si256, _mm256_madd_epi16,
        _mm256_setzero_si256,
    };
    assert!(dims.is_multiple_of(16) && query.len() == dims);
    // SAFETY (every load below): each reads 16 bytes of a 16-byte chunk.
    let q: Vec<__m256i> = query
        .chunks_exact(16)
        .map(|c| _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(c.as_ptr().cast::<__m128i>()) }))
        .collect();
    rows.iter()
        .map(|&i| {
            let mut acc = _mm256_setzero_si256();
            for (c, q) in codes[i * dims..(i + 1) * dims].chunks_exact(16).zip(&q) {
                let r = _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(c.as_ptr().cast::<__m128i>()) });
                // Each pair sums to at most 2 x 127 x 127, a row of 384
                // codes to about 6.2M: no lane can overflow.
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(r, *q));
            }
            let half = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256::<1>(acc));
            let pairs = _mm_hadd_epi32(half, half);
            _mm_cvtsi128_si32(_mm_hadd_epi32(pairs, pairs))
        })
        .collect()
}

/// The integer dot product of two rows of codes.
fn code_dot(a: &[i8], b: &[i8]) -> i32 {
    let mut acc = [0i32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail =
        ca.remainder().iter().zip(cb.remainder()).fold(0i32, |s, (x, y)| s.wrapping_add(i32::from(*x) * i32::from(*y)));
    for (x, y) in ca.zip(cb) {
        // Wrapping adds cannot wrap (384 products of at most 127 x 127 sum
        // to about 6.2M), and they keep this loop vectorised in builds with
        // overflow checks.
        for ((s, x), y) in acc.iter_mut().zip(x).zip(y) {
            *s = s.wrapping_add(i32::from(*x) * i32::from(*y));
        }
    }
    acc.iter().fold(tail, |s, a| s.wrapping_add(*a))
}

/// One bit per dimension, set where the value is above 0.
fn signs(v: &[f32]) -> Vec<u64> {
    let mut bits = vec![0u64; words(v.len())];
    for (d, x) in v.iter().enumerate() {
        if *x > 0.0 {
            bits[d / 64] |= 1 << (d % 64);
        }
    }
    bits
}

/// The number of signs each row of `bits` disagrees on with `query`.
fn hamming(bits: &[u64], query: &[u64], out: &mut [u32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("popcnt") {
        // SAFETY: the CPU was just checked to support POPCNT.
        unsafe { hamming_popcnt(bits, query, out) };
        return;
    }
    hamming_portable(bits, query, out);
}

/// The same loop with the POPCNT instruction (picked at run time: release
/// builds target baseline x86-64, which counts bits with a dozen
/// instructions instead).
///
/// # Safety
/// The CPU must support POPCNT.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "popcnt")]
unsafe fn hamming_popcnt(bits: &[u64], query: &[u64], out: &mut [u32]) {
    hamming_portable(bits, query, out);
}

#[inline(always)]
fn hamming_portable(bits: &[u64], query: &[u64], out: &mut [u32]) {
    for (row, distance) in bits.chunks_exact(query.len()).zip(out.iter_mut()) {
        *distance = row.iter().zip(query).map(|(a, b)| (a ^ b).count_ones()).sum();
    }
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn signs_and_distances_count_every_dimension() {
        // 130 dimensions: three words, the last one partly used.
        let v: Vec<f32> = (0..130).map(|d| if d % 3 == 0 { 1.0 } else { -1.0 }).collect();
        let bits = signs(&v);
        assert_eq!(bits.len(), 3);
        assert_eq!(bits.iter().map(|w| w.count_ones()).sum::<u32>(), 44);
        let flipped: Vec<f32> = v.iter().map(|x| -x).collect();
        let rows: Vec<u64> = [signs(&v), signs(&flipped), signs(&vec![0.0; 130])].concat();
        let mut got = vec![0; 3];
        hamming(&rows, &bits, &mut got);
        assert_eq!(got, vec![0, 130, 44]);
        let mut portable = vec![0; 3];
        hamming_portable(&rows, &bits, &mut portable);
        assert_eq!(portable, got);
    }

    #[test]
    fn the_simd_code_dots_are_the_portable_ones() {
        // Codes at the extremes (-127, 127) and a spread in between.
        let dims = 384;
        let mut bits = xorshift(0x2545_f491_4f6c_dd1d);
        let mut next = move || ((bits() % 255) as i16 - 127) as i8;
        let mut codes: Vec<i8> = (0..dims * 50).map(|_| next()).collect();
        codes[..dims].fill(127);
        codes[dims..2 * dims].fill(-127);
        let query: Vec<i8> = (0..dims).map(|i| if i % 3 == 0 { 127 } else { next() }).collect();
        let rows: Vec<usize> = (0..50).rev().collect();
        let got = code_dots(&codes, dims, &rows, &query);
        let expected: Vec<i32> = rows
            .iter()
            .map(|&i| {
                codes[i * dims..(i + 1) * dims].iter().zip(&query).map(|(a, b)| i32::from(*a) * i32::from(*b)).sum()
            })
            .collect();
        assert_eq!(got, expected);
        assert_eq!(
            rows.iter().map(|&i| code_dot(&codes[i * dims..(i + 1) * dims], &query)).collect::<Vec<_>>(),
            expected
        );
    }

    #[test]
    fn nearest_ranks_by_exact_cosine_and_removal_keeps_the_rest_findable() {
        let mut index = VectorIndex::default();
        index.put("t", "a", "m", &[1.0, 0.0, 0.0], entry(1, Tier::Episodic));
        index.put("t", "a", "m", &[0.6, 0.8, 0.0], entry(2, Tier::Episodic));
        index.put("t", "a", "m", &[0.0, 0.0, 5.0], entry(3, Tier::Episodic));
        let tiers = [Tier::Episodic];
        let none = HashSet::new();
        let hits = index.nearest("t", "a", "m", &[2.0, 0.0, 0.0], &ScanFilter::all(&tiers, &none), 3);
        let ids: Vec<u128> = hits.iter().map(|h| h.id.as_u128()).collect();
        assert_eq!(ids, vec![1, 2, 3]);
        assert!((hits[0].similarity - 1.0).abs() < 1e-6);
        assert!((hits[1].similarity - 0.6).abs() < 1e-6);
        assert_eq!(hits[2].similarity, 0.0);

        index.remove("t", Uuid::from_u128(1));
        let hits = index.nearest("t", "a", "m", &[0.0, 0.0, 1.0], &ScanFilter::all(&tiers, &none), 3);
        let ids: Vec<u128> = hits.iter().map(|h| h.id.as_u128()).collect();
        assert_eq!(ids, vec![3, 2]);
        assert!((hits[0].similarity - 1.0).abs() < 1e-6);
        assert_eq!(index.len(), 2);
    }

    #[test]
    fn groups_never_mix_models_tenants_or_agents() {
        let mut index = VectorIndex::default();
        index.put("t", "a", "m1", &[1.0, 0.0], entry(1, Tier::Semantic));
        index.put("t", "a", "m2", &[1.0, 0.0], entry(2, Tier::Semantic));
        index.put("u", "a", "m1", &[1.0, 0.0], entry(3, Tier::Semantic));
        index.put("t", "b", "m1", &[1.0, 0.0], entry(4, Tier::Semantic));
        let tiers = [Tier::Semantic];
        let none = HashSet::new();
        let hits = index.nearest("t", "a", "m1", &[1.0, 0.0], &ScanFilter::all(&tiers, &none), 10);
        assert_eq!(hits.iter().map(|h| h.id.as_u128()).collect::<Vec<_>>(), vec![1]);
        // Same model name, other dimension: another group.
        assert!(index.nearest("t", "a", "m1", &[1.0, 0.0, 0.0], &ScanFilter::all(&tiers, &none), 10).is_empty());
    }

    /// A repeatable stream of pseudo-random u64s (xorshift64).
    fn xorshift(seed: u64) -> impl FnMut() -> u64 {
        let mut state = seed;
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        }
    }

    fn random_index(n: usize, dims: usize, seed: u64) -> (VectorIndex, Vec<Vec<f32>>, impl FnMut() -> f32) {
        let mut index = VectorIndex::default();
        let mut bits = xorshift(seed);
        let mut next = move || (bits() >> 11) as f32 / (1u64 << 53) as f32 - 0.5;
        let vectors: Vec<Vec<f32>> = (0..n).map(|_| (0..dims).map(|_| next()).collect()).collect();
        for (i, v) in vectors.iter().enumerate() {
            index.put("t", "a", "m", v, entry(i as u128, Tier::Episodic));
        }
        (index, vectors, next)
    }

    /// The ids of the `k` vectors nearest to `query`, by exact cosine.
    fn exact_top(vectors: &[Vec<f32>], query: &[f32], k: usize) -> Vec<u128> {
        let q = normalise(query);
        let mut exact: Vec<(f32, u128)> =
            vectors.iter().enumerate().map(|(i, v)| (dot(&normalise(v), &q), i as u128)).collect();
        exact.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        exact.into_iter().take(k).map(|(_, i)| i).collect()
    }

    #[test]
    fn a_tier_within_the_first_pass_is_ranked_exactly() {
        let (index, vectors, mut next) = random_index(FIRST_PASS_MIN, 64, 0x9e37_79b9_7f4a_7c15);
        let tiers = [Tier::Episodic];
        let none = HashSet::new();
        for _ in 0..20 {
            let query: Vec<f32> = (0..64).map(|_| next()).collect();
            let hits = index.nearest("t", "a", "m", &query, &ScanFilter::all(&tiers, &none), 10);
            let got: Vec<u128> = hits.iter().map(|h| h.id.as_u128()).collect();
            assert_eq!(got, exact_top(&vectors, &query, 10));
        }
    }

    #[test]
    fn a_larger_tier_keeps_the_true_neighbours_through_the_first_pass() {
        // Random vectors are the sign bits' worst case (no shared direction
        // to agree on): 0.93 here, against 0.996 for real embeddings at 100K
        // (`search_timing_on_a_data_directory`). A first pass that kept rows
        // at random would find 1,000 / 20,000 of them.
        let (index, vectors, mut next) = random_index(20_000, 384, 0x2545_f491_4f6c_dd1d);
        let tiers = [Tier::Episodic];
        let none = HashSet::new();
        let (mut found, mut total) = (0, 0);
        for _ in 0..20 {
            let query: Vec<f32> = (0..384).map(|_| next()).collect();
            let hits = index.nearest("t", "a", "m", &query, &ScanFilter::all(&tiers, &none), 10);
            assert_eq!(hits.len(), 10);
            assert!(hits.windows(2).all(|w| w[0].similarity >= w[1].similarity));
            let got: HashSet<u128> = hits.iter().map(|h| h.id.as_u128()).collect();
            found += exact_top(&vectors, &query, 10).iter().filter(|i| got.contains(i)).count();
            total += 10;
        }
        let recall = found as f64 / total as f64;
        assert!(recall >= 0.9, "recall@10 {recall}");
    }

    #[test]
    fn a_first_pass_in_two_halves_keeps_the_rows_of_one_pass() {
        // Two tiers and few distinct distances (16 dimensions): many ties at
        // each tier's bound, which the halves must cut as one pass would.
        let mut index = VectorIndex::default();
        let mut bits = xorshift(0x9e37_79b9_7f4a_7c15);
        for i in 0..PARALLEL_ROWS as u128 + 5_000 {
            let v: Vec<f32> = (0..16).map(|_| (bits() >> 11) as f32 / (1u64 << 53) as f32 - 0.5).collect();
            let tier = if i % 3 == 0 { Tier::Semantic } else { Tier::Episodic };
            index.put("t", "a", "m", &v, entry(i, tier));
        }
        let group = index.groups.values().next().unwrap();
        let rows = group.entries.len();
        let tiers = [Tier::Semantic, Tier::Episodic];
        let none = HashSet::new();
        let filter = ScanFilter::all(&tiers, &none);
        for _ in 0..5 {
            let query: Vec<f32> = (0..16).map(|_| (bits() >> 11) as f32 / (1u64 << 53) as f32 - 0.5).collect();
            let q_bits = signs(&normalise(&query));
            let sorted = |kept: Kept| {
                let mut rows: Vec<usize> = kept.rows().collect();
                rows.sort_unstable();
                rows
            };
            let whole = first_pass_of(group, 0..rows, &q_bits, &filter, 300);
            let halves = first_pass_in_halves(group, &q_bits, &filter, 300);
            assert_eq!(halves.len(), tiers.len());
            for (whole, halves) in whole.into_iter().zip(halves) {
                assert_eq!(sorted(whole), sorted(halves));
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn popcnt() -> bool {
        std::arch::is_x86_feature_detected!("popcnt")
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn popcnt() -> bool {
        false
    }

    /// The cost of one search's scan at the size the index is built for.
    /// Prints, asserts nothing about time. Needs this crate built as in
    /// release (optimised, no overflow checks) to mean anything:
    ///   cargo test --lib --config 'profile.dev.package.engram.opt-level=3' \
    ///     --config 'profile.dev.package.engram.overflow-checks=false' \
    ///     --config 'profile.dev.package.engram.debug-assertions=false' \
    ///     store::sqlite::vectors::tests::scan_timing -- --ignored --nocapture
    #[test]
    #[ignore = "a timing printout, not a check"]
    fn scan_timing_at_100k_vectors_of_384_dimensions() {
        let (n, dims) = (100_000, 384);
        let mut bits = xorshift(0x2545_f491_4f6c_dd1d);
        let mut next = move || (bits() >> 11) as f32 / (1u64 << 53) as f32 - 0.5;
        let mut index = VectorIndex::default();
        let tiers = [Tier::Episodic, Tier::Semantic, Tier::Procedural];
        for i in 0..n {
            let v: Vec<f32> = (0..dims).map(|_| next()).collect();
            index.put("t", "a", "m", &v, entry(i as u128, tiers[i % 3]));
        }
        let none = HashSet::new();
        let mut times = Vec::new();
        for _ in 0..50 {
            let q: Vec<f32> = (0..dims).map(|_| next()).collect();
            let started = std::time::Instant::now();
            let hits = index.nearest("t", "a", "m", &q, &ScanFilter::all(&tiers, &none), 10);
            times.push(started.elapsed().as_secs_f64() * 1e3);
            assert_eq!(hits.len(), 30);
        }
        times.sort_by(f64::total_cmp);
        println!(
            "nearest(): {n} vectors x {dims} dims, 3 tiers x top 10: median {:.2} ms, p90 {:.2} ms, min {:.2} ms, \
             popcnt {}",
            times[times.len() / 2],
            times[times.len() * 9 / 10],
            times[0],
            popcnt(),
        );
    }
}
