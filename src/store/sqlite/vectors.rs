//! The in-process vector index of the SQLite backend: an exhaustive scan, no
//! graph, rebuilt from the `memories` table at open and kept in step by the
//! writers after each commit.
//!
//! Vectors are grouped by (tenant, agent, model, dimensions): a search only
//! ever reads the group of its agent and its query's model, so vectors of two
//! models are never compared, and one group's vectors sit back to back in
//! memory. Each group holds two copies:
//!   * `codes`: every vector quantised to i8 with its own scale. The scan
//!     reads these, a quarter of the bytes of f32: at 100K x 384 the f32 scan
//!     is bound by memory bandwidth (about 150 MB per query), the i8 scan
//!     is not.
//!   * `vectors`: the L2-normalised f32s. The best candidates of the scan
//!     (several times the number wanted) are rescored exactly from these, so
//!     the similarities returned are exact cosines, and the order is exact
//!     unless quantisation moved a vector across that wide margin.
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
    pub user_id: Option<Box<str>>,
    /// Microseconds since the epoch, as stored.
    pub occurred_at: i64,
    pub expires_at: Option<i64>,
}

impl Entry {
    pub fn of(m: &Memory) -> Entry {
        Entry {
            id: m.id,
            tier: m.tier,
            valid: m.valid_until.is_none(),
            user_id: m.user_id.as_deref().map(Into::into),
            occurred_at: m.occurred_at.timestamp_micros(),
            expires_at: m.expires_at.map(|t| t.timestamp_micros()),
        }
    }
}

#[derive(Default)]
struct Group {
    /// Normalised f32s, `dims` per entry, in entry order.
    vectors: Vec<f32>,
    /// i8 codes, `dims` per entry, in entry order.
    codes: Vec<i8>,
    /// Per entry: the f32 value of one code step.
    scales: Vec<f32>,
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
}

impl ScanFilter<'_> {
    pub fn admits(&self, e: &Entry) -> bool {
        self.tiers.contains(&e.tier)
            && (e.valid || e.tier != Tier::Semantic)
            && e.expires_at.is_none_or(|t| t > self.now)
            && self.user_id.is_none_or(|u| e.user_id.as_deref() == Some(u))
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
        type LoadRow = (String, String, String, Uuid, String, Option<String>, i64, Option<i64>, bool, Vec<u8>);
        let mut index = VectorIndex::default();
        let mut rows = sqlx::query_as::<_, LoadRow>(
            "select tenant_id, agent_id, embedding_model, id, tier, user_id, occurred_at, expires_at, \
             valid_until is null, embedding from memories where embedding is not null order by seq",
        )
        .fetch(pool);
        while let Some((tenant, agent, model, id, tier, user_id, occurred_at, expires_at, valid, blob)) =
            rows.try_next().await?
        {
            let Some(tier) = Tier::parse(&tier) else { continue };
            let vector = decode_vector(&blob).map_err(|e| sqlx::Error::Decode(e.to_string().into()))?;
            let entry = Entry { id, tier, valid, user_id: user_id.map(Into::into), occurred_at, expires_at };
            index.put(&tenant, &agent, &model, &vector, entry);
        }
        Ok(index)
    }

    /// How many vectors the index holds.
    pub fn len(&self) -> usize {
        self.locations.len()
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
        let (normalised, codes, scale) = prepare(vector);
        group.slots.insert(entry.id, group.entries.len());
        self.locations.insert((tenant.to_string(), entry.id), key);
        group.vectors.extend_from_slice(&normalised);
        group.codes.extend_from_slice(&codes);
        group.scales.push(scale);
        group.entries.push(entry);
    }

    /// Updates the filter fields of an entry that keeps its vector.
    pub fn refresh(&mut self, tenant: &str, entry: Entry) {
        let Some(key) = self.locations.get(&(tenant.to_string(), entry.id)) else { return };
        if let Some(group) = self.groups.get_mut(key)
            && let Some(&slot) = group.slots.get(&entry.id)
        {
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
        let dims = key.dims;
        let last = group.entries.len() - 1;
        if slot != last {
            group.vectors.copy_within(last * dims..(last + 1) * dims, slot * dims);
            group.codes.copy_within(last * dims..(last + 1) * dims, slot * dims);
            group.scales[slot] = group.scales[last];
            group.entries.swap(slot, last);
            group.slots.insert(group.entries[slot].id, slot);
        }
        group.vectors.truncate(last * dims);
        group.codes.truncate(last * dims);
        group.scales.truncate(last);
        group.entries.truncate(last);
        if group.entries.is_empty() {
            self.groups.remove(&key);
        }
    }

    /// The `want` nearest admitted vectors of each tier, best first, with
    /// exact cosines.
    pub fn nearest(
        &self,
        tenant: &str,
        agent: &str,
        model: &str,
        query: &[f32],
        filter: &ScanFilter<'_>,
        want: usize,
    ) -> Vec<Scored> {
        let key = GroupKey { tenant: tenant.into(), agent: agent.into(), model: model.into(), dims: query.len() };
        let Some(group) = self.groups.get(&key) else { return Vec::new() };
        if want == 0 {
            return Vec::new();
        }
        let dims = key.dims;
        let (q, q_codes, _) = prepare(query);
        let mut approx = vec![0i32; group.entries.len()];
        scan(&group.codes, &q_codes, dims, &mut approx);

        // One pass sorts the admitted entries into their tier's candidates.
        let mut by_tier: Vec<Vec<(f32, usize)>> = vec![Vec::new(); filter.tiers.len()];
        for (i, e) in group.entries.iter().enumerate() {
            if let Some(t) = filter.tiers.iter().position(|t| *t == e.tier)
                && filter.admits(e)
            {
                by_tier[t].push((approx[i] as f32 * group.scales[i], i));
            }
        }
        let mut out = Vec::new();
        for (&tier, mut candidates) in filter.tiers.iter().zip(by_tier) {
            // Rescore a wide margin exactly: quantisation error is a few
            // thousandths of cosine, far below the gap this margin spans.
            let margin = (want * 4).max(want + 64);
            if candidates.len() > margin {
                candidates.select_nth_unstable_by(margin - 1, |a, b| b.0.total_cmp(&a.0));
                candidates.truncate(margin);
            }
            let mut exact: Vec<Scored> = candidates
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

    /// The normalised vectors of the given memories that have one of
    /// `model` with `dims` dimensions (unit length: a dot product is their
    /// cosine).
    pub fn normalised(&self, tenant: &str, model: &str, dims: usize, ids: &[Uuid]) -> HashMap<Uuid, Vec<f32>> {
        let mut out = HashMap::with_capacity(ids.len());
        for id in ids {
            let Some(key) = self.locations.get(&(tenant.to_string(), *id)) else { continue };
            if key.model != model || key.dims != dims {
                continue;
            }
            if let Some(group) = self.groups.get(key)
                && let Some(&slot) = group.slots.get(id)
            {
                out.insert(*id, group.vectors[slot * dims..(slot + 1) * dims].to_vec());
            }
        }
        out
    }

    /// How many vectors one group holds (tests and benchmarks).
    pub fn group_len(&self, tenant: &str, agent: &str, model: &str, dims: usize) -> usize {
        let key = GroupKey { tenant: tenant.into(), agent: agent.into(), model: model.into(), dims };
        self.groups.get(&key).map_or(0, |g| g.entries.len())
    }
}

/// The L2-normalised copy of a vector, its i8 codes and the value of one
/// code step. A zero vector stays zero (its cosine to anything is 0).
fn prepare(v: &[f32]) -> (Vec<f32>, Vec<i8>, f32) {
    let norm = v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
    let normalised: Vec<f32> =
        if norm > 0.0 { v.iter().map(|x| (f64::from(*x) / norm) as f32).collect() } else { vec![0.0; v.len()] };
    let max = normalised.iter().fold(0f32, |m, x| m.max(x.abs()));
    if max == 0.0 {
        return (normalised, vec![0; v.len()], 0.0);
    }
    let step = max / 127.0;
    let codes = normalised.iter().map(|x| (x / step).round().clamp(-127.0, 127.0) as i8).collect();
    (normalised, codes, step)
}

/// The integer dot product of the query's codes with every row of `codes`.
fn scan(codes: &[i8], query: &[i8], dims: usize, out: &mut [i32]) {
    #[cfg(target_arch = "x86_64")]
    if dims.is_multiple_of(16) && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU was just checked to support AVX2.
        unsafe { scan_avx2(codes, query, dims, out) };
        return;
    }
    scan_portable(codes, query, dims, out);
}

/// The scan in AVX2 (picked at run time: release builds target baseline
/// x86-64, which has only SSE2): 16 codes at a time widened to i16 and
/// multiplied pairwise into i32 lanes (`vpmaddwd`), the query widened once.
/// What the compiler made of the portable loop multiplied 8 i32 lanes at a
/// time, about three times the instructions per row.
///
/// # Safety
/// The CPU must support AVX2, and `dims` must be a multiple of 16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scan_avx2(codes: &[i8], query: &[i8], dims: usize, out: &mut [i32]) {
    use std::arch::x86_64::{
        __m128i, __m256i, _mm_add_epi32, _mm_cvtsi128_si32, _mm_hadd_epi32, _mm_loadu_si128, _mm256_add_epi32,
        _mm256_castsi256_si128, _mm256_cvtepi8_epi16, _mm256_extracti128_si256, _mm256_madd_epi16,
        _mm256_setzero_si256,
    };
    assert!(dims.is_multiple_of(16) && query.len() == dims);
    // SAFETY (every load below): each reads 16 bytes at an offset that is a
    // multiple of 16 below `dims`, inside a slice of exactly `dims` bytes.
    let q: Vec<__m256i> = query
        .chunks_exact(16)
        .map(|c| _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(c.as_ptr().cast::<__m128i>()) }))
        .collect();
    for (row, score) in codes.chunks_exact(dims).zip(out.iter_mut()) {
        let mut acc = _mm256_setzero_si256();
        for (c, q) in row.chunks_exact(16).zip(&q) {
            let r = _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(c.as_ptr().cast::<__m128i>()) });
            // Each pair sums to at most 2 x 127 x 127, and a row of 384
            // codes to about 6.2M: no lane can overflow.
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(r, *q));
        }
        let half = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256::<1>(acc));
        let pairs = _mm_hadd_epi32(half, half);
        *score = _mm_cvtsi128_si32(_mm_hadd_epi32(pairs, pairs));
    }
}

#[inline(always)]
fn scan_portable(codes: &[i8], query: &[i8], dims: usize, out: &mut [i32]) {
    for (row, score) in codes.chunks_exact(dims).zip(out.iter_mut()) {
        let mut acc = [0i32; 32];
        let (cr, cq) = (row.chunks_exact(32), query.chunks_exact(32));
        let tail = cr
            .remainder()
            .iter()
            .zip(cq.remainder())
            .fold(0i32, |s, (x, y)| s.wrapping_add(i32::from(*x) * i32::from(*y)));
        for (x, y) in cr.zip(cq) {
            // Wrapping adds cannot wrap (384 products of at most 127 x 127 sum
            // to about 6.2M), and they keep this loop vectorised in builds
            // with overflow checks, where a checked add per element is not.
            for ((a, x), y) in acc.iter_mut().zip(x).zip(y) {
                *a = a.wrapping_add(i32::from(*x) * i32::from(*y));
            }
        }
        *score = acc.iter().fold(tail, |s, a| s.wrapping_add(*a));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u128, tier: Tier) -> Entry {
        Entry { id: Uuid::from_u128(id), tier, valid: true, user_id: None, occurred_at: 0, expires_at: None }
    }

    fn all<'a>(tiers: &'a [Tier], seen: &'a HashSet<Uuid>) -> ScanFilter<'a> {
        ScanFilter { tiers, user_id: None, since: None, until: None, now: 0, seen }
    }

    #[test]
    fn the_simd_scan_computes_the_portable_dot_products() {
        // Codes at the extremes (-127, 127) and a spread in between.
        let dims = 384;
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state % 255) as i16 - 127) as i8
        };
        let mut codes: Vec<i8> = (0..dims * 50).map(|_| next()).collect();
        codes[..dims].fill(127);
        codes[dims..2 * dims].fill(-127);
        let query: Vec<i8> = (0..dims).map(|i| if i % 3 == 0 { 127 } else { next() }).collect();
        let mut expected = vec![0; 50];
        scan_portable(&codes, &query, dims, &mut expected);
        let mut got = vec![0; 50];
        scan(&codes, &query, dims, &mut got);
        assert_eq!(got, expected);
        let direct: i32 = codes[..dims].iter().zip(&query).map(|(a, b)| i32::from(*a) * i32::from(*b)).sum();
        assert_eq!(got[0], direct);
    }

    #[test]
    fn nearest_ranks_by_exact_cosine_and_removal_keeps_the_rest_findable() {
        let mut index = VectorIndex::default();
        index.put("t", "a", "m", &[1.0, 0.0, 0.0], entry(1, Tier::Episodic));
        index.put("t", "a", "m", &[0.6, 0.8, 0.0], entry(2, Tier::Episodic));
        index.put("t", "a", "m", &[0.0, 0.0, 5.0], entry(3, Tier::Episodic));
        let tiers = [Tier::Episodic];
        let none = HashSet::new();
        let hits = index.nearest("t", "a", "m", &[2.0, 0.0, 0.0], &all(&tiers, &none), 3);
        let ids: Vec<u128> = hits.iter().map(|h| h.id.as_u128()).collect();
        assert_eq!(ids, vec![1, 2, 3]);
        assert!((hits[0].similarity - 1.0).abs() < 1e-6);
        assert!((hits[1].similarity - 0.6).abs() < 1e-6);
        assert_eq!(hits[2].similarity, 0.0);

        index.remove("t", Uuid::from_u128(1));
        let hits = index.nearest("t", "a", "m", &[0.0, 0.0, 1.0], &all(&tiers, &none), 3);
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
        let hits = index.nearest("t", "a", "m1", &[1.0, 0.0], &all(&tiers, &none), 10);
        assert_eq!(hits.iter().map(|h| h.id.as_u128()).collect::<Vec<_>>(), vec![1]);
        // Same model name, other dimension: another group.
        assert!(index.nearest("t", "a", "m1", &[1.0, 0.0, 0.0], &all(&tiers, &none), 10).is_empty());
    }

    #[test]
    fn quantised_scan_agrees_with_exact_order_on_random_vectors() {
        let mut index = VectorIndex::default();
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f32 / (1u64 << 53) as f32 - 0.5
        };
        let dims = 64;
        let vectors: Vec<Vec<f32>> = (0..2_000).map(|_| (0..dims).map(|_| next()).collect()).collect();
        for (i, v) in vectors.iter().enumerate() {
            index.put("t", "a", "m", v, entry(i as u128, Tier::Episodic));
        }
        let query: Vec<f32> = (0..dims).map(|_| next()).collect();
        let (q, _, _) = prepare(&query);
        let mut exact: Vec<(f32, u128)> =
            vectors.iter().enumerate().map(|(i, v)| (dot(&prepare(v).0, &q), i as u128)).collect();
        exact.sort_by(|a, b| b.0.total_cmp(&a.0));
        let tiers = [Tier::Episodic];
        let none = HashSet::new();
        let hits = index.nearest("t", "a", "m", &query, &all(&tiers, &none), 10);
        let got: Vec<u128> = hits.iter().map(|h| h.id.as_u128()).collect();
        let want: Vec<u128> = exact.iter().take(10).map(|(_, i)| *i).collect();
        assert_eq!(got, want);
    }

    #[cfg(target_arch = "x86_64")]
    fn avx2() -> bool {
        std::arch::is_x86_feature_detected!("avx2")
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn avx2() -> bool {
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
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f32 / (1u64 << 53) as f32 - 0.5
        };
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
            let hits = index.nearest("t", "a", "m", &q, &all(&tiers, &none), 10);
            times.push(started.elapsed().as_secs_f64() * 1e3);
            assert_eq!(hits.len(), 30);
        }
        times.sort_by(f64::total_cmp);
        println!(
            "nearest(): {n} vectors x {dims} dims, 3 tiers x top 10: median {:.2} ms, p90 {:.2} ms, min {:.2} ms, \
             avx2 {}",
            times[times.len() / 2],
            times[times.len() * 9 / 10],
            times[0],
            avx2(),
        );
    }
}
