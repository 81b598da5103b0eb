//! Which of a query's words the full-text leg looks for.
//!
//! The text leg finds candidates; the service then weighs every candidate's
//! words itself (`recall::TextWeights`), so the leg's one job is to bring the
//! memories that share the query's telling words, cheaply. A word found in a
//! large share of an agent's memories ("show", "study" in papers; "like",
//! "go" in chat) does neither: its matches would be thousands of rows to
//! read and rank, most of them unrelated, and the cap on ranked matches
//! (`search::MAX_TEXT_MATCHES`) then picks an arbitrary few of them.
//!
//! So for each table the leg drops a query's most common words, most common
//! first, while the matches expected in the searched agent's memories exceed
//! `MATCH_BUDGET`, and always keeps the rarest. Expected matches come from
//! the planner's statistics: the agent's share of the table (`agent_id`'s
//! most common values) times the word's share of rows (`search_tsv`'s most
//! common elements), both from `pg_stats`, read at most every
//! `REFRESH_EVERY` and used by every search in between. Until a table has
//! been analysed, and for agents and words too rare to be listed there, no
//! estimate exceeds the budget and every word is kept: a small agent is
//! searched for all its words, as before.

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

/// What `pg_stats` says about one memory table.
#[derive(Debug, Default, Clone)]
pub struct TableStats {
    /// Rows in the table (`pg_class.reltuples`).
    pub rows: f64,
    /// Share of rows per listed agent; an unlisted one has `agent_floor`:
    /// the rows of unlisted agents shared among them, as the planner
    /// estimates it.
    pub agents: HashMap<String, f64>,
    pub agent_floor: f64,
    /// Share of rows holding each listed lexeme; an unlisted one has at most `lexeme_floor`.
    pub lexemes: HashMap<String, f64>,
    pub lexeme_floor: f64,
}

impl TableStats {
    /// The lexemes to search `agent`'s rows for (see the module docs), in
    /// the order given.
    pub fn choose<'a>(&self, agent: &str, lexemes: &'a [String]) -> Vec<&'a str> {
        if self.lexemes.is_empty() || lexemes.len() < 2 {
            return lexemes.iter().map(String::as_str).collect();
        }
        let agent_rows = self.rows * self.agents.get(agent).copied().unwrap_or(self.agent_floor);
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
}

/// The statistics of each memory table.
pub type Snapshot = Arc<HashMap<Tier, TableStats>>;

/// The statistics of the three tables, refreshed in the background.
#[derive(Default)]
pub struct TextStats {
    current: RwLock<Option<(Instant, Snapshot)>>,
    refreshing: AtomicBool,
}

impl TextStats {
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
                        tracing::warn!(error = %e, "reading the full-text statistics; every query word is searched")
                    }
                }
                this.refreshing.store(false, Ordering::Release);
            });
        }
        current.map(|(_, s)| s).unwrap_or_default()
    }
}

/// One statement over `pg_stats` for the three tables.
async fn read(pool: &PgPool) -> sqlx::Result<HashMap<Tier, TableStats>> {
    type Row = (String, String, f64, f32, Option<Vec<String>>, Option<Vec<f32>>);
    // `most_common_vals` / `most_common_elems` are `anyarray`: through text
    // to text[]. The element frequencies end with three summary figures
    // (minimum, maximum, share of empty values) after one per element.
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT s.tablename::text, s.attname::text, c.reltuples::float8, s.n_distinct, \
                CASE WHEN s.attname = 'agent_id' THEN s.most_common_vals::text::text[] \
                     ELSE s.most_common_elems::text::text[] END, \
                CASE WHEN s.attname = 'agent_id' THEN s.most_common_freqs \
                     ELSE s.most_common_elem_freqs END \
         FROM pg_stats s \
         JOIN pg_class c ON c.relname = s.tablename AND c.relnamespace = s.schemaname::regnamespace \
         WHERE s.schemaname = current_schema() \
           AND s.tablename IN ('episodic_memory', 'semantic_memory', 'procedural_memory') \
           AND s.attname IN ('agent_id', 'search_tsv')",
    )
    .fetch_all(pool)
    .await?;
    let mut stats: HashMap<Tier, TableStats> = HashMap::new();
    for (table, column, reltuples, n_distinct, values, freqs) in rows {
        let tier = match table.as_str() {
            "episodic_memory" => Tier::Episodic,
            "semantic_memory" => Tier::Semantic,
            _ => Tier::Procedural,
        };
        let (Some(values), Some(freqs)) = (values, freqs) else { continue };
        let s = stats.entry(tier).or_default();
        s.rows = reltuples.max(0.0);
        let pairs: HashMap<String, f64> = values.into_iter().zip(freqs.iter().map(|f| f64::from(*f))).collect();
        let floor = pairs.values().copied().fold(f64::INFINITY, f64::min);
        let floor = if floor.is_finite() { floor } else { 0.0 };
        if column == "agent_id" {
            // n_distinct < 0 is minus the share of rows with distinct values.
            let distinct = if n_distinct < 0.0 { -f64::from(n_distinct) * s.rows } else { f64::from(n_distinct) };
            let unlisted_rows = (1.0 - pairs.values().sum::<f64>()).max(0.0);
            let unlisted_agents = (distinct - pairs.len() as f64).max(1.0);
            s.agent_floor = (unlisted_rows / unlisted_agents).min(floor);
            s.agents = pairs;
        } else {
            (s.lexemes, s.lexeme_floor) = (pairs, floor);
        }
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats() -> TableStats {
        TableStats {
            rows: 700_000.0,
            agents: [("big".to_string(), 0.1)].into(),
            agent_floor: 0.0001,
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
        assert_eq!(stats().choose("big", &q), vec!["0", "dimension", "biomateri"]);
    }

    #[test]
    fn a_small_agent_keeps_every_word() {
        let q = words(&["0", "dimension", "biomateri", "show", "induct", "properti"]);
        assert_eq!(stats().choose("small", &q), q.iter().map(String::as_str).collect::<Vec<_>>());
    }

    #[test]
    fn the_rarest_word_always_stays() {
        let q = words(&["show", "induct"]);
        assert_eq!(stats().choose("big", &q), vec!["induct"]);
        assert_eq!(stats().choose("big", &words(&["show"])), vec!["show"]);
    }

    /// `read` on a real Postgres: a schema of its own holding an
    /// `episodic_memory` table with the two columns it reads, analysed.
    #[tokio::test]
    async fn reads_agent_and_word_shares_from_pg_stats() {
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
        // 3,000 rows: agent "big" has 2,400 of them; every row says "coffee",
        // one row in ten "espresso", one "Lisbon".
        sqlx::raw_sql(
            "CREATE TABLE episodic_memory (agent_id text NOT NULL, search_tsv tsvector NOT NULL); \
             INSERT INTO episodic_memory \
             SELECT CASE WHEN i % 5 = 0 THEN 'small-' || i ELSE 'big' END, \
                    to_tsvector('english', 'coffee order ' || i \
                        || CASE WHEN i % 10 = 0 THEN ' espresso' ELSE '' END \
                        || CASE WHEN i = 7 THEN ' Lisbon' ELSE '' END) \
             FROM generate_series(1, 3000) AS i; \
             ANALYZE episodic_memory",
        )
        .execute(&pool)
        .await
        .unwrap();
        let stats = read(&pool).await.unwrap();
        let s = &stats[&Tier::Episodic];
        assert_eq!(s.rows, 3000.0);
        assert!((s.agents["big"] - 0.8).abs() < 0.01, "{:?}", s.agents.get("big"));
        assert!((s.lexemes["coffe"] - 1.0).abs() < 0.01, "{:?}", s.lexemes.get("coffe"));
        assert!((s.lexemes["espresso"] - 0.1).abs() < 0.02, "{:?}", s.lexemes.get("espresso"));
        // 2,400 expected matches for "coffe" in big's rows: it goes, the rarer words stay.
        let q = words(&["coffe", "espresso", "lisbon"]);
        assert_eq!(s.choose("big", &q), vec!["espresso", "lisbon"]);
        assert_eq!(s.choose("small-5", &q), vec!["coffe", "espresso", "lisbon"]);
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE"))).execute(&pool).await.unwrap();
    }

    #[test]
    fn no_statistics_keep_every_word() {
        let q = words(&["show", "induct"]);
        assert_eq!(TableStats::default().choose("big", &q), vec!["show", "induct"]);
    }
}
