//! Changing the embedding model: vectors of two models are never compared,
//! and stored memories move to the new model in the background. Two real
//! 384-dimensional models, so a dimension check alone could not pass this.

use engram::config::{EmbeddingProvider, OpenAiConfig};
use engram::domain::Tier;
use engram::jobs::reembed::Reembed;
use engram::store::SearchQuery;
use serde_json::json;

use crate::helpers::{drop_database, fresh_database, spawn_app_with, use_local_model};

fn e5_config() -> OpenAiConfig {
    OpenAiConfig {
        base_url: std::env::var("ENGRAM_TEST_EMBEDDINGS_URL")
            .expect("ENGRAM_TEST_EMBEDDINGS_URL is not set: run the tests with scripts/test.sh"),
        model: std::env::var("ENGRAM_TEST_EMBEDDINGS_MODEL").unwrap_or_else(|_| "multilingual-e5-small-q4".into()),
        dimensions: 384,
        ..OpenAiConfig::default()
    }
}

#[tokio::test]
async fn a_model_change_reembeds_in_the_background_and_never_mixes_vector_spaces() {
    // Re-embedding works on whole tables, so this test has a database of its own.
    let db = fresh_database().await;
    // The first server embeds with the bundled all-MiniLM-L6-v2 (384-d).
    let old = spawn_app_with(|c| {
        use_local_model(c);
        c.database.url = db.clone();
        c.embedding.reembed_batch = 0;
    })
    .await;
    let tenant = old.config.auth.default_tenant.clone();
    for text in
        ["The user adopted a cat named Miso", "Flight to Lisbon booked for June", "The user is learning Portuguese"]
    {
        old.write_one(json!({"agent_id": "m", "tier": "episodic", "content": text})).await;
    }
    old.write_one(json!({"agent_id": "m", "tier": "semantic", "content": "The user's cat is called Miso"})).await;

    // The second server is configured with e5 (also 384-d); its background job is off so the test can step it.
    let new = spawn_app_with(|c| {
        c.auth.default_tenant = tenant.clone();
        c.database.url = db.clone();
        c.embedding.provider = EmbeddingProvider::Openai;
        c.embedding.openai = e5_config();
        c.embedding.reembed_batch = 0;
    })
    .await;
    new.write_one(json!({"agent_id": "m", "tier": "episodic", "content": "The user's cat Miso likes tuna"})).await;
    let minilm = engram::embed::from_config(&old.config.embedding).unwrap().unwrap();
    assert_eq!(minilm.dimensions(), 384);
    let embedder = engram::embed::from_config(&new.config.embedding).unwrap().unwrap();
    let model = embedder.model_id().to_string();
    let vector = embedder.embed(&["what is the cat called".to_string()]).await.unwrap().pop().unwrap();
    let query = SearchQuery {
        agent_id: "m".into(),
        user_id: None,
        tiers: vec![Tier::Episodic, Tier::Semantic, Tier::Procedural],
        text: "what is the cat called".into(),
        vector: Some(engram::store::Embedding { model: model.clone(), vector }),
        metadata: vec![],
        since: None,
        until: None,
        per_leg: 50,
        include_candidates: false,
        as_of: None,
        valid_at: None,
    };
    let now = chrono::Utc::now();

    // Before re-embedding: only the e5 memory is compared by vector; the
    // MiniLM ones are still found, by full text, with no similarity.
    let hits = new.store.search(&tenant, &query, now).await.unwrap();
    let by_vector: Vec<&str> =
        hits.hits.iter().filter(|h| h.similarity.is_some()).map(|h| h.memory.content.as_str()).collect();
    assert_eq!(by_vector, ["The user's cat Miso likes tuna"]);
    assert!(
        hits.hits
            .iter()
            .filter(|h| h.similarity.is_some())
            .all(|h| h.memory.embedding_model.as_deref() == Some(&model))
    );
    assert!(hits.hits.iter().any(|h| h.memory.content == "The user's cat is called Miso" && h.text_rank.is_some()));
    // Pending: the three MiniLM episodes and fact, one of them without a
    // vector and one of a model whose name sorts after e5's (each a range of
    // the embedding_model index on Postgres).
    if let Some(pg) = new.storage.pg() {
        for sql in [
            "UPDATE episodic_memory SET embedding = NULL, embedding_model = NULL \
             WHERE content = 'Flight to Lisbon booked for June'",
            "UPDATE episodic_memory SET embedding_model = 'zz-a-later-model' \
             WHERE content = 'The user is learning Portuguese'",
        ] {
            sqlx::query(sql).execute(pg.pool()).await.unwrap();
        }
    }
    assert_eq!(new.storage.maintenance.reembed_pending(&model).await.unwrap(), 4);

    // Step the job until nothing is pending.
    let job = Reembed {
        store: new.storage.clone(),
        embedder: embedder.clone(),
        clock: std::sync::Arc::new(engram::clock::SystemClock),
        batch: 500,
        pause: std::time::Duration::ZERO,
    };
    for _ in 0..200 {
        if job.run_once().await.unwrap() == 0 {
            break;
        }
    }
    assert_eq!(new.storage.maintenance.reembed_pending(&model).await.unwrap(), 0);

    // After: every memory is in e5's space and found by vector.
    let hits = new.store.search(&tenant, &query, now).await.unwrap();
    let mut by_vector: Vec<&str> =
        hits.hits.iter().filter(|h| h.similarity.is_some()).map(|h| h.memory.content.as_str()).collect();
    by_vector.sort();
    assert_eq!(by_vector.len(), 5, "{by_vector:?}");
    assert!(hits.hits.iter().all(|h| h.memory.embedding_model.as_deref() == Some(&model)));
    let best = hits
        .hits
        .iter()
        .filter(|h| h.similarity.is_some())
        .max_by(|a, b| a.similarity.partial_cmp(&b.similarity).unwrap())
        .unwrap();
    assert!(best.memory.content.contains("Miso"), "{}", best.memory.content);
    drop((old, new));
    drop_database(&db).await;
}
