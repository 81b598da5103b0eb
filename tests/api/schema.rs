//! What the schema promises: monthly partitions (with rows rescued from the
//! DEFAULT partition), and one partial HNSW index per embedding model.

use chrono::{Duration, TimeZone, Utc};
use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::spawn_app;

#[tokio::test]
async fn episodes_land_in_monthly_partitions_and_late_partitions_adopt_default_rows() {
    let app = spawn_app().await;
    let Some(pg) = app.postgres_only("monthly partitioning") else { return };
    let pool = pg.pool();
    let now = app.clock.now_plus(Duration::zero());
    // Startup created this month's partition and the configured months ahead.
    let this_month = format!("episodic_memory_{}", now.format("%Y_%m"));
    let exists: Option<String> =
        sqlx::query_scalar("SELECT to_regclass($1)::text").bind(&this_month).fetch_one(pool).await.unwrap();
    assert_eq!(exists.as_deref(), Some(this_month.as_str()));

    // A write in a month far beyond the partitions lands in DEFAULT ...
    let far = Utc.with_ymd_and_hms(2041, 3, 15, 12, 0, 0).unwrap();
    app.clock.set(far);
    let m = app
        .write_one(
            json!({"agent_id": "part", "tier": "episodic", "content": "from the future", "retention": "permanent"}),
        )
        .await;
    let id: uuid::Uuid = m["id"].as_str().unwrap().parse().unwrap();
    let home = || async {
        sqlx::query_scalar::<_, String>("SELECT tableoid::regclass::text FROM episodic_memory WHERE id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap()
    };
    let before = home().await;
    assert!(before == "episodic_memory_default" || before == "episodic_memory_2041_03", "{before}");
    // ... and moves into its month when that partition is created.
    pg.ensure_partitions(far, 0).await.unwrap();
    assert_eq!(home().await, "episodic_memory_2041_03");
    let (status, got) = app.get_json(&format!("/v1/memories/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(got["content"], "from the future");
}

#[tokio::test]
async fn each_embedding_model_gets_a_partial_hnsw_index_per_table() {
    let app = spawn_app().await;
    let Some(pg) = app.postgres_only("the HNSW index per model") else { return };
    let pool = pg.pool();
    for table in ["episodic_memory", "semantic_memory", "procedural_memory"] {
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
    // A model re-registered with another size is refused.
    let err = pg.ensure_model("lexical-hash-v1-384", 512).await.unwrap_err().to_string();
    assert!(err.contains("384"), "{err}");
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
