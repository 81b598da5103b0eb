//! Consolidation: episodes old enough become summaries (verbatim sentences,
//! naming their sources) and facts of their user (read off first-person
//! statements, with the least trust), each episode once; what was made from
//! a user's episodes goes with the user's erasure. On both backends.

use std::time::Duration;

use chrono::Duration as Age;
use engram::config::{ApiKeyConfig, Scope};
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::erasure::{spawn_isolated, wait_for};
use crate::helpers::{TestApp, expect_error, post_json};

/// Asks for a run of `agent` and waits until it ends; returns the job.
async fn consolidate(app: &TestApp, agent: &str) -> Value {
    let r = app.post("/v1/consolidation", &json!({"agent_id": agent})).await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let location = r.headers()["location"].to_str().unwrap().to_string();
    let job: Value = r.json().await.unwrap();
    assert_eq!(location, format!("/v1/consolidation/{}", job["id"].as_str().unwrap()));
    let mut last = Value::Null;
    for _ in 0..300 {
        let (status, body) = app.get_json(&location).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        if body["state"] == "completed" || body["state"] == "failed" {
            assert_eq!(body["state"], "completed", "{body}");
            return body;
        }
        last = body;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("consolidation never ended: {last}");
}

async fn all_of(app: &TestApp, agent: &str, tier: &str) -> Vec<Value> {
    let (status, page) = app.get_json(&format!("/v1/memories?agent_id={agent}&tier={tier}&limit=200")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    page["memories"].as_array().unwrap().clone()
}

fn derived(memories: &[Value]) -> Vec<Value> {
    memories.iter().filter(|m| m["metadata"].get("consolidation").is_some()).cloned().collect()
}

#[tokio::test]
async fn old_episodes_become_summaries_and_facts_once_and_the_users_erasure_takes_them() {
    // Batches of three: a run reads batch after batch until none is left.
    let app = spawn_isolated(|c| c.consolidation.batch_size = 3).await;
    let episode = |user: &str, content: &str| json!({"agent_id": "a", "user_id": user, "session_id": "s1", "tier": "episodic", "content": content});
    // The agent's own word on Ann's job, which a consolidated fact must not replace.
    app.write_one(json!({"agent_id": "a", "user_id": "ann", "tier": "semantic", "content": "Ann is a teacher",
                          "subject": "ann", "predicate": "works_as", "object": "teacher"}))
        .await;
    let ann = app
        .write(json!({"memories": [
            episode("ann", "My name is Ann. I work as a nurse at the city hospital."),
            episode("ann", "We decided to move the team offsite to Friday."),
            episode("ann", "I'm allergic to peanuts, so no satay for me."),
        ]}))
        .await;
    let bob = app
        .write(json!({"memories": [
            episode("bob", "I live in Lisbon and I have a dog named Rex."),
            episode("bob", "The deploy failed twice because of a timeout."),
        ]}))
        .await;
    // Ages count from ingestion: nothing is old enough yet.
    let job = consolidate(&app, "a").await;
    assert_eq!(job["report"]["episodes"], 0, "{job}");

    app.clock.advance(Age::hours(2));
    let late = app.write_one(episode("ann", "I love hiking in the mountains.")).await;
    let job = consolidate(&app, "a").await;
    let report = &job["report"];
    assert_eq!(report["episodes"], 5, "{job}");
    assert_eq!(report["summaries"], 2, "one per user's session: {job}");
    assert!(report["facts"].as_u64().unwrap() >= 3, "{job}");
    assert_eq!(report["facts_candidates"], 1, "the nurse fact stays behind the agent's teacher fact: {job}");
    assert_eq!(job["requested_by"], "keyless");

    let summaries = derived(&all_of(&app, "a", "episodic").await);
    assert_eq!(summaries.len(), 2, "{summaries:?}");
    let of_ann = summaries.iter().find(|s| s["user_id"] == "ann").unwrap();
    let c = &of_ann["metadata"]["consolidation"];
    assert_eq!(c["method"], "extractive");
    assert_eq!(c["job_id"], job["id"]);
    let ids: Vec<&Value> = ann.iter().map(|m| &m["id"]).collect();
    assert_eq!(c["source_episode_ids"].as_array().unwrap().iter().collect::<Vec<_>>(), ids);
    // Verbatim: every sentence of the summary is in one of its episodes.
    let text = of_ann["content"].as_str().unwrap();
    assert!(text.contains("nurse") || text.contains("peanuts"), "{text}");
    for sentence in text.split_inclusive(['.', '!', '?']).map(str::trim).filter(|s| !s.is_empty()) {
        assert!(ann.iter().any(|m| m["content"].as_str().unwrap().contains(sentence)), "{sentence}");
    }

    let facts = derived(&all_of(&app, "a", "semantic").await);
    let fact = |subject: &str, predicate: &str| {
        facts.iter().find(|f| f["subject"] == subject && f["predicate"] == predicate).cloned()
    };
    let allergy = fact("ann", "allergic_to").expect("ann's allergy");
    assert_eq!(allergy["object"], "peanuts");
    assert_eq!(allergy["source"], "consolidated");
    assert_eq!(allergy["source_episode_id"], ann[2]["id"]);
    assert_eq!(allergy["metadata"]["consolidation"]["method"], "rules");
    assert!(fact("bob", "lives_in").is_some(), "{facts:?}");
    // Recall finds the fact; the agent's own word on the job still stands.
    let (_, found) = post_json(
        &app,
        "/v1/memories/search",
        &json!({"agent_id": "a", "query": "What is Ann allergic to?", "tiers": ["semantic"]}),
    )
    .await;
    assert_eq!(found["results"][0]["memory"]["id"], allergy["id"], "{found}");
    let (_, listed) = app.get_json("/v1/memories?agent_id=a&tier=semantic&include_superseded=true&limit=200").await;
    let jobs: Vec<&Value> =
        listed["memories"].as_array().unwrap().iter().filter(|f| f["predicate"] == "works_as").collect();
    let teacher = jobs.iter().find(|f| f["object"] == "teacher").expect("the agent's fact");
    let nurse = jobs.iter().find(|f| f["object"] == "nurse").expect("the consolidated fact");
    assert_eq!(teacher["valid_until"], Value::Null, "{teacher}");
    assert_eq!(nurse["contested_by"], teacher["id"], "{nurse}");

    // Each episode once: a second run takes only what became old since.
    app.clock.advance(Age::hours(2));
    let again = consolidate(&app, "a").await;
    assert_eq!(again["report"]["episodes"], 1, "only the late episode: {again}");
    assert_eq!(again["report"]["summaries"], 0, "one episode is not summarised: {again}");
    let hiking = derived(&all_of(&app, "a", "semantic").await)
        .into_iter()
        .find(|f| f["source_episode_id"] == late["id"])
        .expect("a fact from the late episode");
    assert_eq!(hiking["predicate"], "likes");

    // Erasing Ann takes her summary and facts; Bob's stay.
    let (status, accepted) = post_json(&app, "/v1/erasure", &json!({"user_id": "ann"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    wait_for(&app, accepted["id"].as_str().unwrap(), "completed").await;
    let left: Vec<Value> = [all_of(&app, "a", "episodic").await, all_of(&app, "a", "semantic").await].concat();
    assert!(left.iter().all(|m| m["user_id"] != "ann"), "{left:?}");
    assert!(derived(&left).iter().any(|m| m["user_id"] == "bob"), "{left:?}");

    // Erasing one of Bob's episodes by id takes the summary made from it.
    let (status, accepted) = post_json(&app, "/v1/erasure", &json!({"memory_ids": [bob[1]["id"]]})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    wait_for(&app, accepted["id"].as_str().unwrap(), "completed").await;
    assert!(derived(&all_of(&app, "a", "episodic").await).is_empty(), "Bob's summary went with its episode");
    let facts = derived(&all_of(&app, "a", "semantic").await);
    assert!(facts.iter().any(|f| f["predicate"] == "lives_in"), "a fact from another episode stays: {facts:?}");
}

#[tokio::test]
async fn episodes_naming_a_skill_move_its_counters_once() {
    let app = spawn_isolated(|_| {}).await;
    let skill = app
        .write_one(json!({"agent_id": "a", "tier": "procedural", "skill_name": "book_flight",
                          "content": "Book a flight through the airline API", "outcome": "success"}))
        .await;
    let id = skill["id"].as_str().unwrap();
    // Read once, so a stale cached copy would show.
    let (_, before) = app.get_json(&format!("/v1/memories/{id}")).await;
    assert_eq!((before["success_count"].as_i64(), before["failure_count"].as_i64()), (Some(1), Some(0)), "{before}");
    let used = |skill: &str, outcome: &str| {
        json!({"agent_id": "a", "session_id": "s", "tier": "episodic", "content": format!("Tried {skill}: {outcome}"),
               "outcome": outcome, "metadata": {"skill": skill}})
    };
    app.write(json!({"memories": [
        used("book_flight", "success"), used("book_flight", "failure"), used("book_flight", "failure"),
        used("book_flight", "partial"), used("no_such_skill", "success"),
        {"agent_id": "a", "session_id": "s", "tier": "episodic", "content": "No skill here", "outcome": "failure"},
    ]}))
    .await;
    app.clock.advance(Age::hours(2));
    let job = consolidate(&app, "a").await;
    assert_eq!(job["report"]["skills_updated"], 1, "{job}");
    let (_, after) = app.get_json(&format!("/v1/memories/{id}")).await;
    assert_eq!((after["success_count"].as_i64(), after["failure_count"].as_i64()), (Some(2), Some(2)), "{after}");
    assert_eq!(after["success_rate"], 0.5, "{after}");
    assert_eq!((&after["version"], &after["content"]), (&before["version"], &before["content"]), "{after}");

    // Each episode counts once.
    app.clock.advance(Age::hours(2));
    let again = consolidate(&app, "a").await;
    assert_eq!((again["report"]["episodes"].as_u64(), again["report"]["skills_updated"].as_u64()), (Some(0), Some(0)));
    let (_, last) = app.get_json(&format!("/v1/memories/{id}")).await;
    assert_eq!(last["success_count"], 2, "{last}");
}

#[tokio::test]
async fn covered_episodes_are_deleted_or_shortened_as_configured_and_erasure_still_finds_what_replaced_them() {
    let episode = |session: &str, content: &str| json!({"agent_id": "a", "user_id": "ann", "session_id": session, "tier": "episodic", "content": content});
    let batch = json!({"memories": [
        episode("s1", "My name is Ann and I'm allergic to peanuts."),
        episode("s1", "We decided to ship the beta on Friday."),
        episode("s1", "The deploy failed because of a timeout."),
        episode("s2", "I live in Lisbon."),
    ]});

    // delete: the summary and the facts replace the episodes they cover; a
    // lone episode (nothing summarises it) stays.
    let app = spawn_isolated(|c| c.consolidation.sources = "delete".into()).await;
    let eps = app.write(batch.clone()).await;
    app.clock.advance(Age::hours(2));
    let job = consolidate(&app, "a").await;
    assert_eq!((job["report"]["episodes"].as_u64(), job["report"]["episodes_deleted"].as_u64()), (Some(4), Some(3)));
    for e in &eps[..3] {
        let r = app.get(&format!("/v1/memories/{}", e["id"].as_str().unwrap())).await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{e}");
    }
    let (status, _) = app.get_json(&format!("/v1/memories/{}", eps[3]["id"].as_str().unwrap())).await;
    assert_eq!(status, StatusCode::OK, "the lone episode stays");
    let summaries = derived(&all_of(&app, "a", "episodic").await);
    assert_eq!(summaries.len(), 1, "{summaries:?}");
    let sources = summaries[0]["metadata"]["consolidation"]["source_episode_ids"].as_array().unwrap().clone();
    assert_eq!(sources.len(), 3);
    let facts = derived(&all_of(&app, "a", "semantic").await);
    assert!(facts.iter().any(|f| f["predicate"] == "allergic_to"), "{facts:?}");
    // Ann's erasure finds the summary and facts by her id, their sources gone.
    let (status, accepted) = post_json(&app, "/v1/erasure", &json!({"user_id": "ann"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    wait_for(&app, accepted["id"].as_str().unwrap(), "completed").await;
    let left = [all_of(&app, "a", "episodic").await, all_of(&app, "a", "semantic").await].concat();
    assert!(left.is_empty(), "{left:?}");

    // shorten: they live at most sources_retention_secs more.
    let app = spawn_isolated(|c| {
        c.consolidation.sources = "shorten".into();
        c.consolidation.sources_retention_secs = 3600;
    })
    .await;
    let eps = app.write(batch).await;
    app.clock.advance(Age::hours(2));
    let job = consolidate(&app, "a").await;
    assert_eq!(job["report"]["episodes_shortened"], 3, "{job}");
    let (_, covered) = app.get_json(&format!("/v1/memories/{}", eps[0]["id"].as_str().unwrap())).await;
    let expires: chrono::DateTime<chrono::Utc> = covered["expires_at"].as_str().unwrap().parse().unwrap();
    let created: chrono::DateTime<chrono::Utc> = covered["created_at"].as_str().unwrap().parse().unwrap();
    assert_eq!(expires - created, Age::hours(3), "consolidated two hours after it was written, plus one: {covered}");
    let (_, lone) = app.get_json(&format!("/v1/memories/{}", eps[3]["id"].as_str().unwrap())).await;
    assert_eq!(lone["expires_at"], eps[3]["expires_at"], "{lone}");
    app.clock.advance(Age::hours(2));
    for e in &eps[..3] {
        let r = app.get(&format!("/v1/memories/{}", e["id"].as_str().unwrap())).await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "expired: {e}");
    }
    assert_eq!(derived(&all_of(&app, "a", "episodic").await).len(), 1, "the summary keeps its own retention");
}

#[tokio::test]
async fn a_fact_that_nearly_repeats_one_of_the_same_predicate_is_merged_into_it() {
    // The bundled model: the default threshold is set for it.
    let app = spawn_isolated(crate::helpers::use_local_model).await;
    let said = |content: &str| json!({"agent_id": "a", "user_id": "ann", "tier": "episodic", "content": content});
    // The agent's own fact, more trusted than anything consolidation reads.
    let own = app
        .write_one(json!({"agent_id": "a", "user_id": "ann", "tier": "semantic", "content": "Ann likes hiking",
                          "subject": "ann", "predicate": "likes", "object": "hiking"}))
        .await;
    app.write(json!({"memories": [said("I love going hiking."), said("I love jazz.")]})).await;
    app.clock.advance(Age::hours(2));
    consolidate(&app, "a").await;
    let (_, listed) = app.get_json("/v1/memories?agent_id=a&tier=semantic&include_superseded=true&limit=200").await;
    let likes: Vec<&Value> =
        listed["memories"].as_array().unwrap().iter().filter(|f| f["predicate"] == "likes").collect();
    let current: Vec<&str> =
        likes.iter().filter(|f| f["valid_until"].is_null()).map(|f| f["object"].as_str().unwrap()).collect();
    assert_eq!(current.len(), 2, "hiking once and jazz: {likes:?}");
    assert!(current.contains(&"jazz"), "{likes:?}");
    let (_, still) = app.get_json(&format!("/v1/memories/{}", own["id"].as_str().unwrap())).await;
    assert_eq!(still["valid_until"], Value::Null, "the agent's fact stays current: {still}");
}

#[tokio::test]
async fn a_summary_gives_way_to_the_episodes_it_covers_in_search_and_stands_for_them_once_they_are_gone() {
    let app = spawn_isolated(|_| {}).await;
    let said = |content: &str| json!({"agent_id": "a", "session_id": "s", "tier": "episodic", "content": content});
    let eps = app
        .write(json!({"memories": [
            said("We decided to move the product launch to Friday."),
            said("The launch venue is the harbour warehouse."),
            said("Catering for the launch was booked with Rosa's kitchen."),
        ]}))
        .await;
    app.clock.advance(Age::hours(2));
    consolidate(&app, "a").await;
    let summary = derived(&all_of(&app, "a", "episodic").await).pop().expect("a summary");
    async fn search(app: &TestApp) -> Vec<Value> {
        let q = json!({"agent_id": "a", "query": "When and where is the product launch?", "top_k": 10});
        let (status, found) = post_json(app, "/v1/memories/search", &q).await;
        assert_eq!(status, StatusCode::OK, "{found}");
        found["results"].as_array().unwrap().iter().map(|r| r["memory"]["id"].clone()).collect()
    }
    let ids = search(&app).await;
    assert!(!ids.contains(&summary["id"]), "the summary beside its episodes: {ids:?}");
    assert!(eps.iter().all(|e| ids.contains(&e["id"])), "{ids:?}");

    // Once its episodes are gone the summary is what recall finds.
    for e in &eps {
        let r = app.delete(&format!("/v1/memories/{}", e["id"].as_str().unwrap())).await;
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
    }
    assert_eq!(search(&app).await, vec![summary["id"].clone()]);
}

#[tokio::test]
async fn a_job_is_the_tenants_and_its_agents_and_bad_requests_name_the_field() {
    let t = format!("s-{}", Uuid::new_v4().simple());
    let server = spawn_isolated(|c| {
        c.auth.keys = vec![
            ApiKeyConfig { agents: vec!["a".into()], ..ApiKeyConfig::from_plain(&t, "key-a", Scope::ReadWrite) },
            ApiKeyConfig::from_plain(&t, "key-all", Scope::ReadWrite),
            ApiKeyConfig::from_plain("other", "key-other", Scope::ReadWrite),
        ];
    })
    .await;
    let [ka, kall, other] = ["key-a", "key-all", "key-other"].map(|k| server.as_key(k));
    let job = consolidate(&kall, "b").await;
    let path = format!("/v1/consolidation/{}", job["id"].as_str().unwrap());
    expect_error(ka.get(&path).await, StatusCode::NOT_FOUND, "job_not_found").await;
    expect_error(other.get(&path).await, StatusCode::NOT_FOUND, "job_not_found").await;
    let e = expect_error(
        ka.post("/v1/consolidation", &json!({"agent_id": "b"})).await,
        StatusCode::FORBIDDEN,
        "agent_not_allowed",
    )
    .await;
    assert_eq!(e["error"]["field"], "/agent_id");
    let e = expect_error(
        ka.post("/v1/consolidation", &json!({"agent": "a"})).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_field",
    )
    .await;
    assert_eq!(e["error"]["field"], "/agent");
    let e =
        expect_error(kall.get("/v1/consolidation/nope").await, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field").await;
    assert_eq!(e["error"]["field"], "id");
    expect_error(
        kall.get(&format!("/v1/consolidation/{}", Uuid::now_v7())).await,
        StatusCode::NOT_FOUND,
        "job_not_found",
    )
    .await;
}

#[tokio::test]
async fn two_servers_on_one_database_consolidate_twenty_agents_each_episode_once() {
    if crate::helpers::embedded() {
        eprintln!("skipped on the embedded backend: one process owns its data directory");
        return;
    }
    // Two servers, each with its own pool, worker and locks, as two
    // processes have; one tenant, one database.
    let db = crate::helpers::fresh_database().await;
    let tenant = format!("t-{}", Uuid::new_v4().simple());
    let both = |c: &mut engram::config::Config| {
        c.database.url = db.clone();
        c.auth.default_tenant = tenant.clone();
    };
    let a = crate::helpers::spawn_app_with(both).await;
    let b = crate::helpers::spawn_app_with(both).await;
    let agents: Vec<String> = (0..20).map(|i| format!("agent-{i}")).collect();
    for agent in &agents {
        let memories: Vec<Value> = (0..6)
            .map(|i| {
                json!({"agent_id": agent, "user_id": format!("u{}", i % 2), "session_id": "s", "tier": "episodic",
                       "content": format!("I live in Porto. Step {i} of the plan for {agent} is done.")})
            })
            .collect();
        a.write(json!({ "memories": memories })).await;
    }
    a.clock.advance(Age::hours(2));
    b.clock.advance(Age::hours(2));
    // Every agent asked of both servers at once: 40 jobs, taken by either
    // server's worker, two for each agent.
    let asked = agents.iter().flat_map(|agent| {
        [&a, &b].map(|app| async move {
            let r = app.post("/v1/consolidation", &json!({"agent_id": agent})).await;
            assert_eq!(r.status(), StatusCode::ACCEPTED);
            r.headers()["location"].to_str().unwrap().to_string()
        })
    });
    let locations = futures::future::join_all(asked).await;
    let mut episodes = 0;
    for location in &locations {
        let mut job = Value::Null;
        for _ in 0..600 {
            job = a.get_json(location).await.1;
            if job["state"] == "completed" || job["state"] == "failed" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(job["state"], "completed", "{job}");
        episodes += job["report"]["episodes"].as_u64().unwrap();
    }
    assert_eq!(episodes, 120, "each of the 120 episodes once");
    for agent in &agents {
        let summaries = derived(&all_of(&a, agent, "episodic").await);
        assert_eq!(summaries.len(), 2, "one summary per user's session of {agent}: {summaries:?}");
    }
    let pg = sqlx::PgPool::connect(&db).await.unwrap();
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM episodic_memory WHERE consolidated_at IS NULL AND NOT (metadata ? 'consolidation')",
    )
    .fetch_one(&pg)
    .await
    .unwrap();
    assert_eq!(waiting, 0);
    pg.close().await;
}

/// Backends waiting on a heavyweight lock (an advisory lock or a row's
/// transaction) in this database.
async fn waiting_on_locks(pg: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .fetch_one(pg)
    .await
    .unwrap()
}

async fn until_waiting(pg: &sqlx::PgPool, n: i64, what: &str) {
    for _ in 0..300 {
        if waiting_on_locks(pg).await >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what} never waited on a lock");
}

#[tokio::test]
async fn an_erasure_by_ids_while_a_consolidation_commits_takes_the_summary_of_the_erased_episode() {
    if crate::helpers::embedded() {
        eprintln!("skipped on the embedded backend: one write transaction at a time, so the two cannot interleave");
        return;
    }
    // With and without a user: the user's lock orders the two in the first
    // case, the episodes' row locks in the second.
    for user in [Some("ann"), None] {
        let db = crate::helpers::fresh_database().await;
        let tenant = format!("t-{}", Uuid::new_v4().simple());
        let app = crate::helpers::spawn_app_with(|c| {
            c.database.url = db.clone();
            c.auth.default_tenant = tenant.clone();
        })
        .await;
        let pg = sqlx::PgPool::connect(&db).await.unwrap();
        app.write_one(json!({"agent_id": "a", "tier": "procedural", "skill_name": "deploy",
                              "content": "Deploy with the blue script"}))
            .await;
        let episode = |content: &str| {
            json!({"agent_id": "a", "user_id": user, "session_id": "s", "tier": "episodic", "content": content,
                   "outcome": "success", "metadata": {"skill": "deploy"}})
        };
        let written = app
            .write(json!({"memories": [
                episode("The door code for the lab is 7316, said the caller."),
                episode("The deploy went out at noon without trouble."),
            ]}))
            .await;
        let erased = written[0]["id"].as_str().unwrap().to_string();
        app.clock.advance(Age::hours(2));

        // The test holds the skill's lock, which the consolidation takes
        // after it has marked the episodes and before it writes the summary:
        // the consolidation stops right there, uncommitted.
        let mut hold = pg.begin().await.unwrap();
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(format!("skill\u{1f}{tenant}\u{1f}a\u{1f}deploy"))
            .execute(&mut *hold)
            .await
            .unwrap();
        let r = app.post("/v1/consolidation", &json!({"agent_id": "a"})).await;
        assert_eq!(r.status(), StatusCode::ACCEPTED);
        let job = r.headers()["location"].to_str().unwrap().to_string();
        until_waiting(&pg, 1, "the consolidation").await;

        // The erasure of one episode starts while the summary is unwritten.
        let erasure = tokio::spawn({
            let (client, base, erased) = (app.client.clone(), app.base.clone(), erased.clone());
            async move {
                let r = client.post(format!("{base}/v1/erasure")).json(&json!({"memory_ids": [erased]})).send().await;
                let r = r.unwrap();
                (r.status(), r.json::<Value>().await.unwrap())
            }
        });
        until_waiting(&pg, 2, "the erasure").await;
        hold.rollback().await.unwrap();

        let (status, receipt) = erasure.await.unwrap();
        assert_eq!(status, StatusCode::ACCEPTED, "{receipt}");
        wait_for(&app, receipt["id"].as_str().unwrap(), "completed").await;
        let mut done = Value::Null;
        for _ in 0..300 {
            done = app.get_json(&job).await.1;
            if done["state"] == "completed" || done["state"] == "failed" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(done["state"], "completed", "{done}");
        assert_eq!(done["report"]["summaries"], 1, "the consolidation wrote its summary: {done}");

        // The summary quoted the erased episode, so it went with it.
        let left = all_of(&app, "a", "episodic").await;
        let quoting: Vec<&Value> = left.iter().filter(|m| m["content"].as_str().unwrap().contains("7316")).collect();
        assert!(quoting.is_empty(), "user {user:?}: the erased episode lives on in {quoting:?}");
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM episodic_memory WHERE content LIKE '%7316%'")
            .fetch_one(&pg)
            .await
            .unwrap();
        assert_eq!(rows, 0, "user {user:?}: rows quoting the erased episode are still stored");
        pg.close().await;
    }
}
