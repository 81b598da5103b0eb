//! Legal holds: a hold on a user refuses erasures that would touch the
//! user's memories (naming the hold), keeps the retention sweep, its dry
//! run and its backlog away from them until it is released, is refused
//! while an erasure of the user is unfinished, is audited, and is the
//! tenant's own. Stores are checked directly, as the retention tests do.

use chrono::Duration;
use engram::config::{ApiKeyConfig, Scope};
use engram::domain::Tier;
use engram::domain::retention::Reason;
use engram::store::SweepLease;
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::erasure::{spawn_isolated, wait_for};
use crate::helpers::{TestApp, expect_error, post_json};
use crate::retention::{done, id_of, stored_rows, sweeping_app};

/// A server with a read-write and an admin key (id `ops-1`) on one tenant,
/// and an admin key on another.
async fn keyed() -> (TestApp, TestApp, TestApp, TestApp) {
    let (t1, t2) = (format!("h-{}", Uuid::new_v4().simple()), format!("h-{}", Uuid::new_v4().simple()));
    let server = spawn_isolated(|c| {
        c.auth.keys = vec![
            ApiKeyConfig::from_plain(&t1, "writer-1", Scope::ReadWrite),
            ApiKeyConfig { id: "ops-1".into(), ..ApiKeyConfig::from_plain(&t1, "admin-1", Scope::Admin) },
            ApiKeyConfig::from_plain(&t2, "admin-2", Scope::Admin),
        ];
    })
    .await;
    let (writer, admin, other) = (server.as_key("writer-1"), server.as_key("admin-1"), server.as_key("admin-2"));
    (server, writer, admin, other)
}

/// Places a hold and expects 201; returns it.
async fn place(app: &TestApp, body: Value) -> Value {
    let r = app.post("/v1/holds", &body).await;
    let status = r.status();
    let location = r.headers().get("location").map(|v| v.to_str().unwrap().to_string());
    let hold: Value = r.json().await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "{hold}");
    assert_eq!(location, Some(format!("/v1/holds/{}", hold["id"].as_str().unwrap())));
    hold
}

/// The erasure worker's lease, taken so that accepted erasures stay
/// unfinished (the worker skips its pass while the lease is held).
async fn hold_the_erasure_worker(app: &TestApp) -> SweepLease {
    for _ in 0..200 {
        if let Some(lease) = app.storage.erasure.try_lease().await.unwrap() {
            return lease;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("the erasure worker never let go of its lease");
}

#[tokio::test]
async fn a_held_user_cannot_be_erased_by_user_or_by_memory_id_and_other_users_still_can() {
    let (_server, writer, admin, _) = keyed().await;
    let written = writer
        .write(json!({"memories": [
            {"agent_id": "a", "user_id": "alice", "tier": "episodic", "content": "Alice signed the contract"},
            {"agent_id": "a", "user_id": "alice", "tier": "semantic", "content": "Alice works at Acme"},
            {"agent_id": "a", "user_id": "bob", "tier": "episodic", "content": "Bob called"},
            {"agent_id": "a", "user_id": "carol", "tier": "episodic", "content": "Carol wrote"},
        ]}))
        .await;
    let hold = place(&admin, json!({"user_id": "alice", "reason": "Matter 2026-114"})).await;
    let hold_id = hold["id"].as_str().unwrap();
    assert_eq!(hold["user_id"], "alice");
    assert_eq!(hold["reason"], "Matter 2026-114");
    assert_eq!(hold["placed_by"], "ops-1");
    assert_eq!(hold["active"], true);
    assert_eq!(hold["released_at"], Value::Null);

    for body in [
        json!({"user_id": "alice"}),
        json!({"user_id": "alice", "agent_id": "a"}),
        json!({"memory_ids": [written[0]["id"]]}),
        // One held memory among others refuses the whole request.
        json!({"memory_ids": [written[2]["id"], written[1]["id"]]}),
    ] {
        let r = admin.post("/v1/erasure", &body).await;
        let e = expect_error(r, StatusCode::CONFLICT, "legal_hold").await;
        assert!(e["error"]["message"].as_str().unwrap().contains(hold_id), "{body}: {e}");
    }
    // Nothing was hidden by a refused erasure.
    for m in &written {
        let (status, got) = writer.get_json(&format!("/v1/memories/{}", m["id"].as_str().unwrap())).await;
        assert_eq!(status, StatusCode::OK, "{got}");
    }

    let (status, by_user) = post_json(&admin, "/v1/erasure", &json!({"user_id": "bob"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{by_user}");
    let (status, by_id) = post_json(&admin, "/v1/erasure", &json!({"memory_ids": [written[3]["id"]]})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{by_id}");
    wait_for(&admin, by_user["id"].as_str().unwrap(), "completed").await;
    wait_for(&admin, by_id["id"].as_str().unwrap(), "completed").await;
    assert_eq!(
        writer.get_json(&format!("/v1/memories/{}", written[0]["id"].as_str().unwrap())).await.0,
        StatusCode::OK
    );

    // Released: the erasure goes through.
    let r = admin.delete(&format!("/v1/holds/{hold_id}")).await;
    assert_eq!(r.status(), StatusCode::OK);
    let (status, accepted) = post_json(&admin, "/v1/erasure", &json!({"user_id": "alice"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    wait_for(&admin, accepted["id"].as_str().unwrap(), "completed").await;
    assert_eq!(
        writer.get_json(&format!("/v1/memories/{}", written[0]["id"].as_str().unwrap())).await.0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn holds_are_listed_read_released_once_and_audited_with_the_key_that_acted() {
    let (_server, writer, admin, other) = keyed().await;
    let alice = place(&admin, json!({"user_id": "alice"})).await;
    let bob = place(&admin, json!({"user_id": "bob", "reason": "Subpoena"})).await;
    assert_eq!(alice["reason"], Value::Null);
    let (alice_id, bob_id) = (alice["id"].as_str().unwrap(), bob["id"].as_str().unwrap());

    let (status, listed) = admin.get_json("/v1/holds").await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<&str> = listed["holds"].as_array().unwrap().iter().map(|h| h["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [alice_id, bob_id], "oldest first: {listed}");
    let (_, only_bob) = admin.get_json("/v1/holds?user_id=bob").await;
    assert_eq!(only_bob["holds"].as_array().unwrap().len(), 1, "{only_bob}");
    assert_eq!(only_bob["holds"][0]["id"], bob["id"]);
    let (status, got) = admin.get_json(&format!("/v1/holds/{bob_id}")).await;
    assert_eq!((status, &got["reason"]), (StatusCode::OK, &json!("Subpoena")), "{got}");

    // Another tenant neither sees nor releases them.
    let (_, theirs) = other.get_json("/v1/holds").await;
    assert_eq!(theirs["holds"], json!([]), "{theirs}");
    expect_error(other.get(&format!("/v1/holds/{alice_id}")).await, StatusCode::NOT_FOUND, "hold_not_found").await;
    expect_error(other.delete(&format!("/v1/holds/{alice_id}")).await, StatusCode::NOT_FOUND, "hold_not_found").await;
    expect_error(admin.get(&format!("/v1/holds/{}", Uuid::new_v4())).await, StatusCode::NOT_FOUND, "hold_not_found")
        .await;
    // A read-write key can do nothing with holds.
    for r in [
        writer.post("/v1/holds", &json!({"user_id": "alice"})).await,
        writer.get("/v1/holds").await,
        writer.get(&format!("/v1/holds/{alice_id}")).await,
        writer.delete(&format!("/v1/holds/{alice_id}")).await,
    ] {
        expect_error(r, StatusCode::FORBIDDEN, "insufficient_scope").await;
    }

    let r = admin.delete(&format!("/v1/holds/{alice_id}")).await;
    assert_eq!(r.status(), StatusCode::OK);
    let released: Value = r.json().await.unwrap();
    assert_eq!(released["active"], false);
    assert_eq!(released["released_by"], "ops-1");
    assert!(released["released_at"].is_string(), "{released}");
    assert_eq!(released["placed_at"], alice["placed_at"]);
    // Again: unchanged, and not audited twice.
    let r = admin.delete(&format!("/v1/holds/{alice_id}")).await;
    assert_eq!(r.status(), StatusCode::OK);
    let again: Value = r.json().await.unwrap();
    assert_eq!(again, released);
    // Off the list of active holds, still on record.
    let (_, listed) = admin.get_json("/v1/holds").await;
    assert_eq!(listed["holds"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(admin.get_json(&format!("/v1/holds/{alice_id}")).await.1, released);

    let (_, audit) = admin.get_json("/v1/audit").await;
    let entries: Vec<(String, String, Value)> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["operation"].as_str().unwrap().into(), e["actor"].as_str().unwrap().into(), e["target"].clone()))
        .collect();
    assert_eq!(
        entries,
        [
            ("legal_hold_placed".into(), "ops-1".into(), json!({"hold_id": alice_id, "user_id": "alice"})),
            ("legal_hold_placed".into(), "ops-1".into(), json!({"hold_id": bob_id, "user_id": "bob"})),
            ("legal_hold_released".into(), "ops-1".into(), json!({"hold_id": alice_id, "user_id": "alice"})),
        ],
        "{audit}"
    );
    assert!(!audit.to_string().contains("Subpoena"), "the reason is not copied to the log: {audit}");
    let (_, verified) = admin.get_json("/v1/audit/verify").await;
    assert_eq!(verified["valid"], true, "{verified}");
    let (_, theirs) = other.get_json("/v1/audit").await;
    assert_eq!(theirs["entries"], json!([]));
}

#[tokio::test]
async fn bad_holds_are_refused_naming_the_field() {
    let (_server, _, admin, _) = keyed().await;
    for (body, field) in [
        (json!({}), "/user_id"),
        (json!({"user_id": ""}), "/user_id"),
        (json!({"user_id": "al\u{202e}ice"}), "/user_id"),
        (json!({"user_id": 7}), "/user_id"),
        (json!({"user_id": "alice", "reason": "x".repeat(1001)}), "/reason"),
        (json!({"user_id": "alice", "reason": " "}), "/reason"),
        (json!({"user_id": "alice", "until": "2030-01-01"}), "/until"),
    ] {
        let r = admin.post("/v1/holds", &body).await;
        let e = expect_error(r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field").await;
        assert_eq!(e["error"]["field"], field, "{body}: {e}");
    }
    place(&admin, json!({"user_id": "alice", "reason": "é".repeat(1000)})).await;
    for (r, field) in [
        (admin.get("/v1/holds/not-a-uuid").await, "id"),
        (admin.delete("/v1/holds/not-a-uuid").await, "id"),
        (admin.get("/v1/holds?user_id=").await, "user_id"),
        (admin.get("/v1/holds?active=false").await, "active"),
    ] {
        let e = expect_error(r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field").await;
        assert_eq!(e["error"]["field"], field, "{e}");
    }
}

#[tokio::test]
async fn a_hold_waits_for_an_unfinished_erasure_of_its_user() {
    let (_server, writer, admin, _) = keyed().await;
    let written = writer
        .write(json!({"memories": [
            {"agent_id": "a", "user_id": "dave", "tier": "episodic", "content": "Dave paid"},
            {"agent_id": "a", "user_id": "erin", "tier": "episodic", "content": "Erin paid"},
        ]}))
        .await;
    let lease = hold_the_erasure_worker(&admin).await;
    let (_, by_user) = post_json(&admin, "/v1/erasure", &json!({"user_id": "dave"})).await;
    let (_, by_id) = post_json(&admin, "/v1/erasure", &json!({"memory_ids": [written[1]["id"]]})).await;
    for (user, erasure) in [("dave", &by_user), ("erin", &by_id)] {
        assert_eq!(erasure["state"], "pending", "{erasure}");
        let r = admin.post("/v1/holds", &json!({"user_id": user})).await;
        let e = expect_error(r, StatusCode::CONFLICT, "erasure_in_progress").await;
        assert!(e["error"]["message"].as_str().unwrap().contains(erasure["id"].as_str().unwrap()), "{e}");
    }
    assert_eq!(admin.get_json("/v1/holds").await.1["holds"], json!([]));
    // Another user of the tenant is not in the way.
    place(&admin, json!({"user_id": "frank"})).await;

    drop(lease);
    wait_for(&admin, by_user["id"].as_str().unwrap(), "completed").await;
    wait_for(&admin, by_id["id"].as_str().unwrap(), "completed").await;
    place(&admin, json!({"user_id": "dave"})).await;
    place(&admin, json!({"user_id": "erin"})).await;
}

#[tokio::test]
async fn a_hold_and_an_erasure_of_one_user_racing_never_both_succeed() {
    let (_server, writer, admin, _) = keyed().await;
    let users: Vec<String> = (0..12).map(|i| format!("racer-{i}")).collect();
    let memories: Vec<Value> = users
        .iter()
        .map(|u| json!({"agent_id": "a", "user_id": u, "tier": "episodic", "content": format!("{u} was here")}))
        .collect();
    writer.write(json!({ "memories": memories })).await;
    // Erasures stay unfinished, so a hold after one must see it.
    let _lease = hold_the_erasure_worker(&admin).await;
    let races = users.iter().map(|u| {
        let admin = &admin;
        async move {
            let body = json!({"user_id": u});
            let (hold, erasure) = tokio::join!(admin.post("/v1/holds", &body), admin.post("/v1/erasure", &body));
            (u.clone(), hold.status(), erasure.status())
        }
    });
    for (user, hold, erasure) in futures::future::join_all(races).await {
        let outcome = (hold, erasure);
        assert!(
            outcome == (StatusCode::CREATED, StatusCode::CONFLICT)
                || outcome == (StatusCode::CONFLICT, StatusCode::ACCEPTED),
            "{user}: hold {hold}, erasure {erasure}"
        );
    }
}

#[tokio::test]
async fn held_memories_outlive_expiry_and_decay_until_the_hold_is_released() {
    let (app, db) = sweeping_app(|_| {}).await;
    let held = app
        .write(json!({"memories": [
            {"agent_id": "a", "user_id": "alice", "tier": "episodic", "content": "Alice's call", "retention": "transient"},
            {"agent_id": "a", "user_id": "alice", "tier": "semantic", "content": "Alice owes 40", "retention": "transient"},
            {"agent_id": "b", "user_id": "alice", "tier": "episodic", "content": "Alice's dull note", "importance": 0.05},
        ]}))
        .await;
    let free = app
        .write(json!({"memories": [
            {"agent_id": "a", "user_id": "bob", "tier": "episodic", "content": "Bob's call", "retention": "transient"},
            {"agent_id": "a", "tier": "semantic", "content": "Nobody's fact", "retention": "transient"},
            {"agent_id": "b", "user_id": "bob", "tier": "episodic", "content": "Bob's dull note", "importance": 0.05},
        ]}))
        .await;
    // Working memory is outside holds: it lapses with its session.
    let scratch = app
        .write_one(json!({"agent_id": "a", "user_id": "alice", "session_id": "s", "tier": "working",
            "content": "Alice's scratch", "retention": "transient"}))
        .await;
    let hold = place(&app, json!({"user_id": "alice", "reason": "Litigation"})).await;
    assert_eq!(hold["placed_by"], "keyless");

    // Past expiry and old enough to decay (0.05 importance, 20 days unread).
    app.clock.advance(Duration::days(20));
    let (_, preview) = app.get_json("/v1/retention/preview").await;
    let listed = preview.to_string();
    for m in &held {
        assert!(!listed.contains(m["id"].as_str().unwrap()), "held {m} listed: {preview}");
    }
    assert_eq!(preview["tiers"][1]["expired"]["ids"], json!([free[0]["id"]]), "{preview}");
    assert_eq!(preview["tiers"][1]["decayed"]["ids"], json!([free[2]["id"]]), "{preview}");
    assert_eq!(preview["tiers"][2]["expired"]["ids"], json!([free[1]["id"]]), "{preview}");
    let backlog: std::collections::BTreeMap<Tier, u64> =
        app.storage.sweep.expired_backlog(app.clock.now_plus(Duration::zero())).await.unwrap().into_iter().collect();
    assert_eq!((backlog[&Tier::Episodic], backlog[&Tier::Semantic]), (1, 1), "held rows are not backlog");

    let report = app.retention.run_once().await.unwrap();
    assert!(report.ran && report.failed.is_empty(), "{report:?}");
    assert_eq!(report.deleted.get(&(Tier::Episodic, Reason::Expired)), Some(&1), "{report:?}");
    assert_eq!(report.deleted.get(&(Tier::Episodic, Reason::Decayed)), Some(&1), "{report:?}");
    assert_eq!(report.deleted.get(&(Tier::Semantic, Reason::Expired)), Some(&1), "{report:?}");
    assert_eq!(report.deleted.get(&(Tier::Working, Reason::Expired)), Some(&1), "{report:?}");
    for m in &held {
        assert_eq!(stored_rows(&app, id_of(m)).await, 1, "held: {m}");
    }
    for m in free.iter().chain([&scratch]) {
        assert_eq!(stored_rows(&app, id_of(m)).await, 0, "{m}");
    }
    // A hold keeps data; it does not bring expired memories back to reads.
    assert_eq!(
        app.get_json(&format!("/v1/memories/{}", held[0]["id"].as_str().unwrap())).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(app.get_json(&format!("/v1/memories/{}", held[2]["id"].as_str().unwrap())).await.0, StatusCode::OK);
    // Decay, asked directly, leaves the held memory out too.
    let now = app.clock.now_plus(Duration::zero());
    let candidates = app.storage.sweep.decay_candidates(Tier::Episodic, None, &app.retention.decay, None, 100, now);
    assert!(candidates.await.unwrap().iter().all(|c| c.id != id_of(&held[2])));

    // Released: the next sweep deletes what expired or decayed meanwhile.
    let r = app.delete(&format!("/v1/holds/{}", hold["id"].as_str().unwrap())).await;
    assert_eq!(r.status(), StatusCode::OK);
    let (_, preview) = app.get_json("/v1/retention/preview").await;
    assert_eq!(preview["tiers"][1]["expired"]["ids"], json!([held[0]["id"]]), "{preview}");
    assert_eq!(preview["tiers"][1]["decayed"]["ids"], json!([held[2]["id"]]), "{preview}");
    let report = app.retention.run_once().await.unwrap();
    assert_eq!(report.deleted.get(&(Tier::Episodic, Reason::Expired)), Some(&1), "{report:?}");
    assert_eq!(report.deleted.get(&(Tier::Episodic, Reason::Decayed)), Some(&1), "{report:?}");
    assert_eq!(report.deleted.get(&(Tier::Semantic, Reason::Expired)), Some(&1), "{report:?}");
    for m in &held {
        assert_eq!(stored_rows(&app, id_of(m)).await, 0, "{m}");
    }
    done(app, db).await;
}

#[tokio::test]
async fn a_hold_placed_between_decays_listing_and_its_delete_still_keeps_the_memory() {
    let (app, db) = sweeping_app(|_| {}).await;
    let dull = app
        .write_one(json!({"agent_id": "b", "user_id": "gail", "tier": "episodic", "content": "Gail's dull note",
            "importance": 0.05}))
        .await;
    app.clock.advance(Duration::days(20));
    let now = app.clock.now_plus(Duration::zero());
    let listed = app.storage.sweep.decay_candidates(Tier::Episodic, None, &app.retention.decay, None, 100, now);
    let doomed: Vec<engram::store::Doomed> = listed
        .await
        .unwrap()
        .into_iter()
        .filter(|c| app.retention.decay.should_forget(c, now))
        .map(|c| engram::store::Doomed { tenant: c.tenant, id: c.id })
        .collect();
    assert_eq!(doomed.iter().map(|d| d.id).collect::<Vec<_>>(), [id_of(&dull)], "listed before the hold");

    place(&app, json!({"user_id": "gail"})).await;
    let gone = app.storage.sweep.delete(Tier::Episodic, &doomed).await.unwrap();
    assert!(gone.is_empty(), "{gone:?}");
    assert_eq!(stored_rows(&app, id_of(&dull)).await, 1);
    done(app, db).await;
}
