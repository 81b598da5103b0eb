//! What the schema promises: episodic memory in one table (and the
//! migration that made it one from monthly partitions), each tier's vectors
//! in a table partitioned by agent (and the migration that made it from the
//! memory rows), and one partial HNSW index per embedding model.

use chrono::{TimeZone, Utc};
use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::spawn_app;

#[tokio::test]
async fn episodic_memory_is_one_table_whatever_the_month() {
    let app = spawn_app().await;
    let Some(pg) = app.postgres_only("the episodic table's layout") else { return };
    let pool = pg.pool();
    let kind: String = sqlx::query_scalar("SELECT relkind::text FROM pg_class WHERE relname = 'episodic_memory'")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(kind, "r", "a plain table, not a partitioned one");
    // Only the vector tables (migration 0018) are partitioned, and their indexes with them.
    let partitions: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE c.relname !~ '^(episodic|semantic|procedural)_vectors_p[0-9]{2}'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(partitions, 0);

    // A write in a month nobody prepared for lands in the table itself.
    app.clock.set(Utc.with_ymd_and_hms(2041, 3, 15, 12, 0, 0).unwrap());
    let m = app
        .write_one(
            json!({"agent_id": "part", "tier": "episodic", "content": "from the future", "retention": "permanent"}),
        )
        .await;
    let id: uuid::Uuid = m["id"].as_str().unwrap().parse().unwrap();
    let home: String = sqlx::query_scalar("SELECT tableoid::regclass::text FROM episodic_memory WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(home, "episodic_memory");
    let (status, got) = app.get_json(&format!("/v1/memories/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(got["content"], "from the future");
}

/// Migration 0007 on a database that has monthly partitions, rows in a
/// month's partition and in DEFAULT, and a model's HNSW index: every row
/// comes across whole, every index comes back under its name, the partitions
/// and their upkeep function are gone, and the vector index finds the row.
#[tokio::test]
async fn migration_0007_moves_partitioned_episodes_into_one_table() {
    if crate::helpers::embedded() {
        eprintln!("skipped on the embedded backend: the Postgres migration 0007");
        return;
    }
    let url = crate::helpers::fresh_database().await;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let run = |sql: String| {
        let pool = pool.clone();
        async move { sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&pool).await.unwrap() }
    };
    for sql in [
        include_str!("../../migrations/0001_memory_tiers.sql"),
        include_str!("../../migrations/0002_exact_numbers.sql"),
        include_str!("../../migrations/0003_fact_provenance.sql"),
        include_str!("../../migrations/0004_retention.sql"),
        include_str!("../../migrations/0005_working_outbox.sql"),
        include_str!("../../migrations/0006_erasure_audit.sql"),
    ] {
        run(sql.to_string()).await;
    }
    run("SELECT engram_ensure_episodic_partitions('2026-05-01', 1)".into()).await;
    let hnsw = engram::store::postgres::index_name("episodic_memory", "tiny-3");
    run("INSERT INTO embedding_models (model, dimensions) VALUES ('tiny-3', 3)".into()).await;
    run(format!(
        "CREATE INDEX {hnsw} ON episodic_memory USING hnsw ((embedding::vector(3)) vector_cosine_ops) \
         WITH (m = 16, ef_construction = 200) WHERE embedding_model = 'tiny-3'"
    ))
    .await;
    // One row in May's partition with a vector, one far ahead in DEFAULT.
    run(
        "INSERT INTO episodic_memory (id, tenant_id, agent_id, user_id, content, content_hash, importance, retention, \
             embedding, embedding_model, metadata, occurred_at, created_at, updated_at, expires_at) VALUES \
         ('00000000-0000-7000-8000-000000000001', 't', 'a', 'u', 'walked the dog in May', 'h1', 0.4, 'short_term', \
             '[1,0,0]', 'tiny-3', '{\"k\": 1}', '2026-05-02', '2026-05-02', '2026-05-02', '2026-06-02'), \
         ('00000000-0000-7000-8000-000000000002', 't', 'a', NULL, 'a letter from 2041', 'h2', 0.9, 'permanent', \
             NULL, NULL, '{}', '2041-01-01', '2041-01-01', '2041-01-01', NULL)"
            .into(),
    )
    .await;
    let before: Vec<(String, String)> =
        sqlx::query_as("SELECT id::text, tableoid::regclass::text FROM episodic_memory ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(before[0].1, "episodic_memory_2026_05");
    assert_eq!(before[1].1, "episodic_memory_default");
    let snapshot = "SELECT id, tenant_id, agent_id, user_id, content, content_hash, importance, retention, \
                    embedding::text, embedding_model, metadata, occurred_at, created_at, expires_at, search_tsv::text \
                    FROM episodic_memory ORDER BY id";
    let rows_before = sqlx::query(snapshot).fetch_all(&pool).await.unwrap();

    run(include_str!("../../migrations/0007_episodic_one_table.sql").to_string()).await;

    let rows_after = sqlx::query(snapshot).fetch_all(&pool).await.unwrap();
    assert_eq!(rows_after.len(), 2);
    use sqlx::Row;
    for (b, a) in rows_before.iter().zip(&rows_after) {
        for i in 0..b.len() {
            let show = |r: &sqlx::postgres::PgRow| {
                let raw = r.try_get_raw(i).unwrap();
                if sqlx::ValueRef::is_null(&raw) { None } else { Some(raw.as_bytes().unwrap().to_vec()) }
            };
            assert_eq!(show(b), show(a), "column {i} changed");
        }
    }
    let kind: String = sqlx::query_scalar("SELECT relkind::text FROM pg_class WHERE relname = 'episodic_memory'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(kind, "r");
    let leftovers: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_class WHERE relname LIKE 'episodic\\_memory\\_%' AND relkind IN ('r', 'p')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(leftovers, 0, "no partition is left");
    let function: Option<String> = sqlx::query_scalar("SELECT to_regproc('engram_ensure_episodic_partitions')::text")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(function, None);
    let indexes: Vec<String> =
        sqlx::query_scalar("SELECT indexname::text FROM pg_indexes WHERE tablename = 'episodic_memory' ORDER BY 1")
            .fetch_all(&pool)
            .await
            .unwrap();
    let mut want = vec![
        "episodic_expires",
        "episodic_memory_pkey",
        "episodic_search_tsv",
        "episodic_tenant_agent_created",
        "episodic_tenant_agent_session",
        "episodic_tenant_created",
        "episodic_tenant_id",
        "episodic_tenant_user",
        hnsw.as_str(),
    ];
    want.sort();
    assert_eq!(indexes, want);
    let pkey: String = sqlx::query_scalar(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'episodic_memory_pkey'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(pkey, "PRIMARY KEY (id)");
    // The generated column is generated again, and the checks still hold.
    run("INSERT INTO episodic_memory (id, tenant_id, agent_id, content, content_hash, importance, retention, \
             occurred_at, created_at, updated_at) \
         VALUES ('00000000-0000-7000-8000-000000000003', 't', 'a', 'cats purr', 'h3', 0.5, 'permanent', now(), now(), now())"
        .into())
    .await;
    let tsv: String = sqlx::query_scalar("SELECT search_tsv::text FROM episodic_memory WHERE content_hash = 'h3'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(tsv.contains("'purr'"), "{tsv}");
    let refused = sqlx::raw_sql(
        "INSERT INTO episodic_memory (id, tenant_id, agent_id, content, content_hash, importance, retention, \
             occurred_at, created_at, updated_at) \
         VALUES (gen_random_uuid(), 't', 'a', 'x', 'h4', 2.0, 'permanent', now(), now(), now())",
    )
    .execute(&pool)
    .await;
    assert!(refused.is_err(), "importance 2.0 passed the check");
    // The rebuilt HNSW index answers a nearest-neighbour query.
    let mut tx = pool.begin().await.unwrap();
    sqlx::raw_sql("SET LOCAL enable_seqscan = off").execute(&mut *tx).await.unwrap();
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(
        "EXPLAIN SELECT id FROM episodic_memory WHERE embedding_model = 'tiny-3' \
         ORDER BY embedding::vector(3) <=> '[1,0.1,0]'::vector(3) LIMIT 1"
            .to_string(),
    ))
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    assert!(plan.iter().any(|l| l.contains(&hnsw)), "{plan:?}");
    let nearest: String = sqlx::query_scalar(
        "SELECT content FROM episodic_memory WHERE embedding_model = 'tiny-3' \
         ORDER BY embedding::vector(3) <=> '[1,0.1,0]'::vector(3) LIMIT 1",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(nearest, "walked the dog in May");
    tx.rollback().await.unwrap();
    pool.close().await;
    crate::helpers::drop_database(&url).await;
}

#[tokio::test]
async fn each_embedding_model_gets_a_partial_hnsw_index_per_vector_table() {
    let app = spawn_app().await;
    let Some(pg) = app.postgres_only("the HNSW index per model") else { return };
    let pool = pg.pool();
    for table in engram::store::postgres::VECTOR_TABLES {
        let name = engram::store::postgres::index_name(table, "lexical-hash-v1-384");
        let def: Option<String> = sqlx::query_scalar("SELECT indexdef FROM pg_indexes WHERE indexname = $1")
            .bind(&name)
            .fetch_optional(pool)
            .await
            .unwrap();
        let def = def.unwrap_or_else(|| panic!("index {name} missing"));
        assert!(def.contains("USING hnsw"), "{def}");
        assert!(def.contains("vector(384)"), "{def}");
        assert!(def.contains("embedding_model = 'lexical-hash-v1-384'"), "{def}");
    }
    // The memory tables have no graph of their own any more.
    let graphs: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_indexes WHERE tablename IN ('episodic_memory', 'semantic_memory', \
         'procedural_memory') AND indexdef LIKE '%USING hnsw%'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(graphs, 0);
    // A model re-registered with another size is refused.
    let err = pg.ensure_model("lexical-hash-v1-384", 512).await.unwrap_err().to_string();
    assert!(err.contains("384"), "{err}");
}

/// Migration 0018: each tier's vectors in a table hash-partitioned by tenant
/// and agent, the vector kept in the row, and equal at every moment to the
/// memory rows' vectors: written with a memory, replaced when its content
/// (and so its vector) changes, gone with it.
#[tokio::test]
async fn vector_tables_follow_the_memory_rows() {
    let app = spawn_app().await;
    let Some(pg) = app.postgres_only("the vector tables") else { return };
    let pool = pg.pool();
    for table in engram::store::postgres::VECTOR_TABLES {
        let (strategy, keys): (String, String) = sqlx::query_as(
            "SELECT p.partstrat::text, pg_get_partkeydef(p.partrelid) FROM pg_partitioned_table p \
             WHERE p.partrelid = $1::regclass",
        )
        .bind(table)
        .fetch_one(pool)
        .await
        .unwrap();
        assert_eq!((strategy.as_str(), keys.as_str()), ("h", "HASH (tenant_id, agent_id)"), "{table}");
        let storage: Vec<String> = sqlx::query_scalar(
            "SELECT a.attstorage::text FROM pg_inherits i JOIN pg_attribute a ON a.attrelid = i.inhrelid \
             WHERE i.inhparent = $1::regclass AND a.attname = 'embedding'",
        )
        .bind(table)
        .fetch_all(pool)
        .await
        .unwrap();
        assert_eq!(storage.len(), 32, "{table}: partitions");
        assert!(storage.iter().all(|s| s == "m"), "{table}: vectors kept in the row: {storage:?}");
    }
    let tenant = app.config.auth.default_tenant.clone();
    let vector_of = |table: &'static str, id: String| {
        let tenant = tenant.clone();
        async move {
            sqlx::query_as::<_, (String, String)>(sqlx::AssertSqlSafe(format!(
                "SELECT v.embedding::text, m.embedding::text FROM {table}_vectors v \
                 JOIN {table}_memory m ON m.id = v.id WHERE v.tenant_id = $1 AND v.agent_id = 'a' AND v.id = $2::uuid"
            )))
            .bind(tenant)
            .bind(id)
            .fetch_optional(pool)
            .await
            .unwrap()
        }
    };
    let written = [
        app.write_one(json!({"agent_id": "a", "tier": "episodic", "content": "The kettle whistled at noon."})).await,
        app.write_one(json!({"agent_id": "a", "tier": "semantic", "content": "Noor's kettle is blue."})).await,
        app.write_one(json!({"agent_id": "a", "skill_name": "boil-water", "content": "Fill the kettle, then boil."}))
            .await,
    ];
    for (m, table) in written.iter().zip(["episodic", "semantic", "procedural"]) {
        let id = m["id"].as_str().unwrap().to_string();
        let (v, row) = vector_of(table, id.clone()).await.unwrap_or_else(|| panic!("{table}: no vector row"));
        assert_eq!(v, row, "{table}");
        let r = app.patch(&format!("/v1/memories/{id}"), &json!({"content": "The teapot rattled at dusk."})).await;
        assert_eq!(r.status(), StatusCode::OK, "{table}: {}", r.text().await.unwrap());
        let (after, row) = vector_of(table, id.clone()).await.unwrap_or_else(|| panic!("{table}: no vector row"));
        assert_eq!(after, row, "{table}: the new vector");
        assert_ne!(after, v, "{table}: the vector changed with the content");
        let r = app.delete(&format!("/v1/memories/{id}")).await;
        assert!(r.status().is_success(), "{table}: {}", r.status());
        assert_eq!(vector_of(table, id).await, None, "{table}: the vector went with the memory");
    }
}

/// Migrations 0015 to 0017: the text leg's index is of each agent's words
/// (the index keyed by tenant, agent and words is gone) and has no pending
/// list, and pages keep room for the access counts that searches write.
/// Migration 0018 on a database that has memories: their vectors are copied
/// into the vector tables, each registered model's graph moves there, and
/// rows written after it are copied by the triggers.
#[tokio::test]
async fn migration_0018_moves_the_vectors_of_existing_memories() {
    if crate::helpers::embedded() {
        eprintln!("skipped on the embedded backend: the Postgres migration 0018");
        return;
    }
    let url = crate::helpers::fresh_database().await;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    // The migrations before 0018, from a directory holding only those.
    let before = std::env::temp_dir().join(format!("engram-migrations-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&before).unwrap();
    for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if name.as_str() < "0018" {
            std::fs::copy(&path, before.join(&name)).unwrap();
        }
    }
    sqlx::migrate::Migrator::new(before.as_path()).await.unwrap().run(&pool).await.unwrap();
    std::fs::remove_dir_all(&before).unwrap();
    let run = |sql: &'static str| {
        let pool = pool.clone();
        async move { sqlx::raw_sql(sql).execute(&pool).await.unwrap() }
    };
    run("INSERT INTO embedding_models (model, dimensions) VALUES ('tiny-3', 3)").await;
    let old_graph = engram::store::postgres::index_name("semantic_memory", "tiny-3");
    let sql = format!(
        "CREATE INDEX {old_graph} ON semantic_memory USING hnsw ((embedding::vector(3)) vector_cosine_ops) \
         WHERE embedding_model = 'tiny-3'"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&pool).await.unwrap();
    run("INSERT INTO semantic_memory (id, tenant_id, agent_id, namespace, content, content_hash, valid_from, \
             importance, retention, occurred_at, created_at, updated_at, embedding, embedding_model) VALUES \
         ('00000000-0000-7000-8000-000000000001', 't', 'a', 'agent:a', 'owls hunt at night', 'h1', now(), 0.5, \
             'permanent', now(), now(), now(), '[1,0,0]', 'tiny-3'), \
         ('00000000-0000-7000-8000-000000000002', 't', 'b', 'agent:b', 'no vector here', 'h2', now(), 0.5, \
             'permanent', now(), now(), now(), NULL, NULL)")
    .await;

    engram::store::postgres::migrate(&pool).await.unwrap();

    let copied: Vec<(String, String, String)> =
        sqlx::query_as("SELECT agent_id, id::text, embedding::text FROM semantic_vectors ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(copied, [("a".into(), "00000000-0000-7000-8000-000000000001".into(), "[1,0,0]".into())]);
    let graph = |name: String| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, Option<String>>("SELECT to_regclass($1)::text")
                .bind(name)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(graph(old_graph).await, None, "the memory table's graph is gone");
    for table in engram::store::postgres::VECTOR_TABLES {
        let name = engram::store::postgres::index_name(table, "tiny-3");
        assert_eq!(graph(name.clone()).await, Some(name), "{table}");
    }
    run("UPDATE semantic_memory SET embedding = '[0,1,0]', embedding_model = 'tiny-3' WHERE content_hash = 'h2'").await;
    let moved: Vec<(String, String)> =
        sqlx::query_as("SELECT agent_id, embedding::text FROM semantic_vectors ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(moved, [("a".into(), "[1,0,0]".into()), ("b".into(), "[0,1,0]".into())]);
    pool.close().await;
    crate::helpers::drop_database(&url).await;
}

/// A table's or index's storage options, as `name=value`.
async fn reloptions(pool: &sqlx::PgPool, name: &str) -> Vec<String> {
    let options: Option<Vec<String>> = sqlx::query_scalar("SELECT reloptions FROM pg_class WHERE oid = $1::regclass")
        .bind(name)
        .fetch_one(pool)
        .await
        .unwrap();
    options.unwrap_or_default()
}

#[tokio::test]
async fn memory_tables_index_each_agents_words_and_leave_room_on_their_pages() {
    let app = spawn_app().await;
    let Some(pg) = app.postgres_only("the memory tables' text index and fill factor") else { return };
    let pool = pg.pool();
    for (table, short) in
        [("episodic_memory", "episodic"), ("semantic_memory", "semantic"), ("procedural_memory", "procedural")]
    {
        let def: Option<String> = sqlx::query_scalar("SELECT indexdef FROM pg_indexes WHERE indexname = $1")
            .bind(format!("{short}_agent_words"))
            .fetch_optional(pool)
            .await
            .unwrap();
        let def = def.unwrap_or_else(|| panic!("{short}_agent_words missing"));
        assert!(def.contains("USING gin (engram_agent_words(tenant_id, agent_id, search_tsv))"), "{def}");
        assert_eq!(reloptions(pool, &format!("{short}_agent_words")).await, ["fastupdate=off"], "{short}_agent_words");
        let old: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
            .bind(format!("{short}_search_tsv"))
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(old, None, "{short}_search_tsv is dropped");
        assert_eq!(reloptions(pool, table).await, ["fillfactor=85"], "{table}");
    }
    // The index words are the row's lexemes under its agent's key; quotes and
    // backslashes in a lexeme survive the tsquery the search builds.
    let (key, words): (String, Vec<String>) = sqlx::query_as(
        "SELECT engram_agent_key('t', 'a'), tsvector_to_array(engram_agent_words('t', 'a', \
         array_to_tsvector(ARRAY['cat', 'it''s', 'a\\b'])))",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(key.len(), 9, "{key}");
    let mut want: Vec<String> = ["a\\b", "cat", "it's"].iter().map(|w| format!("{key}{w}")).collect();
    want.sort();
    assert_eq!(words, want);
    // Every connection of the pool plans without parallel workers.
    let workers: String = sqlx::query_scalar("SHOW max_parallel_workers_per_gather").fetch_one(pool).await.unwrap();
    assert_eq!(workers, "0");
}

#[tokio::test]
async fn migration_0002_makes_numbers_double_precision_and_recovers_what_was_written() {
    if crate::helpers::embedded() {
        eprintln!("skipped on the embedded backend: the Postgres migration 0002 (SQLite's 0003 has a store test)");
        return;
    }
    let url = crate::helpers::fresh_database().await;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let run = |sql: &'static str| {
        let pool = pool.clone();
        async move { sqlx::raw_sql(sql).execute(&pool).await.unwrap() }
    };
    run(include_str!("../../migrations/0001_memory_tiers.sql")).await;
    // A monthly partition made before the change: it must change with its parent.
    run("SELECT engram_ensure_episodic_partitions('2026-05-01', 0)").await;
    run("INSERT INTO episodic_memory (id, tenant_id, agent_id, content, content_hash, importance, retention, \
             occurred_at, created_at, updated_at) \
         VALUES (gen_random_uuid(), 't', 'a', 'e', 'h', 0.4, 'permanent', '2026-05-02', '2026-05-02', '2026-05-02')")
    .await;
    run("INSERT INTO semantic_memory (id, tenant_id, agent_id, namespace, content, content_hash, confidence, \
             valid_from, importance, retention, occurred_at, created_at, updated_at) \
         VALUES (gen_random_uuid(), 't', 'a', 'agent:a', 'f', 'h', 0.9, now(), 0.7, 'permanent', now(), now(), now())")
    .await;
    run("INSERT INTO procedural_memory (id, tenant_id, agent_id, skill_name, content, content_hash, success_count, \
             failure_count, reward_count, avg_reward, importance, retention, occurred_at, created_at, updated_at) \
         VALUES (gen_random_uuid(), 't', 'a', 's', 'p', 'h', 2, 1, 3, -0.3, 0.002877, 'permanent', now(), now(), now())")
    .await;
    let widened: f64 =
        sqlx::query_scalar("SELECT importance::float8 FROM episodic_memory").fetch_one(&pool).await.unwrap();
    assert_eq!(widened, 0.4000000059604645, "0001 stores `real`");

    run(include_str!("../../migrations/0002_exact_numbers.sql")).await;

    let types: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT table_name::text, column_name::text, data_type::text FROM information_schema.columns \
         WHERE column_name IN ('importance', 'confidence', 'avg_reward', 'success_rate') \
           AND table_schema = 'public' ORDER BY 1, 2",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(types.len(), 8, "{types:?}");
    assert!(types.iter().all(|(_, _, t)| t == "double precision"), "{types:?}");
    assert!(types.iter().any(|(t, _, _)| t == "episodic_memory_2026_05"), "{types:?}");

    let episodic: f64 = sqlx::query_scalar("SELECT importance FROM episodic_memory").fetch_one(&pool).await.unwrap();
    assert_eq!(episodic, 0.4);
    let fact: (f64, f64) =
        sqlx::query_as("SELECT importance, confidence FROM semantic_memory").fetch_one(&pool).await.unwrap();
    assert_eq!(fact, (0.7, 0.9));
    let skill: (f64, f64, f64) = sqlx::query_as("SELECT importance, avg_reward, success_rate FROM procedural_memory")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(skill, (0.002877, -0.3, 2.0 / 3.0));
    // success_rate is still generated, now in double precision.
    run("UPDATE procedural_memory SET failure_count = 2").await;
    let rate: f64 = sqlx::query_scalar("SELECT success_rate FROM procedural_memory").fetch_one(&pool).await.unwrap();
    assert_eq!(rate, 0.5);
    let index: Option<String> =
        sqlx::query_scalar("SELECT to_regclass('procedural_tenant_agent_rank')::text").fetch_one(&pool).await.unwrap();
    assert_eq!(index.as_deref(), Some("procedural_tenant_agent_rank"));
    // The default confidence is 0.7, not 0.7 rounded into `real`.
    run("INSERT INTO semantic_memory (id, tenant_id, agent_id, namespace, content, content_hash, valid_from, \
             importance, retention, occurred_at, created_at, updated_at) \
         VALUES (gen_random_uuid(), 't', 'a', 'agent:a', 'g', 'h2', now(), 0.5, 'permanent', now(), now(), now())")
    .await;
    let default: f64 = sqlx::query_scalar("SELECT confidence FROM semantic_memory WHERE content = 'g'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(default, 0.7);
    pool.close().await;
    crate::helpers::drop_database(&url).await;
}
