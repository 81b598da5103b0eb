//! Working memory: bounded, ordered sessions in Redis; and what happens when
//! Redis is down.

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{OwnRedis, expect_error, spawn_app_with};

/// Writes "turn 0" … "turn n-1" to session s of agent w; returns their ids.
async fn write_turns(app: &crate::helpers::TestApp, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let m = app
            .write_one(json!({"agent_id": "w", "session_id": "s", "tier": "working", "content": format!("turn {i}")}))
            .await;
        ids.push(m["id"].as_str().unwrap().to_string());
    }
    ids
}

#[tokio::test]
async fn a_session_keeps_its_newest_entries_in_order() {
    let app = spawn_app_with(|c| c.redis.working_max_entries = 3).await;
    let ids = write_turns(&app, 5).await;
    let (_, listed) = app.get_json("/v1/memories?agent_id=w&session_id=s&tier=working").await;
    let contents: Vec<&str> =
        listed["memories"].as_array().unwrap().iter().map(|m| m["content"].as_str().unwrap()).collect();
    // Newest first in listings; the two oldest were pushed out.
    assert_eq!(contents, ["turn 4", "turn 3", "turn 2"]);
    let (status, _) = app.get_json(&format!("/v1/memories/{}", ids[0])).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Another session of the same agent is separate.
    app.write_one(json!({"agent_id": "w", "session_id": "other", "tier": "working", "content": "elsewhere"})).await;
    let (_, listed) = app.get_json("/v1/memories?agent_id=w&session_id=s&tier=working").await;
    assert_eq!(listed["memories"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn a_session_is_kept_under_one_hash_tag_and_entries_of_the_old_layout_are_moved() {
    use fred::prelude::*;
    let app = spawn_app_with(|c| c.redis.working_max_entries = 2).await;
    if app.storage.pg().is_none() {
        return; // the embedded backend keeps working memory in a table
    }
    let redis = app.redis().await;
    let (prefix, tenant) = (&app.config.redis.key_prefix, &app.config.auth.default_tenant);
    let tag = format!("{{{tenant}:w:s}}");
    let list = format!("{prefix}:{tenant}:wm:l:{tag}");
    let ids = write_turns(&app, 3).await;
    // The list and its entries share the tag; the entry pushed out is gone
    // with its pointer.
    let listed: Vec<String> = redis.lrange(&list, 0, -1).await.unwrap();
    assert_eq!(listed, ids[1..]);
    for (i, id) in ids.iter().enumerate() {
        let entry = format!("{prefix}:{tenant}:wm:e:{tag}:{id}");
        let pointer: Option<String> = redis.get(format!("{prefix}:{tenant}:wm:p:{id}")).await.unwrap();
        let exists: i64 = redis.exists(&entry).await.unwrap();
        if i == 0 {
            assert_eq!((pointer, exists), (None, 0), "the evicted entry");
        } else {
            assert_eq!((pointer, exists), (Some(entry.clone()), 1));
            assert_eq!(fred::util::redis_keyslot(entry.as_bytes()), fred::util::redis_keyslot(list.as_bytes()));
        }
    }

    // An earlier version's layout: entries at wm:m:{id}, the list at
    // wm:s:{agent}:{session}. Rewrite the live entries that way.
    let old_list = format!("{prefix}:{tenant}:wm:s:w:s");
    for id in &ids[1..] {
        let entry = format!("{prefix}:{tenant}:wm:e:{tag}:{id}");
        let json: String = redis.get(&entry).await.unwrap();
        let _: () = redis.set(format!("{prefix}:{tenant}:wm:m:{id}"), json, None, None, false).await.unwrap();
        let _: i64 = redis.rpush(&old_list, id.as_str()).await.unwrap();
        // One key per call: on a cluster these are on different slots.
        let _: i64 = redis.del(entry).await.unwrap();
        let _: i64 = redis.del(format!("{prefix}:{tenant}:wm:p:{id}")).await.unwrap();
    }
    let _: i64 = redis.del(&list).await.unwrap();

    // The maintenance job moves them when a process starts: here a second
    // one on the same Redis, prefix and tenant. (The first one's own start-up
    // run may be late enough to move them first; either way they are moved
    // by a job at start, which is what the assertions below need.)
    let (same_prefix, same_tenant) = (prefix.clone(), tenant.clone());
    let app = spawn_app_with(move |c| {
        c.redis.working_max_entries = 2;
        c.redis.key_prefix = same_prefix;
        c.auth.default_tenant = same_tenant;
    })
    .await;
    let mut moved = false;
    for _ in 0..100 {
        if redis.exists::<i64, _>(&old_list).await.unwrap() == 0
            && app.get_json(&format!("/v1/memories/{}", ids[2])).await.0 == StatusCode::OK
            && app.get_json(&format!("/v1/memories/{}", ids[1])).await.0 == StatusCode::OK
        {
            moved = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(moved, "the job at start moved the old layout within 10 s");
    for (i, id) in ids.iter().enumerate().skip(1) {
        let (status, got) = app.get_json(&format!("/v1/memories/{id}")).await;
        assert_eq!((status, got["content"].as_str()), (StatusCode::OK, Some(format!("turn {i}").as_str())));
    }
    let (_, listed) = app.get_json("/v1/memories?agent_id=w&session_id=s&tier=working").await;
    let contents: Vec<&str> =
        listed["memories"].as_array().unwrap().iter().map(|m| m["content"].as_str().unwrap()).collect();
    assert_eq!(contents, ["turn 2", "turn 1"]);
    for key in [old_list, format!("{prefix}:{tenant}:wm:m:{}", ids[1])] {
        assert_eq!(redis.exists::<i64, _>(&key).await.unwrap(), 0, "the old keys are deleted: {key}");
    }
    // A second run finds nothing to move.
    let job = engram::jobs::maintenance::Maintenance { store: app.storage.clone(), clock: app.clock.clone() };
    assert_eq!(job.run_once().await.unwrap().working_entries_moved, 0);
}

#[tokio::test]
async fn with_redis_down_working_memory_is_503_and_the_rest_keeps_serving() {
    // Nothing listens on port 1.
    let app = spawn_app_with(|c| {
        c.redis.url = "redis://127.0.0.1:1".into();
        c.redis.timeout_ms = 200;
    })
    .await;
    if app.postgres_only("Redis").is_none() {
        return;
    }
    let r =
        app.post("/v1/memories", &json!({"agent_id": "r", "session_id": "s", "tier": "working", "content": "x"})).await;
    let retry_after = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
    expect_error(r, StatusCode::SERVICE_UNAVAILABLE, "service_unavailable").await;
    assert_eq!(retry_after.as_deref(), Some("5"));

    let m = app.write_one(json!({"agent_id": "r", "tier": "episodic", "content": "persistent still works"})).await;
    let (_, listed) = app.get_json("/v1/memories?agent_id=r").await;
    assert_eq!(listed["memories"][0]["id"], m["id"]);
    // A persistent memory is still readable by id; an unknown id cannot be
    // ruled out of working memory, so it is 503 rather than a false 404.
    let skill = app.write_one(json!({"agent_id": "r", "skill_name": "k", "content": "a skill"})).await;
    let (status, got) = app.get_json(&format!("/v1/memories/{}", skill["id"].as_str().unwrap())).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(got["content"], "a skill");
    let r = app.get(&format!("/v1/memories/{}", uuid::Uuid::new_v4())).await;
    expect_error(r, StatusCode::SERVICE_UNAVAILABLE, "service_unavailable").await;

    let (status, ready) = app.get_json("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(ready["checks"]["database"], "ok");
    assert_ne!(ready["checks"]["working_memory"], "ok");
}

/// An app on a Redis of its own (Postgres backend only: the embedded one has no Redis).
async fn app_on_own_redis(redis: &OwnRedis) -> Option<crate::helpers::TestApp> {
    let url = redis.url();
    let app = spawn_app_with(|c| {
        c.redis.url = url;
        c.redis.breaker_cooldown_ms = 300;
    })
    .await;
    app.postgres_only("Redis").is_some().then_some(app)
}

#[tokio::test]
async fn a_batch_committed_before_redis_failed_is_completed_once_by_its_retry_or_the_outbox() {
    let mut redis = OwnRedis::start();
    let Some(app) = app_on_own_redis(&redis).await else { return };
    let batch = |n: &str| {
        json!({"memories": [
            {"agent_id": "o", "session_id": "s", "tier": "working", "content": format!("working {n}")},
            {"agent_id": "o", "tier": "episodic", "content": format!("episode {n}")},
        ]})
    };
    // The batch `n` sent with its key; its status.
    let send = |n: &'static str, key: &'static str| {
        let request = app.client.post(format!("{}/v1/memories", app.base)).header("idempotency-key", key);
        let body = batch(n);
        async move { request.json(&body).send().await.unwrap().status() }
    };
    // Redis fails after the batch passed the breaker: the persistent part
    // commits, working memory is not written, the client gets no 201.
    redis.stop();
    for (n, key) in [("a", "key-a"), ("b", "key-b")] {
        assert_eq!(send(n, key).await, StatusCode::SERVICE_UNAVAILABLE, "{n}");
        tokio::time::sleep(std::time::Duration::from_millis(400)).await; // let the breaker probe again
    }
    redis.resume();

    // Batch a: the retry with its key writes the working entry, once. Until
    // the client has reconnected and the breaker has probed Redis again
    // (longer on a loaded machine) the retry is 503, as a client would see:
    // it retries again.
    let mut retried = None;
    for _ in 0..50 {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let status = send("a", "key-a").await;
        if status != StatusCode::SERVICE_UNAVAILABLE {
            retried = Some(status);
            break;
        }
    }
    assert_eq!(retried, Some(StatusCode::CREATED));
    assert_eq!(send("a", "key-a").await, StatusCode::CREATED);
    // Batch b: nobody retries; the outbox job writes its working entry.
    app.clock.advance(chrono::Duration::seconds(30));
    let outbox = engram::jobs::outbox::Outbox { service: app.service.clone() };
    // Its first pass may still meet the Redis client reconnecting (a
    // timeout, seen on a loaded machine); the job's next tick tries again,
    // as this loop does.
    let mut written = None;
    for _ in 0..25 {
        match outbox.run_once().await {
            Ok(n) => {
                written = Some(n);
                break;
            }
            Err(e) => {
                eprintln!("outbox pass failed, retried: {e:#}");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    }
    assert_eq!(written, Some(1));
    assert_eq!(outbox.run_once().await.unwrap(), 0);

    let contents = |listed: &serde_json::Value| {
        let mut c: Vec<String> =
            listed["memories"].as_array().unwrap().iter().map(|m| m["content"].as_str().unwrap().to_string()).collect();
        c.sort();
        c
    };
    let (_, working) = app.get_json("/v1/memories?agent_id=o&session_id=s&tier=working&limit=50").await;
    assert_eq!(contents(&working), ["working a", "working b"]);
    let (_, episodes) = app.get_json("/v1/memories?agent_id=o&tier=episodic&limit=50").await;
    assert_eq!(contents(&episodes), ["episode a", "episode b"]);
}

#[tokio::test]
async fn a_skill_updated_while_redis_was_down_is_never_served_stale_from_its_old_data() {
    let mut redis = OwnRedis::start();
    let Some(app) = app_on_own_redis(&redis).await else { return };
    let skill = app.write_one(json!({"agent_id": "k", "skill_name": "brew", "content": "old recipe"})).await;
    let path = format!("/v1/memories/{}", skill["id"].as_str().unwrap());
    let (_, got) = app.get_json(&path).await; // cached now
    assert_eq!(got["content"], "old recipe");
    redis.save();
    redis.stop();
    let r = app.patch(&path, &json!({"content": "new recipe"})).await;
    assert_eq!(r.status(), StatusCode::OK);
    // Redis comes back with the cached old skill.
    redis.resume();
    for _ in 0..10 {
        let (status, got) = app.get_json(&path).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(got["content"], "new recipe");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn while_redis_is_down_reads_fail_fast_searches_say_so_and_recovery_needs_no_restart() {
    let mut redis = OwnRedis::start();
    let Some(app) = app_on_own_redis(&redis).await else { return };
    let m = app.write_one(json!({"agent_id": "f", "tier": "episodic", "content": "the kettle is blue"})).await;
    let path = format!("/v1/memories/{}", m["id"].as_str().unwrap());
    redis.stop();
    // Each read would wait the 1 s Redis timeout without the breaker.
    let started = std::time::Instant::now();
    for _ in 0..20 {
        let (status, got) = app.get_json(&path).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(got["content"], "the kettle is blue");
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    let search = json!({"agent_id": "f", "session_id": "s", "query": "kettle colour"});
    let (status, found) = crate::helpers::post_json(&app, "/v1/memories/search", &search).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(found["warnings"], json!(["working_memory_unavailable"]));
    assert_eq!(found["results"][0]["memory"]["content"], "the kettle is blue", "{found}");

    redis.resume();
    let mut written = None;
    for _ in 0..50 {
        let r = app
            .post(
                "/v1/memories",
                &json!({"agent_id": "f", "session_id": "s", "tier": "working", "content": "kettle on"}),
            )
            .await;
        if r.status() == StatusCode::CREATED {
            written = Some(r);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(written.is_some(), "working memory is written again once Redis is back");
    let (_, found) = crate::helpers::post_json(&app, "/v1/memories/search", &search).await;
    assert_eq!(found["warnings"], json!([]));
    assert!(found["results"].as_array().unwrap().iter().any(|r| r["memory"]["content"] == "kettle on"), "{found}");
}

#[tokio::test]
async fn while_redis_is_down_a_session_listing_leaves_working_memory_out_and_says_so() {
    let mut redis = OwnRedis::start();
    let url = redis.url();
    let app = spawn_app_with(|c| {
        c.redis.url = url;
        c.redis.breaker_cooldown_ms = 300;
    })
    .await;
    let working =
        app.write_one(json!({"agent_id": "l", "session_id": "s", "tier": "working", "content": "kettle on"})).await;
    let episode = app
        .write_one(json!({"agent_id": "l", "session_id": "s", "tier": "episodic", "content": "the kettle is blue"}))
        .await;
    let ids = |listed: &serde_json::Value| -> Vec<String> {
        let mut ids: Vec<String> =
            listed["memories"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_string()).collect();
        ids.sort();
        ids
    };
    let (working, episode) = (working["id"].as_str().unwrap().to_string(), episode["id"].as_str().unwrap().to_string());
    let mut both = vec![working.clone(), episode.clone()];
    both.sort();
    let session = "/v1/memories?agent_id=l&session_id=s";
    // Nothing left out: on the embedded backend working memory is in the
    // same database and this is all there is to see.
    let (status, listed) = app.get_json(session).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["warnings"], json!([]), "{listed}");
    assert_eq!(ids(&listed), both);
    if app.postgres_only("Redis").is_none() {
        return;
    }

    redis.save(); // the entry is there again when Redis comes back
    redis.stop();
    let (status, listed) = app.get_json(session).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["warnings"], json!(["working_memory_unavailable"]), "{listed}");
    assert_eq!(ids(&listed), [episode.as_str()]);
    // A listing that does not ask for working memory leaves nothing out.
    let (_, listed) = app.get_json(&format!("{session}&tier=episodic")).await;
    assert_eq!(listed["warnings"], json!([]), "{listed}");
    assert_eq!(ids(&listed), [episode.as_str()]);
    // Working memory alone cannot be listed without it.
    let r = app.get(&format!("{session}&tier=working")).await;
    expect_error(r, StatusCode::SERVICE_UNAVAILABLE, "service_unavailable").await;

    redis.resume();
    let mut listed = serde_json::Value::Null;
    for _ in 0..50 {
        listed = app.get_json(session).await.1;
        if listed["warnings"] == json!([]) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(listed["warnings"], json!([]), "working memory is listed again once Redis is back: {listed}");
    assert_eq!(ids(&listed), both);
}
