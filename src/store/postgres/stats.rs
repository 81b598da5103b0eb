//! What the planner's statistics tell the two recall legs about the
//! searched agent: which of a query's words the full-text leg looks for,
//! and how the vector leg reads the agent's vectors.
//!
//! Both come from the planner's statistics of the memory tables: the
//! agent's share of a table (the most common (tenant_id, agent_id) pairs of
//! the extended statistics of migration 0019; `agent_id`'s own statistics
//! would merge one agent name across tenants) and each word's share of rows
//! (`search_tsv`'s most common elements in `pg_stats`), read at most every
//! `REFRESH_EVERY` and used by every search in between.
//!
//! **Words.** The text leg finds candidates; the service then weighs every
//! candidate's words itself (`recall::TextWeights`), so the leg's one job is
//! to bring the memories that share the query's telling words, cheaply. A
//! word found in a large share of an agent's memories ("show", "study" in
//! papers; "like", "go" in chat) does neither: its matches would be
//! thousands of rows to read and rank, most of them unrelated, and the cap
//! on ranked matches (`search::MAX_TEXT_MATCHES`) then picks an arbitrary
//! few of them. So for each table the leg drops a query's most common
//! words, most common first, while the matches expected in the searched
//! agent's memories exceed `MATCH_BUDGET`, and always keeps the rarest.
//! Until a table has been analysed, and for agents and words too rare to be
//! listed there, no estimate exceeds the budget and every word is kept: a
//! small agent is searched for all its words.
//!
//! **Vectors.** Each agent's vectors of a tier lie in one of
//! `VECTOR_PARTITIONS` partitions (migration 0018), shared with the agents
//! hashed there. A walk of that partition's HNSW graph passes the other
//! agents' vectors too; comparing every vector of the agent costs in
//! proportion to the agent's size. So an agent with at least
//! `search.exact_scan_below` vectors in the tier, or holding most of its
//! partition, is walked; a smaller one is compared exactly
//! (`TableStats::vector_scan`). Where the statistics cannot tell (a table
//! not analysed yet, an unlisted agent that may be large), the statement
//! counts the agent's rows itself and takes one scan or the other.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use sqlx::PgPool;

use crate::domain::Tier;

/// Matches the leg may expect to read per table and query: ranking about
/// this many rows costs a few milliseconds.
pub const MATCH_BUDGET: f64 = 1_000.0;
/// How old the statistics may get (autovacuum re-analyses a table after a
/// tenth of it changed; sooner would only re-read the same figures).
const REFRESH_EVERY: Duration = Duration::from_secs(600);

/// Partitions of each tier's vector table (migration 0018).
pub const VECTOR_PARTITIONS: f64 = 32.0;

/// How the vector leg reads one tier's vectors of the searched agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VectorScan {
    /// A walk of the agent's partition's HNSW graph.
    Walk,
    /// Every vector of the agent compared and sorted.
    Exact,
    /// Exact when the agent has fewer vectors than this, counted by the
    /// statement on the partition's primary key; else the walk.
    Counted(u32),
}

/// What the planner's statistics say about one memory table.
#[derive(Debug, Default, Clone)]
pub struct TableStats {
    /// Rows in the table (`pg_class.reltuples`).
    pub rows: f64,
    /// Share of rows per listed (tenant, agent); an unlisted one has
    /// `agent_floor`: the rows of unlisted agents shared among them, as the
    /// planner estimates it.
    pub agents: HashMap<(String, String), f64>,
    pub agent_floor: f64,
    /// The least share of a listed agent: an unlisted one holds about as
    /// much at most.
    pub agent_ceiling: f64,
    /// Share of rows holding each listed lexeme; an unlisted one has at most `lexeme_floor`.
    pub lexemes: HashMap<String, f64>,
    pub lexeme_floor: f64,
}

impl TableStats {
    /// The lexemes to search `agent`'s rows for (see the module docs), in
    /// the order given.
    pub fn choose<'a>(&self, tenant: &str, agent: &str, lexemes: &'a [String]) -> Vec<&'a str> {
        if self.lexemes.is_empty() || lexemes.len() < 2 {
            return lexemes.iter().map(String::as_str).collect();
        }
        let agent_rows = self.rows * self.share(tenant, agent).unwrap_or(self.agent_floor);
        // An unlisted lexeme is rarer than every listed one: half the floor.
        let expected = |l: &str| agent_rows * self.lexemes.get(l).copied().unwrap_or(self.lexeme_floor / 2.0);
        let mut by_count: Vec<(f64, &str)> = lexemes.iter().map(|l| (expected(l), l.as_str())).collect();
        by_count.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
        let mut total: f64 = by_count.iter().map(|(n, _)| n).sum();
        let mut dropped = Vec::new();
        for (n, l) in &by_count[..by_count.len() - 1] {
            if total <= MATCH_BUDGET {
                break;
            }
            total -= n;
            dropped.push(*l);
        }
        lexemes.iter().map(String::as_str).filter(|l| !dropped.contains(l)).collect()
    }

    /// The listed share of rows of `agent` of `tenant`.
    pub fn share(&self, tenant: &str, agent: &str) -> Option<f64> {
        self.agents.get(&(tenant.to_string(), agent.to_string())).copied()
    }

    /// How to read `agent`'s vectors of this tier (see the module docs);
    /// `exact_below` is `search.exact_scan_below`, 0 walking always.
    pub fn vector_scan(&self, tenant: &str, agent: &str, exact_below: u32) -> VectorScan {
        let below = f64::from(exact_below);
        if exact_below == 0 {
            return VectorScan::Walk;
        }
        if self.rows <= 0.0 || self.agents.is_empty() {
            return VectorScan::Counted(exact_below);
        }
        match self.share(tenant, agent) {
            Some(share) => {
                let rows = self.rows * share;
                let partition = (self.rows - rows) / VECTOR_PARTITIONS + rows;
                // Holding most of its partition, a walk passes few other
                // agents' vectors, and costs less than comparing a few
                // thousand (bench/RESULTS.md, "Each agent's vectors in a
                // partition of their own table").
                if rows >= below || (rows >= below / 4.0 && rows >= partition / 2.0) {
                    VectorScan::Walk
                } else {
                    VectorScan::Exact
                }
            }
            // Unlisted agents are the small ones; if the least listed one
            // is not far below the threshold, an unlisted one may be above.
            None if self.rows * self.agent_ceiling < below / 2.0 => VectorScan::Exact,
            None => VectorScan::Counted(exact_below),
        }
    }
}

/// The statistics of each memory table.
pub type Snapshot = Arc<HashMap<Tier, TableStats>>;

/// The statistics of the three tables, refreshed in the background.
#[derive(Default)]
pub struct PlannerStats {
    current: RwLock<Option<(Instant, Snapshot)>>,
    refreshing: AtomicBool,
}

impl PlannerStats {
    /// The latest statistics (empty before the first read); starts a
    /// re-read when they are missing or older than `REFRESH_EVERY`, which
    /// this search does not wait for.
    pub fn get(self: &Arc<Self>, pool: &PgPool) -> Snapshot {
        let current = self.current.read().unwrap_or_else(|e| e.into_inner()).clone();
        let stale = current.as_ref().is_none_or(|(at, _)| at.elapsed() >= REFRESH_EVERY);
        if stale && !self.refreshing.swap(true, Ordering::AcqRel) {
            let (this, pool) = (self.clone(), pool.clone());
            tokio::spawn(async move {
                match read(&pool).await {
                    Ok(stats) => {
                        *this.current.write().unwrap_or_else(|e| e.into_inner()) =
                            Some((Instant::now(), Arc::new(stats)));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "reading the planner statistics; every query word is searched, agents' vectors are counted")
                    }
                }
                this.refreshing.store(false, Ordering::Release);
            });
        }
        current.map(|(_, s)| s).unwrap_or_default()
    }
}

/// The memory tables' statistics: two statements, over `pg_stats` and
/// `pg_stats_ext`.
pub async fn read(pool: &PgPool) -> sqlx::Result<HashMap<Tier, TableStats>> {
    type Row = (String, String, f64, f32, Option<Vec<String>>, Option<Vec<f32>>);
    // `most_common_elems` is `anyarray`: through text to text[]. The
    // element frequencies end with three summary figures (minimum, maximum,
    // share of empty values) after one per element.
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT s.tablename::text, s.attname::text, c.reltuples::float8, s.n_distinct, \
                s.most_common_elems::text::text[], s.most_common_elem_freqs \
         FROM pg_stats s \
         JOIN pg_class c ON c.relname = s.tablename AND c.relnamespace = s.schemaname::regnamespace \
         WHERE s.schemaname = current_schema() \
           AND s.tablename IN ('episodic_memory', 'semantic_memory', 'procedural_memory') \
           AND s.attname IN ('agent_id', 'search_tsv')",
    )
    .fetch_all(pool)
    .await?;
    // The most common (tenant, agent) pairs (migration 0019), one row each.
    let pairs: Vec<(String, String, String, f64)> = sqlx::query_as(
        "SELECT s.tablename::text, s.most_common_vals[i][array_position(s.attnames, 'tenant_id')], \
                s.most_common_vals[i][array_position(s.attnames, 'agent_id')], s.most_common_freqs[i] \
         FROM pg_stats_ext s CROSS JOIN LATERAL generate_subscripts(s.most_common_vals, 1) AS i \
         WHERE s.schemaname = current_schema() \
           AND s.tablename IN ('episodic_memory', 'semantic_memory', 'procedural_memory') \
           AND s.statistics_name = s.tablename || '_tenant_agent'",
    )
    .fetch_all(pool)
    .await?;
    let tier_of = |table: &str| match table {
        "episodic_memory" => Tier::Episodic,
        "semantic_memory" => Tier::Semantic,
        _ => Tier::Procedural,
    };
    let mut stats: HashMap<Tier, TableStats> = HashMap::new();
    let mut distinct_agents: HashMap<Tier, f64> = HashMap::new();
    for (table, column, reltuples, n_distinct, values, freqs) in rows {
        let tier = tier_of(&table);
        let s = stats.entry(tier).or_default();
        s.rows = reltuples.max(0.0);
        if column == "agent_id" {
            // n_distinct < 0 is minus the share of rows with distinct values.
            let n = if n_distinct < 0.0 { -f64::from(n_distinct) * s.rows } else { f64::from(n_distinct) };
            distinct_agents.insert(tier, n);
            continue;
        }
        let (Some(values), Some(freqs)) = (values, freqs) else { continue };
        let lexemes: HashMap<String, f64> = values.into_iter().zip(freqs.iter().map(|f| f64::from(*f))).collect();
        s.lexeme_floor = least(lexemes.values());
        s.lexemes = lexemes;
    }
    for (table, tenant, agent, freq) in pairs {
        stats.entry(tier_of(&table)).or_default().agents.insert((tenant, agent), freq);
    }
    for (tier, s) in &mut stats {
        if s.agents.is_empty() {
            continue;
        }
        s.agent_ceiling = least(s.agents.values());
        // At least as many (tenant, agent) pairs as agent names.
        let distinct = distinct_agents.get(tier).copied().unwrap_or(0.0);
        let unlisted_rows = (1.0 - s.agents.values().sum::<f64>()).max(0.0);
        let unlisted_agents = (distinct - s.agents.len() as f64).max(1.0);
        s.agent_floor = (unlisted_rows / unlisted_agents).min(s.agent_ceiling);
    }
    Ok(stats)
}

/// The least of some shares (0 for none).
fn least<'a>(shares: impl Iterator<Item = &'a f64>) -> f64 {
    let least = shares.copied().fold(f64::INFINITY, f64::min);
    if least.is_finite() { least } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats() -> TableStats {
        TableStats {
            rows: 700_000.0,
            agents: [(("t".to_string(), "big".to_string()), 0.1)].into(),
            agent_floor: 0.0001,
            agent_ceiling: 0.1,
            lexemes: [("show", 0.078), ("induct", 0.013), ("properti", 0.011), ("dimension", 0.0035)]
                .into_iter()
                .map(|(l, f)| (l.to_string(), f))
                .collect(),
            lexeme_floor: 0.003,
        }
    }

    fn words(ws: &[&str]) -> Vec<String> {
        ws.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn a_large_agent_drops_the_common_words_first() {
        let q = words(&["0", "dimension", "biomateri", "show", "induct", "properti"]);
        // 70K rows: show ≈ 5,460 matches, induct ≈ 910, properti ≈ 770, the rest ≈ 100–250.
        assert_eq!(stats().choose("t", "big", &q), vec!["0", "dimension", "biomateri"]);
    }

    #[test]
    fn a_small_agent_keeps_every_word() {
        let q = words(&["0", "dimension", "biomateri", "show", "induct", "properti"]);
        assert_eq!(stats().choose("t", "small", &q), q.iter().map(String::as_str).collect::<Vec<_>>());
    }

    #[test]
    fn the_rarest_word_always_stays() {
        let q = words(&["show", "induct"]);
        assert_eq!(stats().choose("t", "big", &q), vec!["induct"]);
        assert_eq!(stats().choose("t", "big", &words(&["show"])), vec!["show"]);
    }

    /// `read` on a real Postgres: a schema of its own holding an
    /// `episodic_memory` table with the columns and statistics it reads,
    /// analysed.
    #[tokio::test]
    async fn reads_agent_and_word_shares_from_the_planner_statistics() {
        let Ok(url) = std::env::var("ENGRAM_TEST_DATABASE_URL") else {
            eprintln!("ENGRAM_TEST_DATABASE_URL is not set: skipped (scripts/test.sh sets it)");
            return;
        };
        let schema = format!("text_stats_{}", uuid::Uuid::new_v4().simple());
        let setup = format!("CREATE SCHEMA {schema}; SET search_path = {schema}");
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .after_connect(move |conn, _| {
                let setup = setup.clone();
                Box::pin(async move {
                    sqlx::raw_sql(sqlx::AssertSqlSafe(setup)).execute(conn).await?;
                    Ok(())
                })
            })
            .connect(&url)
            .await
            .expect("connecting to ENGRAM_TEST_DATABASE_URL");
        // 3,000 rows of tenant t1: agent "big" has 2,400 of them; every row
        // says "coffee", one row in ten "espresso", one "Lisbon". And 100 rows
        // of an agent "big" of tenant t2, about tea.
        sqlx::raw_sql(
            "CREATE TABLE episodic_memory (tenant_id text NOT NULL, agent_id text NOT NULL, \
                 search_tsv tsvector NOT NULL); \
             CREATE STATISTICS episodic_memory_tenant_agent (mcv) ON tenant_id, agent_id FROM episodic_memory; \
             INSERT INTO episodic_memory \
             SELECT 't1', CASE WHEN i % 5 = 0 THEN 'small-' || i ELSE 'big' END, \
                    to_tsvector('english', 'coffee order ' || i \
                        || CASE WHEN i % 10 = 0 THEN ' espresso' ELSE '' END \
                        || CASE WHEN i = 7 THEN ' Lisbon' ELSE '' END) \
             FROM generate_series(1, 3000) AS i; \
             INSERT INTO episodic_memory SELECT 't2', 'big', to_tsvector('english', 'tea order ' || i) \
             FROM generate_series(1, 100) AS i; \
             ANALYZE episodic_memory",
        )
        .execute(&pool)
        .await
        .unwrap();
        let stats = read(&pool).await.unwrap();
        let s = &stats[&Tier::Episodic];
        assert_eq!(s.rows, 3100.0);
        let share = |t, a| s.share(t, a).unwrap_or(f64::NAN);
        assert!((share("t1", "big") - 2400.0 / 3100.0).abs() < 0.01, "{:?}", s.agents);
        assert!((share("t2", "big") - 100.0 / 3100.0).abs() < 0.01, "{:?}", s.agents);
        assert!((s.lexemes["coffe"] - 3000.0 / 3100.0).abs() < 0.01, "{:?}", s.lexemes.get("coffe"));
        assert!((s.lexemes["espresso"] - 0.1).abs() < 0.02, "{:?}", s.lexemes.get("espresso"));
        // 2,300 expected matches for "coffe" in t1's big's rows: it goes, the
        // rarer words stay; t2's big and the small ones keep every word.
        let q = words(&["coffe", "espresso", "lisbon"]);
        assert_eq!(s.choose("t1", "big", &q), vec!["espresso", "lisbon"]);
        assert_eq!(s.choose("t2", "big", &q), vec!["coffe", "espresso", "lisbon"]);
        assert_eq!(s.choose("t1", "small-5", &q), vec!["coffe", "espresso", "lisbon"]);
        // t1's big holds most of its partition: walked; t2's is small. The
        // sample was the whole table, so the list goes on with agents of one
        // row, and an unlisted one holds no more.
        assert_eq!(s.vector_scan("t1", "big", 5_000), VectorScan::Walk);
        assert_eq!(s.vector_scan("t2", "big", 5_000), VectorScan::Exact);
        assert!((s.agent_ceiling - 1.0 / 3100.0).abs() < 1e-6, "{}", s.agent_ceiling);
        assert_eq!(s.vector_scan("t1", "small-5", 5_000), VectorScan::Exact);
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE"))).execute(&pool).await.unwrap();
    }

    /// One million rows, as the scale benchmark's episodic table might hold them.
    fn million() -> TableStats {
        TableStats {
            rows: 1_000_000.0,
            agents: [("a", 0.07), ("b", 0.007), ("c", 0.003)]
                .into_iter()
                .map(|(a, f)| (("t".to_string(), a.to_string()), f))
                .collect(),
            agent_floor: 0.0001,
            agent_ceiling: 0.001,
            ..TableStats::default()
        }
    }

    #[test]
    fn large_agents_are_walked_and_small_ones_compared() {
        let s = million();
        assert_eq!(s.vector_scan("t", "a", 5_000), VectorScan::Walk);
        assert_eq!(s.vector_scan("t", "b", 5_000), VectorScan::Walk);
        // 3,000 rows among some 34,000 in its partition.
        assert_eq!(s.vector_scan("t", "c", 5_000), VectorScan::Exact);
        // Unlisted: at most about 1,000 rows.
        assert_eq!(s.vector_scan("t", "tiny", 5_000), VectorScan::Exact);
        // 0 walks always.
        assert_eq!(s.vector_scan("t", "tiny", 0), VectorScan::Walk);
    }

    #[test]
    fn an_agent_holding_most_of_its_partition_is_walked() {
        // 4,000 of 100,000 rows: its partition holds about 3,000 others.
        let s =
            TableStats { rows: 100_000.0, agents: [(("t".to_string(), "a".to_string()), 0.04)].into(), ..million() };
        assert_eq!(s.vector_scan("t", "a", 5_000), VectorScan::Walk);
        // The same 4,000 among 31,000 others of a million rows: compared.
        let s = TableStats { agents: [(("t".to_string(), "a".to_string()), 0.004)].into(), ..million() };
        assert_eq!(s.vector_scan("t", "a", 5_000), VectorScan::Exact);
    }

    #[test]
    fn without_statistics_the_statement_counts() {
        assert_eq!(TableStats::default().vector_scan("t", "a", 5_000), VectorScan::Counted(5_000));
        // The least listed agent holds 4,000 rows: an unlisted one may hold more than 2,500.
        let s = TableStats { agent_ceiling: 0.004, ..million() };
        assert_eq!(s.vector_scan("t", "tiny", 5_000), VectorScan::Counted(5_000));
    }

    #[test]
    fn no_statistics_keep_every_word() {
        let q = words(&["show", "induct"]);
        assert_eq!(TableStats::default().choose("t", "big", &q), vec!["show", "induct"]);
    }
}
