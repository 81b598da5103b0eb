//! Search and context on real Postgres and Redis, with many agents in one store.

use std::time::Duration;

use chrono::Duration as Days;
use chrono::{DateTime, Utc};
use engram::clock::Clock;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{
    TestApp, drop_database, embedded, expect_error, fresh_database, spawn_app, spawn_app_with, use_local_model,
};

async fn search(app: &TestApp, body: Value) -> Vec<Value> {
    let r = app.post("/v1/memories/search", &body).await;
    let status = r.status();
    let json: Value = r.json().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{json}");
    json["results"].as_array().unwrap().clone()
}

fn contents(results: &[Value]) -> Vec<String> {
    results.iter().map(|r| r["memory"]["content"].as_str().unwrap().to_string()).collect()
}

/// Agent `a` plus five noisy neighbours in the same tenant and table.
async fn seed(app: &TestApp) {
    let mut memories = Vec::new();
    for i in 0..30 {
        memories.push(json!({"agent_id": "a", "tier": "episodic", "content": format!("Note {i}: talked about the garden and tomatoes")}));
    }
    for agent in ["n1", "n2", "n3", "n4", "n5"] {
        for i in 0..40 {
            memories.push(json!({"agent_id": agent, "tier": "episodic", "content": format!("{agent} flight booking to Lisbon number {i}")}));
        }
    }
    for chunk in memories.chunks(100) {
        app.write(json!({"memories": chunk})).await;
    }
}

#[tokio::test]
async fn top_k_is_full_and_scoped_to_the_agent_among_many() {
    let app = spawn_app().await;
    seed(&app).await;
    app.write_one(json!({"agent_id": "a", "tier": "semantic", "content": "The user's flight to Lisbon leaves at 9"}))
        .await;
    let results = search(&app, json!({"agent_id": "a", "query": "flight to Lisbon", "top_k": 20})).await;
    assert_eq!(results.len(), 20, "the agent has 31 memories, so top 20 are returned");
    assert_eq!(results[0]["memory"]["content"], "The user's flight to Lisbon leaves at 9");
    assert!(results.iter().all(|r| r["memory"]["agent_id"] == "a"));
    // Scores are the weighted sums of their components, best first.
    for r in &results {
        let c = &r["components"];
        let parts = ["relevance", "recency", "importance", "frequency", "tier_bonus"].map(|k| c[k].as_f64().unwrap());
        assert!(parts.iter().all(|p| (0.0..=1.0).contains(p)), "{c}");
        let expected = 0.35 * parts[0] + 0.20 * parts[1] + 0.20 * parts[2] + 0.10 * parts[3] + 0.15 * parts[4];
        assert!((r["score"].as_f64().unwrap() - expected).abs() < 1e-9);
    }
    assert!(results.windows(2).all(|w| w[0]["score"].as_f64() >= w[1]["score"].as_f64()));
    let all = search(&app, json!({"agent_id": "a", "query": "garden", "top_k": 200})).await;
    assert_eq!(all.len(), 31);
}

#[tokio::test]
async fn superseded_deleted_and_expired_memories_are_never_returned() {
    let app = spawn_app().await;
    let fact = |c: &str| json!({"agent_id": "a", "content": c, "subject": "user", "predicate": "home city", "confidence": 0.8});
    app.write_one(fact("The user lives in Porto")).await;
    app.write_one(fact("The user lives in Lisbon")).await;
    let deleted = app
        .write_one(json!({"agent_id": "a", "tier": "episodic", "content": "The user lives in Faro, said once"}))
        .await;
    app.delete(&format!("/v1/memories/{}", deleted["id"].as_str().unwrap())).await;
    app.write_one(json!({"agent_id": "a", "tier": "episodic", "content": "The user lives in Braga for now", "retention": "transient"})).await;
    app.clock.advance(Days::minutes(90));
    let found =
        contents(&search(&app, json!({"agent_id": "a", "query": "where does the user live", "top_k": 50})).await);
    assert_eq!(found, ["The user lives in Lisbon"]);
}

#[tokio::test]
async fn another_tenants_memories_never_appear() {
    let s = uuid::Uuid::new_v4().simple().to_string();
    let server = spawn_app_with(|c| {
        c.auth.keys = vec![
            engram::config::ApiKeyConfig::from_plain(&format!("a{s}"), "ka", Default::default()),
            engram::config::ApiKeyConfig::from_plain(&format!("b{s}"), "kb", Default::default()),
        ];
    })
    .await;
    let (a, b) = (server.as_key("ka"), server.as_key("kb"));
    b.write_one(json!({"agent_id": "bot", "tier": "episodic", "content": "Secret plan of tenant B about Lisbon"}))
        .await;
    b.write_one(json!({"agent_id": "bot", "session_id": "s", "tier": "working", "content": "B scratch about Lisbon"}))
        .await;
    a.write_one(json!({"agent_id": "bot", "tier": "episodic", "content": "Tenant A trip to Lisbon"})).await;
    let found =
        contents(&search(&a, json!({"agent_id": "bot", "session_id": "s", "query": "Lisbon plan", "top_k": 50})).await);
    assert_eq!(found, ["Tenant A trip to Lisbon"]);
    let r = a
        .post(
            "/v1/context",
            &json!({"agent_id": "bot", "session_id": "s", "query": "Lisbon plan", "max_context_tokens": 8000}),
        )
        .await;
    let ctx: Value = r.json().await.unwrap();
    assert_eq!(ctx["context"], "[episodic] Tenant A trip to Lisbon\n");
}

#[tokio::test]
async fn duplicates_across_tiers_collapse_to_the_best_scored() {
    let app = spawn_app().await;
    app.write(json!({"memories": [
        {"agent_id": "a", "tier": "episodic", "content": "The user is vegetarian."},
        {"agent_id": "a", "tier": "semantic", "content": "the user is vegetarian"},
        {"agent_id": "a", "session_id": "s", "tier": "working", "content": "The user is  vegetarian"},
        {"agent_id": "a", "tier": "episodic", "content": "The user ordered a salad"}
    ]}))
    .await;
    let results = search(&app, json!({"agent_id": "a", "session_id": "s", "query": "is the user vegetarian"})).await;
    assert_eq!(results.len(), 2, "{results:?}");
    // The working copy has the tier bonus (0.3 × 0.15) and wins.
    assert_eq!(results[0]["memory"]["tier"], "working");
}

#[tokio::test]
async fn weights_from_the_request_or_the_agent_reorder_results() {
    let app = spawn_app_with(|c| {
        c.agents.insert(
            "recent-bot".into(),
            engram::config::AgentConfig {
                weights: Some(engram::domain::scoring::Weights {
                    relevance: 0.0,
                    recency: 1.0,
                    importance: 0.0,
                    frequency: 0.0,
                    tier_bonus: 0.0,
                }),
            },
        );
    })
    .await;
    for agent in ["a", "recent-bot"] {
        app.write_one(json!({"agent_id": agent, "tier": "episodic", "content": "Dinner at the ramen place was great",
                             "occurred_at": "2020-01-01T00:00:00Z"}))
            .await;
        app.write_one(json!({"agent_id": agent, "tier": "episodic", "content": "Went hiking"})).await;
    }
    let default = contents(&search(&app, json!({"agent_id": "a", "query": "ramen dinner"})).await);
    assert_eq!(default[0], "Dinner at the ramen place was great");
    let recency = json!({"relevance": 0, "recency": 1, "importance": 0, "frequency": 0, "tier_bonus": 0});
    let by_recency =
        contents(&search(&app, json!({"agent_id": "a", "query": "ramen dinner", "weights": recency})).await);
    assert_eq!(by_recency[0], "Went hiking");
    let per_agent = contents(&search(&app, json!({"agent_id": "recent-bot", "query": "ramen dinner"})).await);
    assert_eq!(per_agent[0], "Went hiking");
    let r = app.post("/v1/memories/search", &json!({"agent_id": "a", "query": "x", "weights": {"relevance": -1, "recency": 0, "importance": 0, "frequency": 0, "tier_bonus": 0}})).await;
    let err = expect_error(r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field").await;
    assert_eq!(err["error"]["field"], "/weights/relevance");
}

/// On Postgres the vector leg compares every vector of an agent with fewer
/// than `search.exact_scan_below` in a tier, and walks the tier's HNSW index
/// for larger agents (the embedded backend has no such choice). On a store this small the walk is exact too, so a
/// server that always walks (0) must find what the default one finds, with
/// the same relevance, in every tier.
#[tokio::test]
async fn the_graph_walk_and_the_exact_scan_find_the_same_memories() {
    let exact = spawn_app().await;
    // Two servers on one store: each embedded server has a data directory of its own.
    if exact.postgres_only("the vector leg's choice of scan").is_none() {
        return;
    }
    seed(&exact).await;
    write_every_tier(&exact).await;
    let tenant = exact.config.auth.default_tenant.clone();
    let walk = spawn_app_with(|c| {
        c.search.exact_scan_below = 0;
        c.auth.default_tenant = tenant;
    })
    .await;
    let relevance = json!({"relevance": 1, "recency": 0, "importance": 0, "frequency": 0, "tier_bonus": 0});
    for query in ["Mira's flight to Lisbon", "tomatoes in Tomás's garden", "booking fares for flights"] {
        let body = json!({"agent_id": "a", "query": query, "top_k": 8, "weights": relevance});
        let found = |results: Vec<Value>| -> Vec<(String, String)> {
            results
                .iter()
                .map(|r| {
                    (r["memory"]["id"].to_string(), format!("{:.6}", r["components"]["relevance"].as_f64().unwrap()))
                })
                .collect()
        };
        let mut by_scan = found(search(&exact, body.clone()).await);
        let mut by_walk = found(search(&walk, body).await);
        assert_eq!(by_scan.len(), 8, "{query}");
        by_scan.sort();
        by_walk.sort();
        assert_eq!(by_walk, by_scan, "{query}");
    }
}

/// Facts, episodes and skills of agent `a`, in every persistent tier.
async fn write_every_tier(app: &TestApp) {
    let facts = [
        "Mira's flight to Lisbon leaves at 9 from gate 14",
        "Tomás grows heirloom tomatoes in the community garden",
        "Priya prefers window seats on long flights",
        "Jonas waters the basil every other morning",
        "Aiko booked a hotel near the Lisbon riverside",
        "Bruno's garden shed needs a new lock",
    ];
    for (i, fact) in facts.iter().enumerate() {
        let tier = if i % 2 == 0 { "semantic" } else { "episodic" };
        app.write_one(json!({"agent_id": "a", "tier": tier, "content": fact})).await;
    }
    for (skill, how) in
        [("book-flight", "Book Mira's flight: compare fares first"), ("water-garden", "Water Tomás's garden at dusk")]
    {
        app.write_one(json!({"agent_id": "a", "skill_name": skill, "content": how})).await;
    }
}

/// The vector leg's statement in each of its forms, as the server builds
/// them: the walk, the exact scan (chosen from statistics) and the two
/// behind a count (no statistics); all return the same rows of every tier.
#[tokio::test]
async fn every_form_of_the_vector_leg_returns_the_same_rows() {
    use std::collections::HashMap;

    use engram::domain::Tier;
    use engram::store::postgres::search::Legs;
    use engram::store::postgres::stats::{TableStats, VectorScan};
    use engram::store::{Embedding, SearchQuery};
    use sqlx::Row;

    let app = spawn_app().await;
    let Some(pg) = app.postgres_only("the vector leg's statements") else { return };
    seed(&app).await;
    write_every_tier(&app).await;
    let tenant = app.config.auth.default_tenant.clone();
    // A stored fact's vector as the query's.
    let (model, vector): (String, pgvector::Vector) = sqlx::query_as(
        "SELECT embedding_model, embedding FROM semantic_memory WHERE tenant_id = $1 AND agent_id = 'a' LIMIT 1",
    )
    .bind(&tenant)
    .fetch_one(pg.pool())
    .await
    .unwrap();
    let tiers = [Tier::Episodic, Tier::Semantic, Tier::Procedural];
    let query = SearchQuery {
        agent_id: "a".into(),
        user_id: None,
        tiers: tiers.to_vec(),
        text: String::new(),
        vector: Some(Embedding { model, vector: vector.to_vec() }),
        metadata: Vec::new(),
        since: None,
        until: None,
        per_leg: 8,
        include_candidates: false,
        as_of: None,
        valid_at: None,
    };
    // Statistics of a million rows where `a` is listed with a hundred.
    let listed = TableStats {
        rows: 1e6,
        agents: [((tenant.clone(), "a".to_string()), 1e-4)].into(),
        agent_floor: 1e-5,
        agent_ceiling: 1e-4,
        ..TableStats::default()
    };
    let small: HashMap<Tier, TableStats> = tiers.iter().map(|t| (*t, listed.clone())).collect();
    let none = HashMap::new();
    // Per form: every row of `a` (40 a tier), as (tier:id, similarity); and
    // the best 8 of each tier as (tier, similarity), whose ids may differ
    // among rows of equal similarity.
    let mut all = Vec::new();
    let mut best = Vec::new();
    for (stats, below, form) in
        [(&small, 5_000, VectorScan::Exact), (&none, 5_000, VectorScan::Counted(5_000)), (&none, 0, VectorScan::Walk)]
    {
        for per_leg in [40, 8] {
            let query = SearchQuery { per_leg, ..query.clone() };
            let legs = Legs {
                tenant: &tenant,
                query: &query,
                lexemes: &[],
                tiers: &tiers,
                now: Utc::now(),
                stats,
                exact_scan_below: below,
            };
            assert!(legs.vector_scans().iter().all(|(_, s)| *s == form), "{:?}", legs.vector_scans());
            let mut qb = sqlx::QueryBuilder::new("");
            legs.push_vector_leg(&mut qb);
            let rows = qb.build().fetch_all(pg.pool()).await.unwrap();
            let mut got: Vec<(String, String)> = rows
                .iter()
                .map(|r| {
                    let (tier, id) = (r.get::<String, _>("tier"), r.get::<uuid::Uuid, _>("id"));
                    let similarity = format!("{:.6}", r.get::<f64, _>("similarity"));
                    (if per_leg == 40 { format!("{tier}:{id}") } else { tier }, similarity)
                })
                .collect();
            got.sort();
            if per_leg == 40 { all.push(got) } else { best.push(got) }
        }
    }
    // 33 episodes, 3 facts, 2 skills; 8 + 3 + 2.
    assert_eq!(all[0].len(), 38, "{:?}", all[0]);
    assert_eq!(best[0].len(), 13, "{:?}", best[0]);
    for i in 1..3 {
        assert_eq!(all[i], all[0]);
        assert_eq!(best[i], best[0]);
    }
}

/// Waits (the flusher runs every 500 ms) until the memory at `path` has
/// `count` accesses; returns it.
async fn wait_for_access_count(app: &TestApp, path: &str, count: i64) -> Value {
    for _ in 0..40 {
        let (_, got) = app.get_json(path).await;
        if got["access_count"] == count {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("access_count never reached {count}");
}

#[tokio::test]
async fn searches_count_accesses_off_the_response_path_once_per_interval() {
    let app = spawn_app().await;
    assert_eq!(app.config.search.access_interval_secs, 3600);
    // Whole seconds: the stored timestamp keeps microseconds only.
    app.clock.set(DateTime::from_timestamp(Utc::now().timestamp(), 0).unwrap());
    let m =
        app.write_one(json!({"agent_id": "a", "tier": "semantic", "content": "The wifi password is hunter2"})).await;
    let path = format!("/v1/memories/{}", m["id"].as_str().unwrap());
    let started = app.clock.now();
    search(&app, json!({"agent_id": "a", "query": "wifi password"})).await;
    let got = wait_for_access_count(&app, &path, 1).await;
    assert_eq!(got["last_accessed_at"].as_str().map(|s| s.parse::<DateTime<Utc>>().unwrap()), Some(started));

    // Within the hour: retrieved again, not counted again.
    app.clock.advance(chrono::Duration::minutes(59));
    search(&app, json!({"agent_id": "a", "query": "wifi password"})).await;
    search(&app, json!({"agent_id": "a", "query": "wifi password"})).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (_, got) = app.get_json(&path).await;
    assert_eq!(got["access_count"], 1);

    // An hour after the counted one: a new occasion.
    app.clock.advance(chrono::Duration::minutes(1));
    search(&app, json!({"agent_id": "a", "query": "wifi password"})).await;
    let got = wait_for_access_count(&app, &path, 2).await;
    let expected = started + chrono::Duration::minutes(60);
    assert_eq!(got["last_accessed_at"].as_str().map(|s| s.parse::<DateTime<Utc>>().unwrap()), Some(expected));
}

#[tokio::test]
async fn with_no_access_interval_every_search_counts() {
    let app = spawn_app_with(|c| c.search.access_interval_secs = 0).await;
    let m =
        app.write_one(json!({"agent_id": "a", "tier": "semantic", "content": "The wifi password is hunter2"})).await;
    let path = format!("/v1/memories/{}", m["id"].as_str().unwrap());
    search(&app, json!({"agent_id": "a", "query": "wifi password"})).await;
    wait_for_access_count(&app, &path, 1).await;
    search(&app, json!({"agent_id": "a", "query": "wifi password"})).await;
    wait_for_access_count(&app, &path, 2).await;
}

#[tokio::test]
async fn context_fits_the_budget_and_puts_the_session_first() {
    let app = spawn_app().await;
    app.write(json!({"memories": [
        {"agent_id": "a", "session_id": "s", "tier": "working", "content": "User: can you find me a flight to Lisbon?"},
        {"agent_id": "a", "session_id": "s", "tier": "working", "content": "Assistant: for which dates?"},
        {"agent_id": "a", "tier": "semantic", "content": "The user prefers aisle seats"},
        {"agent_id": "a", "tier": "episodic", "content": "Last year the user flew to Lisbon with TAP and liked it"},
        {"agent_id": "a", "skill_name": "book_flight", "content": "Search flights, filter by price, confirm with the user"}
    ]}))
    .await;
    let r = app
        .post(
            "/v1/context",
            &json!({"agent_id": "a", "session_id": "s", "query": "book a flight to Lisbon",
                                      "max_context_tokens": 6000, "system_prompt": "You are a travel agent."}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let ctx: Value = r.json().await.unwrap();
    let text = ctx["context"].as_str().unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert_eq!(lines[0], "[working] User: can you find me a flight to Lisbon?");
    assert_eq!(lines[1], "[working] Assistant: for which dates?");
    let usage = &ctx["usage"];
    // 6000 − 6 ("You are a travel agent.") − 5 ("book a flight to Lisbon") − 4096 = 1893, in cl100k_base tokens.
    assert_eq!(usage["tokens_available"], 1893);
    assert!(usage["tokens_used"].as_u64().unwrap() <= 1893);
    assert_eq!(usage["dropped"], 0);
    assert_eq!(ctx["sections"]["working"].as_array().unwrap().len(), 2);

    // A budget too small for anything: 200, empty.
    let r = app.post("/v1/context", &json!({"agent_id": "a", "query": "flight", "max_context_tokens": 4100})).await;
    let tiny: Value = r.json().await.unwrap();
    assert_eq!(tiny["usage"]["tokens_available"], 3);
    assert_eq!(tiny["context"], "");
    assert_eq!(tiny["usage"]["tokens_used"], 0);
    assert!(tiny["usage"]["dropped"].as_u64().unwrap() >= 3);

    // A negative budget: 422 naming the fields.
    let r = app.post("/v1/context", &json!({"agent_id": "a", "query": "flight", "max_context_tokens": 1000})).await;
    let err = expect_error(r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field").await;
    assert_eq!(err["error"]["field"], "/max_context_tokens");
    assert!(err["error"]["message"].as_str().unwrap().contains("output_reserve_tokens"));
    // Terms whose difference leaves a 64-bit integer's range: the same 422, not a 500.
    for body in [
        json!({"agent_id": "a", "query": "flight", "max_context_tokens": 1, "system_prompt_tokens": i64::MAX}),
        json!({"agent_id": "a", "query": "flight", "max_context_tokens": 1, "system_prompt_tokens": i64::MAX,
               "output_reserve_tokens": i64::MAX}),
    ] {
        let err =
            expect_error(app.post("/v1/context", &body).await, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field").await;
        assert_eq!(err["error"]["field"], "/max_context_tokens");
    }
}

#[tokio::test]
async fn a_long_memory_is_shortened_rather_than_dropped() {
    let app = spawn_app().await;
    let long = format!(
        "{} The user is allergic to peanuts. {}",
        "We talked about the weather for a long time and nothing else happened. ".repeat(20),
        "Then we said goodbye and that was the end of it. ".repeat(20)
    );
    app.write_one(json!({"agent_id": "a", "tier": "episodic", "content": long})).await;
    // Budget 100: episodic share is 20 tokens, but all of the 100 is pooled in the second pass.
    let r = app
        .post(
            "/v1/context",
            &json!({"agent_id": "a", "query": "is the user allergic to peanuts", "max_context_tokens": 4210,
                                      "output_reserve_tokens": 4096}),
        )
        .await;
    let ctx: Value = r.json().await.unwrap();
    let item = &ctx["sections"]["episodic"][0];
    assert_eq!(item["shortened"], true, "{ctx}");
    assert!(item["text"].as_str().unwrap().contains("allergic to peanuts"), "{item}");
    assert_eq!(ctx["usage"]["shortened"], 1);
    assert!(ctx["usage"]["tokens_used"].as_u64() <= ctx["usage"]["tokens_available"].as_u64());
}

#[tokio::test]
async fn the_bundled_model_finds_memories_that_share_no_word_with_the_query() {
    // A database of its own: the other tests' servers run another model, and
    // a server re-embeds every row that is not of its model.
    let db = if embedded() { None } else { Some(fresh_database().await) };
    let app = spawn_app_with(|c| {
        use_local_model(c);
        // Relevance as the legs give it, not relative to the best.
        c.search.relative_relevance = false;
        c.search.neighbour_share = 0.0;
        if let Some(db) = &db {
            c.database.url = db.clone();
        }
    })
    .await;
    for text in [
        "Adopted a golden retriever puppy last weekend",
        "The quarterly tax filing is due in April",
        "Booked a table at the sushi restaurant for Friday",
    ] {
        let m = app.write_one(json!({"agent_id": "a", "tier": "episodic", "content": text})).await;
        assert_eq!(m["embedding_model"], "all-MiniLM-L6-v2-int8");
    }
    let results = search(&app, json!({"agent_id": "a", "query": "dog"})).await;
    assert_eq!(contents(&results)[0], "Adopted a golden retriever puppy last weekend", "{results:#?}");
    // No query word in any memory: the relevance is the cosine alone (its 0.6 share).
    assert!(results.iter().all(|r| r["components"]["relevance"].as_f64().unwrap() <= 0.6));
    drop(app);
    if let Some(db) = db {
        drop_database(&db).await;
    }
}

#[tokio::test]
async fn each_leg_scores_the_other_legs_candidates_too() {
    let app = spawn_app().await;
    let tenant = app.config.auth.default_tenant.clone();
    for text in ["red apples and green pears", "a basket of red apples", "pears ripen in the autumn sun"] {
        app.write_one(json!({"agent_id": "a", "tier": "episodic", "content": text})).await;
    }
    let embedder = engram::embed::from_config(&app.config.embedding).unwrap().unwrap();
    let text = "ripe pears".to_string();
    let vector = embedder.embed(std::slice::from_ref(&text)).await.unwrap().pop().unwrap();
    let mut query = engram::store::SearchQuery {
        agent_id: "a".into(),
        user_id: None,
        tiers: vec![engram::domain::Tier::Episodic],
        text,
        vector: Some(engram::store::Embedding { model: embedder.model_id().into(), vector }),
        metadata: vec![],
        since: None,
        until: None,
        // One row per leg: whatever one leg alone found still carries both scores.
        per_leg: 1,
        include_candidates: false,
        as_of: None,
        valid_at: None,
    };
    let hits = app.store.search(&tenant, &query, app.clock.now()).await.unwrap();
    assert!(!hits.hits.is_empty());
    for h in &hits.hits {
        assert!(h.similarity.is_some_and(|s| s > 0.0), "{}: no cosine", h.memory.content);
        assert!(h.text_rank.is_some_and(|r| r > 0.0), "{}: no text rank", h.memory.content);
        assert!(h.vector.is_some());
    }
    // Every row: "a basket of red apples" has no query word, so the vector
    // leg found it, with a text rank of 0.
    query.per_leg = 3;
    let hits = app.store.search(&tenant, &query, app.clock.now()).await.unwrap();
    assert_eq!(hits.hits.len(), 3);
    let apples = hits.hits.iter().find(|h| h.memory.content == "a basket of red apples").unwrap();
    assert_eq!(apples.text_rank, Some(0.0));
    assert!(hits.hits.iter().filter(|h| h.memory.content.contains("pear")).all(|h| h.text_rank > Some(0.0)));
}

/// A reply that shares no word with the question is found through the turn
/// before it; relevance is relative to the best candidate; `min_relevance`
/// looks at a memory's own relevance.
#[tokio::test]
async fn a_reply_is_found_through_the_turn_before_it() {
    let turns = [
        "What did you research for the project last week?",
        "Adoption agencies, mostly the ones near Boston.",
        "The weather was lovely at the beach on Sunday.",
        "We painted the fence green and blue.",
        "My cat knocked a vase off the shelf.",
        "Dinner was pasta with a lot of garlic.",
    ];
    let memories: Vec<Value> = turns
        .iter()
        .map(|t| json!({"agent_id": "talk", "tier": "episodic", "content": t, "importance": 0.5, "occurred_at": "2026-05-08T13:56:00Z"}))
        .collect();
    let app = spawn_app().await;
    app.write(json!({"memories": memories})).await;
    let query = json!({"agent_id": "talk", "query": "what did she research last week", "top_k": 3});
    let results = search(&app, query.clone()).await;
    let found = contents(&results);
    assert_eq!(found[0], turns[0]);
    assert_eq!(found[1], turns[1], "the reply comes right after the question it answers: {found:?}");
    assert_eq!(results[0]["components"]["relevance"].as_f64().unwrap(), 1.0);

    // Without neighbours and normalisation, relevance is each turn's own:
    // the reply shares no word with the query and is below the question.
    let plain = spawn_app_with(|c| {
        c.search.neighbour_share = 0.0;
        c.search.relative_relevance = false;
    })
    .await;
    plain.write(json!({"memories": memories})).await;
    let all = search(&plain, json!({"agent_id": "talk", "query": "what did she research last week", "top_k": 6})).await;
    let own = |text: &str| {
        let r = all.iter().find(|r| r["memory"]["content"] == text).expect("every turn is a candidate");
        r["components"]["relevance"].as_f64().unwrap()
    };
    let (question, answer) = (own(turns[0]), own(turns[1]));
    assert!(question > answer, "{question} {answer}");
    // `min_relevance` compares a memory's own relevance: between the two
    // turns' own, it keeps the question and drops the reply.
    let mut floored = query.clone();
    floored["min_relevance"] = json!((question + answer) / 2.0);
    let kept = contents(&search(&app, floored).await);
    assert!(kept.contains(&turns[0].to_string()) && !kept.contains(&turns[1].to_string()), "{kept:?}");
}

/// An app with the bundled model on a database of its own (the embedded
/// backend gets a data directory of its own anyway), and that database.
async fn app_with_model() -> (TestApp, Option<String>) {
    let db = if embedded() { None } else { Some(fresh_database().await) };
    let app = spawn_app_with(|c| {
        use_local_model(c);
        if let Some(db) = &db {
            c.database.url = db.clone();
        }
    })
    .await;
    (app, db)
}

async fn finish(app: TestApp, db: Option<String>) {
    drop(app);
    if let Some(db) = db {
        drop_database(&db).await;
    }
}

/// The questions whose answer (the memory's content) did not come first in
/// the agent's search, each said with what came first instead.
async fn not_first(app: &TestApp, agent: &str, questions: &[(&str, &str)]) -> Vec<String> {
    let mut wrong = Vec::new();
    for (question, answer) in questions {
        let results = search(app, json!({"agent_id": agent, "query": question, "top_k": 3})).await;
        let first = contents(&results).into_iter().next().unwrap_or_default();
        if first != *answer {
            wrong.push(format!("{question:?}: {first:?} came first, not {answer:?}"));
        }
    }
    wrong
}

/// Small stores where one name or topic is in every memory and each question
/// has one right answer: it must come first on either backend, with the
/// server's defaults and the bundled model.
#[tokio::test]
async fn a_word_in_every_memory_does_not_decide_and_the_right_answer_comes_first() {
    // (agent, memories, questions with the index of their answer)
    type Store<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, usize)]);
    let stores: [Store; 3] = [
        (
            "people",
            &[
                "Alice works night shifts as a nurse.",
                "Alice is allergic to peanuts.",
                "Alice has a flat in Porto with her two cats.",
                "Alice's favourite band is Radiohead.",
                "Bob is a carpenter who builds boats.",
                "Bob is allergic to shellfish.",
                "Bob moved to Oslo last spring.",
            ],
            &[
                ("What does Alice do for a living?", 0),
                ("What is Alice allergic to?", 1),
                ("Where is Alice's home?", 2),
                ("What music does Alice like?", 3),
                ("What is Bob's job?", 4),
                ("Which city did Bob move to?", 6),
            ],
        ),
        (
            "project",
            &[
                "The Atlas project deadline is March 3.",
                "The Atlas project budget is 40,000 euros.",
                "The Atlas project is led by Priya.",
                "The Atlas project stores its data in Postgres.",
                "The Atlas project demo went badly on Tuesday.",
            ],
            &[
                ("When is the Atlas project due?", 0),
                ("How much money does the Atlas project have?", 1),
                ("Who leads the Atlas project?", 2),
                ("Which database does the Atlas project use?", 3),
                ("How did the Atlas demo go?", 4),
            ],
        ),
        (
            // "living" and "lives" share a stem, the one word of the first
            // question that a single fact holds.
            "household",
            &[
                "Alice is allergic to peanuts.",
                "Alice works night shifts as a nurse.",
                "Bob plays the cello in an orchestra.",
                "Alice lives in Porto with her sister.",
                "Bob is training for a marathon.",
            ],
            &[
                ("What does Alice do for a living?", 1),
                ("Where does Alice live?", 3),
                ("What can't Alice eat?", 0),
                ("What instrument does Bob play?", 2),
                ("What is Bob training for?", 4),
            ],
        ),
    ];
    let (app, db) = app_with_model().await;
    let mut wrong = Vec::new();
    for (agent, memories, questions) in stores {
        let batch: Vec<Value> = memories.iter().map(|m| json!({"agent_id": agent, "content": m})).collect();
        app.write(json!({"memories": batch})).await;
        let asked: Vec<(&str, &str)> = questions.iter().map(|(q, a)| (*q, memories[*a])).collect();
        wrong.extend(not_first(&app, agent, &asked).await);
    }
    finish(app, db).await;
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Speaker-aware matching (`domain::speaker`): a question about a person is
/// answered by what that person said, not by the other speaker's reply that
/// names them and repeats the topic. Transcript lines ("Maria: ...") and
/// `metadata.speaker` both name the speaker.
#[tokio::test]
async fn a_question_about_a_speaker_finds_their_own_words_before_replies_naming_them() {
    let turns: &[(Option<&str>, &str)] = &[
        (None, "Maria: I just started doing aerial yoga, it is great for my back."),
        (None, "John: That's awesome, Maria! Yoga sounds like a great way to relax."),
        (None, "John: I have been playing basketball with my old teammates every Sunday."),
        (None, "Maria: Nice, John! Basketball with friends sounds like so much fun."),
        (None, "Maria: I volunteer at the homeless shelter on weekends."),
        (None, "John: Maria, volunteering at the shelter is so generous of you."),
        (Some("Maria"), "I keep two beehives on the roof of my building."),
        (Some("John"), "Beehives on your roof, Maria? I would be scared of the bees."),
        (None, "Maria: My cousin is visiting from Chicago next month."),
        (None, "John: Have fun with your cousin, Maria!"),
    ];
    let questions = [
        ("What kind of yoga does Maria do?", 0),
        ("What sport does John play?", 2),
        ("Where does Maria volunteer?", 4),
        ("What does Maria keep on her roof?", 6),
        ("Who is visiting Maria next month?", 8),
    ];
    let (app, db) = app_with_model().await;
    let batch: Vec<Value> = turns
        .iter()
        .map(|(speaker, content)| match speaker {
            Some(s) => json!({"agent_id": "chat", "tier": "episodic", "content": content, "metadata": {"speaker": s}}),
            None => json!({"agent_id": "chat", "tier": "episodic", "content": content}),
        })
        .collect();
    app.write(json!({"memories": batch})).await;
    let asked: Vec<(&str, &str)> = questions.iter().map(|(q, a)| (*q, turns[*a].1)).collect();
    let wrong = not_first(&app, "chat", &asked).await;
    finish(app, db).await;
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// A question that names a date finds what happened then: four turns about
/// the same dinner on four dates, alike to every question but for the date,
/// which is in none of their words (`domain::when`).
#[tokio::test]
async fn a_question_that_names_a_date_finds_what_happened_then() {
    let turns = [
        ("2023-05-03T18:00:00Z", "Maria: We made a big pot of lasagna for the dinner at the shelter tonight."),
        ("2023-06-14T18:30:00Z", "Maria: Tonight the shelter dinner was chili, and I cooked it with my mom."),
        ("2023-07-07T19:00:00Z", "Maria: I cooked a spicy curry for the shelter's dinner, everyone loved it."),
        ("2023-08-20T17:45:00Z", "Maria: For the shelter dinner I tried paella for the first time."),
    ];
    let questions = [
        ("What did Maria cook for the shelter dinner on 7 July, 2023?", 2),
        ("What did Maria cook for the shelter dinner on June 14th 2023?", 1),
        ("What did Maria cook for the shelter in May 2023?", 0),
        ("What did Maria cook for the shelter dinner on 2023-08-20?", 3),
    ];
    let (app, db) = app_with_model().await;
    let batch: Vec<Value> = turns
        .iter()
        .map(|(at, content)| json!({"agent_id": "diary", "tier": "episodic", "content": content, "occurred_at": at}))
        .collect();
    app.write(json!({"memories": batch})).await;
    let asked: Vec<(&str, &str)> = questions.iter().map(|(q, a)| (*q, turns[*a].1)).collect();
    let wrong = not_first(&app, "diary", &asked).await;
    finish(app, db).await;
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// The scopes of search and context: the agent's memories only; with a user,
/// that user's and those of no user (the agent's own knowledge, its skills),
/// never another user's. Listing with `user_id` filters exactly.
#[tokio::test]
async fn the_user_scope_narrows_to_the_user_and_keeps_what_belongs_to_no_user() {
    let app = spawn_app().await;
    let agent = format!("scope-{}", uuid::Uuid::new_v4().simple());
    let write = |body: Value| app.write_one(body);
    let ann = write(json!({"agent_id": agent, "user_id": "ann", "tier": "episodic", "content": "Ann's flight to Lisbon leaves at nine"})).await;
    let bob = write(json!({"agent_id": agent, "user_id": "bob", "tier": "episodic", "content": "Bob's flight to Lisbon leaves at noon"})).await;
    let fact =
        write(json!({"agent_id": agent, "tier": "semantic", "content": "Flights to Lisbon board at gate 12"})).await;
    let skill = write(json!({"agent_id": agent, "tier": "procedural", "skill_name": "book_flight",
                             "content": "Book a flight to Lisbon through the airline API"}))
    .await;
    let other = write(json!({"agent_id": format!("{agent}-b"), "user_id": "ann", "tier": "episodic", "content": "Ann's flight to Lisbon, another agent"})).await;
    let session = format!("s-{agent}");
    let entry = write(json!({"agent_id": agent, "session_id": session, "tier": "working", "content": "Lisbon flight chosen in this session"})).await;
    let bobs_entry = write(json!({"agent_id": agent, "user_id": "bob", "session_id": session, "tier": "working", "content": "Bob's Lisbon flight in this session"})).await;
    let ids = |results: &[Value]| -> Vec<Value> { results.iter().map(|r| r["memory"]["id"].clone()).collect() };

    let scoped = ids(&search(
        &app,
        json!({"agent_id": agent, "user_id": "ann", "session_id": session, "query": "flight to Lisbon"}),
    )
    .await);
    for m in [&ann, &fact, &skill, &entry] {
        assert!(scoped.contains(&m["id"]), "{m} missing from {scoped:?}");
    }
    for m in [&bob, &other, &bobs_entry] {
        assert!(!scoped.contains(&m["id"]), "{m} in ann's scope");
    }
    let all = ids(&search(&app, json!({"agent_id": agent, "query": "flight to Lisbon"})).await);
    assert_eq!(all.len(), 4, "without a user: every persistent memory of the agent {all:?}");
    assert!(!all.contains(&other["id"]));

    let r = app.post("/v1/context", &json!({"agent_id": agent, "user_id": "ann", "query": "flight to Lisbon", "max_context_tokens": 8000, "output_reserve_tokens": 1000})).await;
    assert_eq!(r.status(), StatusCode::OK);
    let context = r.text().await.unwrap();
    assert!(context.contains("gate 12") && context.contains("nine"), "{context}");
    assert!(!context.contains("noon"), "{context}");

    let (_, listed) = app.get_json(&format!("/v1/memories?agent_id={agent}&user_id=ann")).await;
    let listed: Vec<&Value> = listed["memories"].as_array().unwrap().iter().map(|m| &m["id"]).collect();
    assert_eq!(listed, vec![&ann["id"]], "listing filters exactly");
}

/// `valid_at`: the fact that held in the world at a moment, even when engram
/// was told late (`occurred_at` in the past), with `as_of` what was known of
/// it then; candidates never; on search and listing, both backends.
#[tokio::test]
async fn valid_at_recalls_the_fact_that_held_at_each_moment() {
    let app = spawn_app().await;
    let agent = format!("validat-{}", uuid::Uuid::new_v4().simple());
    let lives = |city: &str, since: &str, confidence: f64| {
        json!({"agent_id": agent, "user_id": "ann", "tier": "semantic", "content": format!("Ann lives in {city}"),
               "subject": "ann", "predicate": "lives_in", "object": city, "confidence": confidence,
               "occurred_at": since})
    };
    app.write_one(lives("Lisbon", "2025-01-01T00:00:00Z", 0.8)).await;
    app.clock.advance(Days::days(1));
    let porto = app.write_one(lives("Porto", "2025-06-01T00:00:00Z", 0.8)).await;
    assert!(porto["supersedes"].is_string(), "{porto}");
    // A weaker claim: a candidate, never valid.
    let weak = app.write_one(lives("Madrid", "2025-07-01T00:00:00Z", 0.1)).await;
    assert!(weak["contested_by"].is_string(), "{weak}");
    let porto_known: DateTime<Utc> = porto["created_at"].as_str().unwrap().parse().unwrap();
    app.clock.advance(Days::days(1));
    // Told today that Ann moved to Berlin in November.
    app.write_one(lives("Berlin", "2025-11-01T00:00:00Z", 0.8)).await;
    let held = |valid_at: &str, as_of: Option<DateTime<Utc>>| {
        let mut filter = json!({"valid_at": valid_at});
        if let Some(a) = as_of {
            filter["as_of"] = json!(a.to_rfc3339());
        }
        let q = json!({"agent_id": agent, "query": "Where does Ann live?", "tiers": ["semantic"],
                       "include_candidates": true, "filter": filter});
        let app = &app;
        async move {
            search(app, q)
                .await
                .iter()
                .filter_map(|r| r["memory"]["object"].as_str().map(str::to_string))
                .collect::<Vec<_>>()
        }
    };
    assert!(held("2024-12-01T00:00:00Z", None).await.is_empty(), "before the first fact held");
    assert_eq!(held("2025-03-01T00:00:00Z", None).await, vec!["Lisbon"]);
    assert_eq!(held("2025-08-01T00:00:00Z", None).await, vec!["Porto"]);
    assert_eq!(held("2025-12-01T00:00:00Z", None).await, vec!["Berlin"]);
    // What engram knew the day Porto was written: Porto, still current.
    assert_eq!(held("2025-12-01T00:00:00Z", Some(porto_known + Days::hours(1))).await, vec!["Porto"]);
    // Listing narrows the same way.
    for (at, city) in [("2025-03-01T00:00:00Z", "Lisbon"), ("2025-08-01T00:00:00Z", "Porto")] {
        let (status, listed) =
            app.get_json(&format!("/v1/memories?agent_id={agent}&tier=semantic&valid_at={at}")).await;
        assert_eq!(status, StatusCode::OK, "{listed}");
        let objects: Vec<&str> =
            listed["memories"].as_array().unwrap().iter().map(|m| m["object"].as_str().unwrap()).collect();
        assert_eq!(objects, vec![city], "listed valid at {at}");
    }
    let r = app
        .post("/v1/memories/search", &json!({"agent_id": agent, "query": "x", "filter": {"valid_at": "June"}}))
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(r.text().await.unwrap().contains("valid_at"));
}

/// `as_of`: what the agent knew at a moment, the fact current then along its
/// supersede chain, candidates and later memories left out; both backends.
#[tokio::test]
async fn as_of_recalls_the_fact_current_at_each_moment_of_its_chain() {
    let app = spawn_app().await;
    let agent = format!("asof-{}", uuid::Uuid::new_v4().simple());
    let lives = |city: &str, confidence: f64| {
        json!({"agent_id": agent, "user_id": "ann", "tier": "semantic", "content": format!("Ann lives in {city}"),
               "subject": "ann", "predicate": "lives_in", "object": city, "confidence": confidence})
    };
    let mut moments = Vec::new();
    for city in ["Lisbon", "Porto", "Berlin"] {
        let fact = app.write_one(lives(city, 0.8)).await;
        assert_eq!(fact["valid_until"], Value::Null, "{fact}");
        let at: DateTime<Utc> = fact["created_at"].as_str().unwrap().parse().unwrap();
        moments.push((city, at + Days::hours(1)));
        if city == "Porto" {
            // A weaker claim while Porto held: a candidate, never part of the past.
            let weak = app.write_one(lives("Madrid", 0.1)).await;
            assert!(weak["contested_by"].is_string(), "{weak}");
            app.write_one(json!({"agent_id": agent, "user_id": "ann", "tier": "episodic", "content": "Ann asked where to live in Porto"})).await;
        }
        app.clock.advance(Days::days(1));
    }
    let cities = |results: &[Value]| -> Vec<String> {
        results.iter().filter_map(|r| r["memory"]["object"].as_str().map(str::to_string)).collect()
    };
    for (city, at) in &moments {
        let q = json!({"agent_id": agent, "query": "Where does Ann live?", "include_candidates": true,
                       "filter": {"as_of": at.to_rfc3339()}});
        let results = search(&app, q).await;
        assert_eq!(cities(&results), vec![city.to_string()], "as of {at}: {results:#?}");
        let episode = results.iter().any(|r| r["memory"]["tier"] == "episodic");
        assert_eq!(episode, *city != "Lisbon", "the episode exists from Porto's day on");
        let r = app
            .post(
                "/v1/context",
                &json!({"agent_id": agent, "query": "Where does Ann live?", "max_context_tokens": 4000,
                                         "output_reserve_tokens": 500, "filter": {"as_of": at.to_rfc3339()}}),
            )
            .await;
        assert_eq!(r.status(), StatusCode::OK);
        let context = r.text().await.unwrap();
        for other in ["Lisbon", "Porto", "Berlin", "Madrid"].iter().filter(|c| *c != city) {
            assert!(!context.contains(&format!("lives in {other}")), "as of {at}: {context}");
        }
        let stamp = at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let (status, listed) =
            app.get_json(&format!("/v1/memories?agent_id={agent}&tier=semantic&as_of={stamp}")).await;
        assert_eq!(status, StatusCode::OK, "{listed}");
        let listed: Vec<&str> =
            listed["memories"].as_array().unwrap().iter().map(|m| m["object"].as_str().unwrap()).collect();
        assert_eq!(listed, vec![*city], "listed as of {at}");
    }
    // Before the first fact: nothing; without as_of: today's.
    let before = moments[0].1 - Days::days(1);
    let q = json!({"agent_id": agent, "query": "Where does Ann live?", "filter": {"as_of": before.to_rfc3339()}});
    assert!(search(&app, q).await.is_empty());
    let now = search(&app, json!({"agent_id": agent, "query": "Where does Ann live?", "tiers": ["semantic"]})).await;
    assert_eq!(cities(&now), vec!["Berlin".to_string()]);
    // A bad instant names its field.
    let r = app
        .post("/v1/memories/search", &json!({"agent_id": agent, "query": "x", "filter": {"as_of": "yesterday"}}))
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(r.text().await.unwrap().contains("as_of"));
}

/// On Postgres the text leg's index holds each lexeme under a short key of
/// its row's tenant and agent (migration 0015), and two agents may share a
/// key. Such agents find each other's rows in the index, never in results:
/// every tier's rows are filtered by tenant and agent as well.
#[tokio::test]
async fn agents_whose_text_index_keys_coincide_see_only_their_own_memories() {
    let app = spawn_app().await;
    let tenant = app.config.auth.default_tenant.clone();
    let (a, b): (String, String) = match app.postgres_only("the agent keys of the text index") {
        // 300,000 names give about ten pairs of equal 32-bit keys.
        Some(pg) => sqlx::query_as(
            "SELECT min(agent), max(agent) FROM (SELECT 'agent-' || i AS agent, engram_agent_key($1, 'agent-' || i) \
             AS key FROM generate_series(1, 300000) AS i) AS s GROUP BY key HAVING count(*) > 1 LIMIT 1",
        )
        .bind(&tenant)
        .fetch_one(pg.pool())
        .await
        .expect("two agent names with one key"),
        None => ("agent-1".to_string(), "agent-2".to_string()),
    };
    let mine = [
        app.write_one(json!({"agent_id": a, "tier": "episodic", "content": "The zeppelin landed in Friedrichshafen."}))
            .await,
        app.write_one(json!({"agent_id": a, "tier": "semantic", "content": "Ada flies a zeppelin on weekends."})).await,
        app.write_one(
            json!({"agent_id": a, "skill_name": "zeppelin-mooring", "content": "Moor the zeppelin to the mast."}),
        )
        .await,
    ];
    let theirs = app
        .write_one(json!({"agent_id": b, "tier": "episodic", "content": "A zeppelin museum opened by the lake."}))
        .await;
    let ids = |results: &[Value]| -> Vec<Value> { results.iter().map(|r| r["memory"]["id"].clone()).collect() };

    let found = search(&app, json!({"agent_id": b, "query": "zeppelin Friedrichshafen mooring weekends"})).await;
    assert_eq!(ids(&found), [theirs["id"].clone()], "only B's own memory: {found:?}");
    let found = search(&app, json!({"agent_id": a, "query": "zeppelin museum lake"})).await;
    let mut got = ids(&found);
    got.sort_by_key(|v| v.to_string());
    let mut want: Vec<Value> = mine.iter().map(|m| m["id"].clone()).collect();
    want.sort_by_key(|v| v.to_string());
    assert_eq!(got, want, "only A's own memories: {found:?}");
}
