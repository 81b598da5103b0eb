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
