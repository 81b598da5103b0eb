//! The benchmark's data set: 200K memories of one tenant, one agent with
//! 100K and ten with 10K each, 70/25/4/1 % episodic/semantic/procedural/working;
//! with `--tiny-agents N` also N agents of `--tiny-agent-memories` each (the
//! many small agents of a production tenant: 9,989 × 80 makes 1M memories
//! over 10K agents).
//!
//! The persistent tiers go straight into Postgres with multi-row
//! `INSERT … SELECT FROM UNNEST(…)`, every NOT NULL column filled the way the
//! server fills it (content hash, retention and its expiry, namespace,
//! unique skill names, a vector of the server's embedder for every row), and
//! `created_at` spread over seven months. The HNSW indexes are dropped before and rebuilt after a load
//! (an HNSW insert per row would take far longer than one build), through
//! `PgStore::ensure_model`, the server's own code. Working memory goes in
//! through the HTTP API, since it lives in Redis.
//!
//! A loaded database is reused when every agent's row counts match, so runs
//! after the first start measuring within a minute.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration as StdDuration, Instant};

use anyhow::{Context, bail};
use chrono::{DateTime, Duration, Utc};
use engram::config::RedisConfig;
use engram::domain::content::content_hash;
use engram::domain::memory::namespace;
use engram::domain::{Retention, Tier};
use engram::embed::{Embedder, Lane};
use engram::store::WorkingMemory;
use engram::store::postgres::{PgStore, VECTOR_TABLES, index_name};
use engram::store::redis::RedisStore;
use futures::{StreamExt, TryStreamExt};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

pub const AGENT_A: &str = "agent-a";
pub const SMALL_AGENT: &str = "agent-b01";
/// Tiny agents are `agent-t00001`, `agent-t00002`, ...; reported as one group.
pub const TINY_PREFIX: &str = "agent-t";
pub const TINY_GROUP: &str = "agent-t* (tiny)";
const AGENT_A_MEMORIES: usize = 100_000;
const SMALL_AGENTS: usize = 10;
const SMALL_AGENT_MEMORIES: usize = 10_000;
/// `created_at` goes back this far (about seven months).
const SPAN_DAYS: i64 = 205;
/// Rows per INSERT statement.
const BATCH_ROWS: usize = 1_000;
/// INSERT statements in flight (the machine has two cores, shared with the server).
const INSERTS_IN_FLIGHT: usize = 2;
/// The server's default `redis.working_max_entries`: a session keeps its newest 500.
pub const WORKING_CAP: usize = 500;
/// Working-memory writes per HTTP request (the API's batch limit).
const WORKING_BATCH: usize = 500;
const TABLES: [(Tier, &str); 3] =
    [(Tier::Episodic, "episodic_memory"), (Tier::Semantic, "semantic_memory"), (Tier::Procedural, "procedural_memory")];

pub fn session_of(agent: &str) -> String {
    format!("session-{agent}")
}

/// One planned memory: its agent, tier and text.
pub struct Planned {
    pub agent: String,
    pub tier: Tier,
    pub text: String,
}

/// The agents beyond agent A and the ten small ones.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub tiny_agents: usize,
    pub tiny_memories: usize,
}

/// The report group of an agent: tiny agents are one row.
pub fn group(agent: &str) -> &str {
    if agent.starts_with(TINY_PREFIX) { TINY_GROUP } else { agent }
}

pub fn tiny_agent(k: usize) -> String {
    format!("{TINY_PREFIX}{:05}", k + 1)
}

/// Every memory of the data set, in a fixed order (the same on every run).
pub fn plan(texts: &[String], shape: Shape) -> anyhow::Result<Vec<Planned>> {
    if texts.len() < AGENT_A_MEMORIES + SMALL_AGENT_MEMORIES {
        bail!("only {} distinct texts; agent A alone needs {AGENT_A_MEMORIES}", texts.len());
    }
    let mut order: Vec<usize> = (0..texts.len()).collect();
    order.shuffle(&mut StdRng::seed_from_u64(0x5c1f));
    let mut agents = vec![(AGENT_A.to_string(), AGENT_A_MEMORIES, 0usize)];
    for k in 0..SMALL_AGENTS {
        // Small agents take the texts after A's, wrapping around: some
        // memories of different agents share a text, as when several agents
        // read the same paper. Within one agent every text is distinct.
        agents.push((
            format!("agent-b{:02}", k + 1),
            SMALL_AGENT_MEMORIES,
            AGENT_A_MEMORIES + k * SMALL_AGENT_MEMORIES,
        ));
    }
    for k in 0..shape.tiny_agents {
        agents.push((tiny_agent(k), shape.tiny_memories, AGENT_A_MEMORIES + k * shape.tiny_memories));
    }
    let mut planned = Vec::with_capacity(agents.iter().map(|(_, n, _)| n).sum());
    for (k, (agent, n, offset)) in agents.into_iter().enumerate() {
        let mut tiers = Vec::with_capacity(n);
        tiers.extend(std::iter::repeat_n(Tier::Working, n / 100));
        tiers.extend(std::iter::repeat_n(Tier::Procedural, n * 4 / 100));
        tiers.extend(std::iter::repeat_n(Tier::Semantic, n * 25 / 100));
        tiers.extend(std::iter::repeat_n(Tier::Episodic, n - tiers.len()));
        tiers.shuffle(&mut StdRng::seed_from_u64(k as u64 + 1));
        for (j, tier) in tiers.into_iter().enumerate() {
            let text = texts[order[(offset + j) % order.len()]].clone();
            planned.push(Planned { agent: agent.clone(), tier, text });
        }
    }
    Ok(planned)
}

/// (tier, agent) → memories planned.
fn expected_counts(planned: &[Planned]) -> BTreeMap<(Tier, String), i64> {
    let mut counts = BTreeMap::new();
    for p in planned.iter().filter(|p| p.tier != Tier::Working) {
        *counts.entry((p.tier, p.agent.clone())).or_insert(0) += 1;
    }
    counts
}

/// (tier, agent) → (rows that a search can find, all rows) of the tenant.
async fn stored_counts(
    pool: &PgPool,
    tenant: &str,
    model: &str,
) -> anyhow::Result<BTreeMap<(Tier, String), (i64, i64)>> {
    let mut counts = BTreeMap::new();
    for (tier, table) in TABLES {
        let valid = if tier == Tier::Semantic { " AND valid_until IS NULL" } else { "" };
        let sql = format!(
            "SELECT agent_id, count(*) FILTER (WHERE embedding_model = $2 AND (expires_at IS NULL OR expires_at > now()){valid}), \
             count(*) FROM {table} WHERE tenant_id = $1 GROUP BY agent_id"
        );
        let rows: Vec<(String, i64, i64)> =
            sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(tenant).bind(model).fetch_all(pool).await?;
        for (agent, live, all) in rows {
            counts.insert((tier, agent), (live, all));
        }
    }
    Ok(counts)
}

pub struct Row {
    pub id: Uuid,
    pub agent: String,
    pub content: String,
    pub hash: String,
    pub importance: f64,
    pub retention: Retention,
    pub occurred_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub event_type: &'static str,
    pub outcome: Option<&'static str>,
    pub session_id: String,
    pub skill_name: String,
    pub success_count: i32,
    pub failure_count: i32,
}

pub fn rows_of(planned: &[Planned], tier: Tier, now: DateTime<Utc>) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(match tier {
        Tier::Episodic => 11,
        Tier::Semantic => 12,
        _ => 13,
    });
    let mut per_agent: BTreeMap<&str, usize> = BTreeMap::new();
    planned
        .iter()
        .filter(|p| p.tier == tier)
        .map(|p| {
            let seq = per_agent.entry(&p.agent).or_insert(0);
            *seq += 1;
            let created_at = now - Duration::seconds(rng.random_range(3_600..SPAN_DAYS * 86_400));
            let occurred_at = created_at - Duration::seconds(rng.random_range(0..900));
            let retention = match tier {
                // Retentions whose expiry is after the run: the test set spans
                // seven months, and expired rows would simply not count.
                Tier::Episodic if rng.random_bool(0.15) => Retention::Permanent,
                Tier::Episodic => Retention::LongTerm,
                Tier::Semantic if rng.random_bool(0.10) => Retention::Permanent,
                Tier::Semantic => Retention::LongTerm,
                _ => Retention::Permanent,
            };
            let (event_type, outcome) = match rng.random_range(0..20) {
                0..=13 => ("conversation", None),
                14..=16 => ("observation", None),
                17..=18 => ("action", Some(if rng.random_bool(0.8) { "success" } else { "failure" })),
                _ => ("outcome", Some(if rng.random_bool(0.7) { "success" } else { "partial" })),
            };
            let slug: Vec<String> = p
                .text
                .split(|c: char| !c.is_alphanumeric())
                .filter(|w| !w.is_empty())
                .take(4)
                .map(str::to_lowercase)
                .collect();
            let ts = uuid::Timestamp::from_unix(
                uuid::NoContext,
                created_at.timestamp() as u64,
                created_at.timestamp_subsec_nanos(),
            );
            Row {
                id: Uuid::new_v7(ts),
                agent: p.agent.clone(),
                content: p.text.clone(),
                hash: content_hash(&p.text),
                importance: (f64::from(rng.random_range(0.2f32..0.9)) * 100.0).round() / 100.0,
                retention,
                occurred_at,
                created_at,
                expires_at: engram::domain::RetentionPolicy::default().expires_at(retention, created_at),
                event_type,
                outcome,
                session_id: format!("s-{}-{}", p.agent, created_at.format("%Y%m%d")),
                skill_name: format!("{}-{}", slug.join("-"), seq),
                success_count: rng.random_range(0..40),
                failure_count: rng.random_range(0..10),
            }
        })
        .collect()
}

/// The UNNEST columns every tier shares, $3 to $12; each tier's own follow from $13.
const COMMON_ARRAYS: &str = "$3::uuid[], $4::text[], $5::text[], $6::text[], $7::float8[], $8::vector[], $9::text[], \
    $10::timestamptz[], $11::timestamptz[], $12::timestamptz[]";
const COMMON_NAMES: &str =
    "id, agent_id, content, content_hash, importance, embedding, retention, occurred_at, created_at, expires_at";

fn insert_sql(tier: Tier) -> String {
    let (insert, select, arrays, names) = match tier {
        Tier::Episodic => (
            "INSERT INTO episodic_memory (id, tenant_id, agent_id, content, content_hash, importance, embedding, \
                 embedding_model, retention, occurred_at, created_at, updated_at, expires_at, session_id, event_type, outcome)",
            "u.session_id, u.event_type, u.outcome",
            "$13::text[], $14::text[], $15::text[]",
            "session_id, event_type, outcome",
        ),
        Tier::Semantic => (
            "INSERT INTO semantic_memory (id, tenant_id, agent_id, content, content_hash, importance, embedding, \
                 embedding_model, retention, occurred_at, created_at, updated_at, expires_at, namespace, confidence, \
                 valid_from)",
            "u.namespace, 0.7, u.created_at",
            "$13::text[]",
            "namespace",
        ),
        Tier::Procedural => (
            "INSERT INTO procedural_memory (id, tenant_id, agent_id, content, content_hash, importance, embedding, \
                 embedding_model, retention, occurred_at, created_at, updated_at, expires_at, skill_name, success_count, \
                 failure_count)",
            "u.skill_name, u.success_count, u.failure_count",
            "$13::text[], $14::int4[], $15::int4[]",
            "skill_name, success_count, failure_count",
        ),
        Tier::Working => unreachable!("working memory goes in through the API"),
    };
    format!(
        "{insert} SELECT u.id, $1, u.agent_id, u.content, u.content_hash, u.importance, u.embedding, $2, u.retention, \
             u.occurred_at, u.created_at, u.created_at, u.expires_at, {select} \
         FROM UNNEST({COMMON_ARRAYS}, {arrays}) AS u({COMMON_NAMES}, {names})"
    )
}

async fn insert_batch(
    pool: &PgPool,
    tenant: &str,
    tier: Tier,
    rows: &[Row],
    model: &str,
    vectors: &HashMap<String, pgvector::Vector>,
) -> anyhow::Result<u64> {
    let vectors: Vec<pgvector::Vector> = rows
        .iter()
        .map(|r| vectors.get(&r.hash).cloned().context("a text without a vector"))
        .collect::<anyhow::Result<_>>()?;
    let sql = insert_sql(tier);
    let q = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(tenant)
        .bind(model)
        .bind(rows.iter().map(|r| r.id).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.agent.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.content.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.hash.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.importance).collect::<Vec<_>>())
        .bind(vectors)
        .bind(rows.iter().map(|r| r.retention.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.occurred_at).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.created_at).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.expires_at).collect::<Vec<_>>());
    let q = match tier {
        Tier::Episodic => q
            .bind(rows.iter().map(|r| r.session_id.as_str()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.event_type).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.outcome).collect::<Vec<_>>()),
        Tier::Semantic => q.bind(rows.iter().map(|r| namespace(&r.agent, None)).collect::<Vec<_>>()),
        Tier::Procedural => q
            .bind(rows.iter().map(|r| r.skill_name.as_str()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.success_count).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.failure_count).collect::<Vec<_>>()),
        Tier::Working => unreachable!("working memory goes in through the API"),
    };
    Ok(q.execute(pool).await.context("bulk insert")?.rows_affected())
}

/// Loads the persistent tiers unless the database already holds exactly the
/// planned rows; makes sure the HNSW indexes exist; ANALYZEs.
pub async fn ensure_persistent(
    pool: &PgPool,
    database_url: &str,
    tenant: &str,
    planned: &[Planned],
    embedder: &dyn Embedder,
    embed_at_most: usize,
) -> anyhow::Result<()> {
    let model = embedder.model_id().to_string();
    let expected = expected_counts(planned);
    let total: i64 = expected.values().sum();
    let stored = stored_counts(pool, tenant, &model).await?;
    let reuse = stored.len() == expected.len() && expected.iter().all(|(k, n)| stored.get(k) == Some(&(*n, *n)));
    if reuse {
        eprintln!("load: reusing the loaded database: {total} persistent memories of tenant {tenant:?} match the plan");
        // Every search counts an access to what it returns, and frequency is a
        // score component: start each run from the loaded state.
        let mut reset = 0;
        for (_, table) in TABLES {
            let sql = format!(
                "UPDATE {table} SET access_count = 0, last_accessed_at = NULL WHERE tenant_id = $1 AND access_count > 0"
            );
            reset += sqlx::query(sqlx::AssertSqlSafe(sql)).bind(tenant).execute(pool).await?.rows_affected();
        }
        eprintln!("load: access counts of {reset} memories (from earlier runs) reset to 0");
    } else {
        if !stored.is_empty() {
            let db: String = sqlx::query_scalar("SELECT current_database()").fetch_one(pool).await?;
            let held: i64 = stored.values().map(|(_, all)| all).sum();
            // Only ever empty this benchmark's own database.
            if !db.starts_with("engram_bench_recall") {
                bail!(
                    "database {db} holds {held} rows of tenant {tenant:?} that do not match the plan; refusing to empty it"
                );
            }
            eprintln!("load: {db} holds {held} rows of tenant {tenant:?} that do not match the plan; emptying it");
            sqlx::raw_sql("TRUNCATE episodic_memory, semantic_memory, procedural_memory").execute(pool).await?;
        }
        load_persistent(pool, tenant, planned, embedder, embed_at_most).await?;
    }
    ensure_indexes(database_url, &model).await?;
    let started = Instant::now();
    let analyze = if reuse { "ANALYZE" } else { "VACUUM (ANALYZE)" };
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("{analyze} episodic_memory, semantic_memory, procedural_memory")))
        .execute(pool)
        .await
        .context("analyzing the tables")?;
    eprintln!("load: {analyze} of the three tables took {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

async fn load_persistent(
    pool: &PgPool,
    tenant: &str,
    planned: &[Planned],
    embedder: &dyn Embedder,
    embed_at_most: usize,
) -> anyhow::Result<()> {
    let model = embedder.model_id().to_string();
    let vectors = cached_vectors(pool, planned, embedder, embed_at_most).await?;
    let now = Utc::now();
    for table in VECTOR_TABLES {
        let name = index_name(table, &model);
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP INDEX IF EXISTS {name}"))).execute(pool).await?;
    }
    eprintln!("load: HNSW indexes dropped for the bulk load; they are rebuilt after it");

    let started = Instant::now();
    for (tier, table) in TABLES {
        let rows = rows_of(planned, tier, now);
        let t0 = Instant::now();
        let mut done = 0usize;
        let mut last_report = Instant::now();
        // A bar on a terminal; elsewhere a line every 10 s.
        let bar = engram::progress::items(&format!("load: {table}"), Some(rows.len() as u64));
        let mut inserts = futures::stream::iter(rows.chunks(BATCH_ROWS))
            .map(|chunk| insert_batch(pool, tenant, tier, chunk, &model, &vectors))
            .buffer_unordered(INSERTS_IN_FLIGHT);
        while let Some(n) = inserts.try_next().await? {
            done += n as usize;
            bar.inc(n);
            if bar.is_hidden() && (last_report.elapsed() >= StdDuration::from_secs(10) || done == rows.len()) {
                last_report = Instant::now();
                eprintln!(
                    "load: {table} {done}/{} rows ({:.0} rows/s)",
                    rows.len(),
                    done as f64 / t0.elapsed().as_secs_f64()
                );
            }
        }
        bar.finish_and_clear();
    }
    eprintln!("load: persistent tiers loaded in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Texts embedded per call; the embedder splits them into forward passes.
const EMBED_BATCH: usize = 256;

/// A vector for every distinct persistent text (by content hash), from the
/// cache table `bench_vector_cache` (model, content hash) where present, else
/// embedded now and added to it, so an interrupted load resumes and a reload
/// after a plan change costs no model time.
///
/// With `embed_at_most` > 0 only that many distinct texts have real vectors
/// (those cached, then the first by content hash); every other text gets a
/// synthetic one (`synthetic_vector`), which keeps a 1M-memory load within
/// minutes of model time on two cores. Such a data set measures latency, not
/// relevance.
async fn cached_vectors(
    pool: &PgPool,
    planned: &[Planned],
    embedder: &dyn Embedder,
    embed_at_most: usize,
) -> anyhow::Result<HashMap<String, pgvector::Vector>> {
    let model = embedder.model_id();
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS bench_vector_cache (model text NOT NULL, content_hash text NOT NULL, \
         embedding vector NOT NULL, PRIMARY KEY (model, content_hash))",
    )
    .execute(pool)
    .await?;
    let mut texts: HashMap<String, &str> = HashMap::new();
    for p in planned.iter().filter(|p| p.tier != Tier::Working) {
        texts.entry(content_hash(&p.text)).or_insert(&p.text);
    }
    let cached: Vec<(String, pgvector::Vector)> =
        sqlx::query_as("SELECT content_hash, embedding FROM bench_vector_cache WHERE model = $1")
            .bind(model)
            .fetch_all(pool)
            .await?;
    let mut vectors: HashMap<String, pgvector::Vector> =
        cached.into_iter().filter(|(h, _)| texts.contains_key(h)).collect();
    // Shortest first: a forward pass pads to its longest text.
    let mut missing: Vec<(&String, &str)> =
        texts.iter().filter(|(h, _)| !vectors.contains_key(*h)).map(|(h, t)| (h, *t)).collect();
    let mut synthetic: Vec<&String> = Vec::new();
    if embed_at_most > 0 {
        let budget = embed_at_most.saturating_sub(vectors.len());
        missing.sort_by_key(|(h, _)| *h);
        synthetic = missing.iter().skip(budget).map(|(h, _)| *h).collect();
        missing.truncate(budget);
    }
    missing.sort_by_key(|(h, t)| (t.len(), *h));
    eprintln!(
        "load: {} distinct texts, {} vectors from the cache (model {model}), {} to embed",
        texts.len(),
        vectors.len(),
        missing.len()
    );
    let started = Instant::now();
    let mut last_report = Instant::now();
    let mut done = 0usize;
    for chunk in missing.chunks(EMBED_BATCH) {
        let batch: Vec<String> = chunk.iter().map(|(_, t)| t.to_string()).collect();
        let embedded = embedder.embed_in(&batch, Lane::Background).await.context("embedding the data set")?;
        let hashes: Vec<&str> = chunk.iter().map(|(h, _)| h.as_str()).collect();
        let embedded: Vec<pgvector::Vector> = embedded.into_iter().map(pgvector::Vector::from).collect();
        sqlx::query(
            "INSERT INTO bench_vector_cache SELECT $1, h, e FROM UNNEST($2::text[], $3::vector[]) AS u(h, e) \
             ON CONFLICT DO NOTHING",
        )
        .bind(model)
        .bind(&hashes)
        .bind(&embedded)
        .execute(pool)
        .await?;
        for (h, v) in hashes.into_iter().zip(embedded) {
            vectors.insert(h.to_string(), v);
        }
        done += chunk.len();
        if last_report.elapsed() >= StdDuration::from_secs(30) || done == missing.len() {
            last_report = Instant::now();
            let rate = done as f64 / started.elapsed().as_secs_f64();
            eprintln!(
                "load: embedded {done}/{} ({rate:.0} texts/s, about {:.0} min left)",
                missing.len(),
                (missing.len() - done) as f64 / rate / 60.0
            );
        }
    }
    if !synthetic.is_empty() {
        let mut base: Vec<(&String, &pgvector::Vector)> = vectors.iter().collect();
        base.sort_by_key(|(h, _)| *h);
        let base: Vec<Vec<f32>> = base.into_iter().map(|(_, v)| v.to_vec()).collect();
        eprintln!(
            "load: {} texts get synthetic vectors derived from the {} real ones (--embed-at-most)",
            synthetic.len(),
            base.len()
        );
        let made: Vec<(String, pgvector::Vector)> =
            synthetic.into_iter().map(|h| (h.clone(), synthetic_vector(h, &base).into())).collect();
        vectors.extend(made);
    }
    Ok(vectors)
}

/// A unit vector for a text without a real one: two real vectors picked by
/// its content hash, mixed 1 : 0.5, plus uniform noise (σ ≈ 0.02 per
/// dimension, seeded by the hash), normalised. The vectors of a data set
/// then spread over the model's space as real ones do instead of piling up
/// on the base texts, so the HNSW graph is walked as on real data.
fn synthetic_vector(hash: &str, base: &[Vec<f32>]) -> Vec<f32> {
    let seed = u64::from_str_radix(&hash[..16], 16).unwrap_or(0);
    let mut rng = StdRng::seed_from_u64(seed);
    let a = &base[rng.random_range(0..base.len())];
    let b = &base[rng.random_range(0..base.len())];
    let mut v: Vec<f32> = a.iter().zip(b).map(|(x, y)| x + 0.5 * y + rng.random_range(-0.035f32..0.035)).collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(f32::MIN_POSITIVE);
    v.iter_mut().for_each(|x| *x /= norm);
    v
}

/// Builds whatever HNSW index is missing with the server's own
/// `ensure_model`, on a connection with room to build in memory, then checks
/// that every vector table has one.
async fn ensure_indexes(database_url: &str, model: &str) -> anyhow::Result<()> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::raw_sql("SET maintenance_work_mem = '4GB'; SET max_parallel_maintenance_workers = 1")
                    .execute(conn)
                    .await?;
                Ok(())
            })
        })
        .connect(database_url)
        .await
        .context("connecting to build indexes")?;
    let started = Instant::now();
    PgStore::new(pool.clone(), 24).ensure_model(model, 384).await.context("ensure_model")?;
    let took = started.elapsed().as_secs_f64();
    if took > 1.0 {
        eprintln!("load: HNSW indexes built in {took:.0} s");
    }
    let missing: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_class c \
         WHERE c.relkind = 'p' AND c.relnamespace = current_schema()::regnamespace \
           AND c.relname IN ('episodic_vectors', 'semantic_vectors', 'procedural_vectors') \
           AND NOT EXISTS (SELECT 1 FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid \
                           JOIN pg_am am ON am.oid = ic.relam \
                           WHERE i.indrelid = c.oid AND am.amname = 'hnsw' \
                             AND pg_get_expr(i.indpred, i.indrelid) LIKE '%' || $1 || '%') \
         ORDER BY 1",
    )
    .bind(model)
    .fetch_all(&pool)
    .await?;
    if !missing.is_empty() {
        bail!("no HNSW index for {model} on: {}", missing.join(", "));
    }
    let (count, bytes): (i64, i64) = sqlx::query_as(
        "SELECT count(*), coalesce(sum(pg_relation_size(i.indexrelid)), 0)::int8 FROM pg_index i \
         JOIN pg_class ic ON ic.oid = i.indexrelid JOIN pg_am am ON am.oid = ic.relam WHERE am.amname = 'hnsw'",
    )
    .fetch_one(&pool)
    .await?;
    eprintln!("load: {count} HNSW indexes, {:.0} MiB", bytes as f64 / 1048576.0);
    pool.close().await;
    Ok(())
}

/// Entries of an agent's session, read with the server's own Redis code.
/// (Not through `GET /v1/memories`: its cursor drops the sub-microsecond part
/// of `created_at`, which working entries keep, so every page after the first
/// comes back empty.)
async fn count_working(redis: &RedisStore, tenant: &str, agent: &str) -> anyhow::Result<usize> {
    Ok(WorkingMemory::session(redis, tenant, agent, &session_of(agent)).await?.len())
}

/// Connects to the server's Redis with its key prefix.
pub async fn connect_redis(url: &str, key_prefix: &str) -> anyhow::Result<RedisStore> {
    let config = RedisConfig { url: url.to_string(), key_prefix: key_prefix.to_string(), ..RedisConfig::default() };
    let redis = RedisStore::connect(&config).context("connecting to Redis")?;
    for attempt in 0.. {
        match WorkingMemory::ping(&redis).await {
            Ok(()) => break,
            Err(e) if attempt >= 50 => return Err(e).context("Redis does not answer"),
            Err(_) => tokio::time::sleep(StdDuration::from_millis(100)).await,
        }
    }
    Ok(redis)
}

/// Working memory (1 %) through `POST /v1/memories`, one session per agent;
/// a session keeps its newest WORKING_CAP entries. Skipped for an agent
/// whose session is already full (entries live 24 h, retention `session`).
pub async fn ensure_working(
    client: &reqwest::Client,
    base: &str,
    redis: &RedisStore,
    tenant: &str,
    planned: &[Planned],
) -> anyhow::Result<()> {
    let mut by_agent: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for p in planned.iter().filter(|p| p.tier == Tier::Working) {
        by_agent.entry(&p.agent).or_default().push(&p.text);
    }
    let (mut posted, mut reused) = (0, 0);
    for (agent, texts) in &by_agent {
        let want = texts.len().min(WORKING_CAP);
        let have = count_working(redis, tenant, agent).await?;
        if have >= want {
            reused += 1;
            continue;
        }
        let session = session_of(agent);
        for chunk in texts.chunks(WORKING_BATCH) {
            let memories: Vec<Value> = chunk
                .iter()
                .map(|t| json!({"agent_id": agent, "tier": "working", "session_id": session, "content": t}))
                .collect();
            let r = client.post(format!("{base}/v1/memories")).json(&json!({ "memories": memories })).send().await?;
            let status = r.status();
            if status != reqwest::StatusCode::CREATED {
                bail!("writing working memory of {agent}: {status} {}", r.text().await.unwrap_or_default());
            }
            posted += chunk.len();
        }
        let have = count_working(redis, tenant, agent).await?;
        if have < want {
            bail!("{agent}'s session holds {have} working memories after writing {}; expected {want}", texts.len());
        }
    }
    eprintln!(
        "load: working memory: {posted} entries written through the API; {reused} of {} sessions reused \
         (a session keeps its newest {WORKING_CAP})",
        by_agent.len()
    );
    Ok(())
}
