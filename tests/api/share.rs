//! Sharing: a share needs a grant, copies the sender's shareable memories
//! into the targets redacted and with provenance, never lets a copy replace
//! what the target knows, is followed by erasure and withdrawn with its
//! grant, and stays inside the tenant. On both backends.

use engram::config::{ApiKeyConfig, Scope};
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::erasure::{spawn_isolated, wait_for};
use crate::helpers::{TestApp, expect_error, post_json};

/// A server with a read-write key and an admin key (`ops-1`) on one tenant,
/// and both kinds on another.
async fn keyed() -> (TestApp, TestApp, TestApp, TestApp, TestApp) {
    let (t1, t2) = (format!("s-{}", Uuid::new_v4().simple()), format!("s-{}", Uuid::new_v4().simple()));
    let server = spawn_isolated(|c| {
        c.auth.keys = vec![
            ApiKeyConfig { id: "agent-key".into(), ..ApiKeyConfig::from_plain(&t1, "writer-1", Scope::ReadWrite) },
            ApiKeyConfig { id: "ops-1".into(), ..ApiKeyConfig::from_plain(&t1, "admin-1", Scope::Admin) },
            ApiKeyConfig::from_plain(&t2, "writer-2", Scope::ReadWrite),
            ApiKeyConfig::from_plain(&t2, "admin-2", Scope::Admin),
        ];
    })
    .await;
    let keys = ["writer-1", "admin-1", "writer-2", "admin-2"].map(|k| server.as_key(k));
    let [w1, a1, w2, a2] = keys;
    (server, w1, a1, w2, a2)
}

async fn grant(admin: &TestApp, body: Value) -> Value {
    let (status, g) = post_json(admin, "/v1/share/grants", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{g}");
    g
}

async fn share(app: &TestApp, body: Value) -> Value {
    let (status, out) = post_json(app, "/v1/share", &body).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    out
}

fn id(m: &Value) -> String {
    m["id"].as_str().unwrap().to_string()
}

/// Every memory of `agent` that `search` finds for `query`, as text.
async fn found(app: &TestApp, agent: &str, query: &str) -> String {
    let (status, r) =
        post_json(app, "/v1/memories/search", &json!({"agent_id": agent, "query": query, "top_k": 50})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    r["results"].to_string()
}

#[tokio::test]
async fn a_granted_share_copies_redacted_memories_with_provenance_and_refuses_what_may_not_leave() {
    let (_server, writer, admin, _, _) = keyed().await;
    let mail = "ann.lee@example.com";
    let written = writer
        .write(json!({"memories": [
            {"agent_id": "a", "user_id": "ann", "tier": "episodic",
             "content": format!("Ann asked us to write to {mail} or call +44 20 7946 0958 about the lease."),
             "metadata": {"contact": mail}},
            {"agent_id": "a", "user_id": "ann", "tier": "semantic", "content": "Ann prefers morning meetings",
             "subject": "ann", "predicate": "prefers", "object": "morning meetings"},
            {"agent_id": "a", "tier": "procedural", "skill_name": "book_room",
             "content": "Book a meeting room through the facilities portal"},
            {"agent_id": "a", "user_id": "ann", "tier": "episodic", "content": "Ann's private note", "private": true},
            {"agent_id": "a", "session_id": "s1", "tier": "working", "content": "scratch: draft reply"},
            {"agent_id": "c", "user_id": "ann", "tier": "episodic", "content": "Another agent's memory"},
        ]}))
        .await;
    let ids: Vec<String> = written.iter().map(id).collect();
    let unknown = Uuid::now_v7().to_string();
    let body = json!({"from_agent_id": "a", "to_agent_ids": ["b"],
                      "memory_ids": [ids[0], ids[1], ids[2], ids[3], ids[4], ids[5], unknown]});

    // No grant: nothing is shared, and the refusal names the agent.
    let e = expect_error(writer.post("/v1/share", &body).await, StatusCode::FORBIDDEN, "share_not_granted").await;
    assert!(e["error"]["message"].as_str().unwrap().contains('b'), "{e}");
    assert_eq!(found(&writer, "b", "Ann").await, "[]");
    // Only an admin key grants.
    let r = writer.post("/v1/share/grants", &json!({"from_agent_id": "a", "to_agent_ids": ["b"]})).await;
    expect_error(r, StatusCode::FORBIDDEN, "insufficient_scope").await;
    let g = grant(&admin, json!({"from_agent_id": "a", "to_agent_ids": ["b"]})).await;
    assert_eq!((g["created_by"].as_str(), g["revoked_at"].clone()), (Some("ops-1"), Value::Null));

    let out = share(&writer, body).await;
    let shared = out["shared"].as_array().unwrap();
    assert_eq!(shared.len(), 3, "{out}");
    let refused: Vec<(String, String)> = out["refused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["memory_id"].as_str().unwrap().to_string(), r["reason"].as_str().unwrap().to_string()))
        .collect();
    let got: std::collections::BTreeSet<(String, String)> = refused.iter().cloned().collect();
    let want: std::collections::BTreeSet<(String, String)> = [
        (ids[3].clone(), "private"),
        (ids[4].clone(), "working_memory"),
        (ids[5].clone(), "not_found"),
        (unknown.clone(), "not_found"),
    ]
    .into_iter()
    .map(|(i, r)| (i, r.to_string()))
    .collect();
    assert_eq!(got, want);
    let mut reasons: Vec<&str> = refused.iter().map(|(_, r)| r.as_str()).collect();
    reasons.sort();
    assert_eq!(reasons, ["not_found", "not_found", "private", "working_memory"]);

    // The episode's copy: redacted text and metadata, provenance, the same user.
    let copy = &shared.iter().find(|c| c["source_memory_id"] == ids[0].as_str()).unwrap()["memory"];
    let content = copy["content"].as_str().unwrap();
    assert!(!content.contains(mail) && content.contains("[email]") && content.contains("[phone]"), "{content}");
    assert_eq!(copy["metadata"]["contact"], "[email]");
    assert_eq!((copy["agent_id"].as_str(), copy["user_id"].as_str()), (Some("b"), Some("ann")));
    let p = &copy["provenance"];
    assert_eq!(p["source_agent_id"], "a");
    assert_eq!(p["source_memory_id"], ids[0].as_str());
    assert_eq!(p["shared_by"], "agent-key");
    assert_eq!(p["grant_id"], g["id"]);
    assert_eq!((p["redactions"]["email"].as_u64(), p["redactions"]["phone"].as_u64()), (Some(2), Some(1)));
    // Provenance on every read: by id, list, history, search.
    let (_, got) = writer.get_json(&format!("/v1/memories/{}", id(copy))).await;
    assert_eq!(got["provenance"], *p);
    let (_, listed) = writer.get_json("/v1/memories?agent_id=b").await;
    assert_eq!(listed["memories"].as_array().unwrap().len(), 3);
    assert!(listed["memories"].as_array().unwrap().iter().all(|m| m["provenance"]["source_agent_id"] == "a"));
    let fact = &shared.iter().find(|c| c["source_memory_id"] == ids[1].as_str()).unwrap()["memory"];
    assert_eq!(fact["source"], "shared");
    let (_, history) = writer.get_json(&format!("/v1/memories/{}/history", id(fact))).await;
    assert_eq!(history["memories"][0]["provenance"]["source_memory_id"], ids[1].as_str(), "{history}");
    // The original e-mail is nowhere in the target: not by search of the
    // text or the vector, and not in its shares.
    assert!(!found(&writer, "b", mail).await.contains(mail));
    assert!(!found(&writer, "b", "ann.lee").await.contains(mail));
    assert!(found(&writer, "b", "lease").await.contains("[email]"));
    let (_, into_b) = writer.get_json("/v1/share?agent_id=b").await;
    assert_eq!(into_b["memories"].as_array().unwrap().len(), 3);
    assert!(!into_b.to_string().contains(mail));
    let (_, out_of_a) = writer.get_json("/v1/share?agent_id=a&direction=out").await;
    assert_eq!(out_of_a["memories"].as_array().unwrap().len(), 3);
    let (_, out_of_b) = writer.get_json("/v1/share?agent_id=b&direction=out").await;
    assert_eq!(out_of_b["memories"], json!([]));
    // The sender keeps its own memories as they were.
    let (_, original) = writer.get_json(&format!("/v1/memories/{}", ids[0])).await;
    assert!(original["content"].as_str().unwrap().contains(mail));
    assert_eq!(original["provenance"], Value::Null);

    // A grant is one way.
    let back = json!({"from_agent_id": "b", "to_agent_ids": ["a"], "memory_ids": [id(copy)]});
    expect_error(writer.post("/v1/share", &back).await, StatusCode::FORBIDDEN, "share_not_granted").await;
}

#[tokio::test]
async fn a_shared_fact_never_replaces_the_targets_own_and_a_shared_skill_never_overwrites_one() {
    let (_server, writer, admin, _, _) = keyed().await;
    let own = writer
        .write_one(json!({"agent_id": "b", "user_id": "u", "tier": "semantic", "content": "The user lives in Paris",
                          "subject": "user", "predicate": "lives_in", "object": "Paris", "confidence": 0.5}))
        .await;
    let own_skill = writer
        .write_one(json!({"agent_id": "b", "tier": "procedural", "skill_name": "deploy",
                          "content": "Deploy with the blue-green script"}))
        .await;
    let theirs = writer
        .write(json!({"memories": [
            {"agent_id": "a", "user_id": "u", "tier": "semantic", "content": "The user lives in Berlin",
             "subject": "user", "predicate": "lives_in", "object": "Berlin", "confidence": 0.99},
            {"agent_id": "a", "tier": "procedural", "skill_name": "deploy", "content": "Deploy by hand on Fridays"},
        ]}))
        .await;
    grant(&admin, json!({"from_agent_id": "a", "to_agent_ids": ["b"]})).await;
    let out = share(
        &writer,
        json!({"from_agent_id": "a", "to_agent_ids": ["b"],
                                    "memory_ids": [id(&theirs[0]), id(&theirs[1])]}),
    )
    .await;
    let copy = &out["shared"][0]["memory"];
    // More confident, but shared: a candidate behind the target's own fact.
    assert_eq!(copy["contested_by"], own["id"], "{out}");
    let (_, current) = writer.get_json(&format!("/v1/memories/{}", id(&own))).await;
    assert_eq!(current["valid_until"], Value::Null);
    let recalled = found(&writer, "b", "Where does the user live?").await;
    assert!(recalled.contains("Paris") && !recalled.contains("Berlin"), "{recalled}");
    // A search can opt in to candidates, which say what they lost to.
    let body = json!({"agent_id": "b", "query": "Where does the user live?", "top_k": 50, "include_candidates": true});
    let (status, r) = post_json(&writer, "/v1/memories/search", &body).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let candidate = r["results"].as_array().unwrap().iter().find(|x| x["memory"]["id"] == copy["id"]);
    assert_eq!(candidate.map(|c| c["memory"]["contested_by"].clone()), Some(own["id"].clone()), "{r}");
    assert!(r["results"].to_string().contains("Paris"), "{r}");
    // The skill: the target keeps its own.
    let skill = &out["shared"][1];
    assert_eq!(
        (skill["memory"]["id"].clone(), skill["memory"]["deduplicated"].clone()),
        (own_skill["id"].clone(), json!(true))
    );
    let (_, kept) = writer.get_json(&format!("/v1/memories/{}", id(&own_skill))).await;
    assert_eq!(kept["content"], "Deploy with the blue-green script");
}

#[tokio::test]
async fn erasing_the_source_erases_its_copies_and_withdrawing_a_grant_erases_what_it_shared() {
    let (_server, writer, admin, _, _) = keyed().await;
    let mine = writer
        .write(json!({"memories": [
            {"agent_id": "a", "user_id": "zoe", "tier": "episodic", "content": "Zoe renewed her passport"},
            {"agent_id": "a", "user_id": "max", "tier": "episodic", "content": "Max moved to the third floor"},
        ]}))
        .await;
    // A team grant: every member but the sender gets a copy.
    let r = admin.put("/v1/share/teams/floor", &json!({"agent_ids": ["a", "b", "c"]})).await;
    assert_eq!(r.status(), StatusCode::OK);
    let g = grant(&admin, json!({"from_agent_id": "a", "team": "floor"})).await;
    let out =
        share(&writer, json!({"from_agent_id": "a", "team": "floor", "query": "passport renewal", "top_k": 1})).await;
    let targets: Vec<&str> =
        out["shared"].as_array().unwrap().iter().map(|c| c["target_agent_id"].as_str().unwrap()).collect();
    assert_eq!(targets, ["b", "c"], "{out}");
    let zoe_copies: Vec<String> = out["shared"].as_array().unwrap().iter().map(|c| id(&c["memory"])).collect();
    let out = share(&writer, json!({"from_agent_id": "a", "team": "floor", "memory_ids": [id(&mine[1])]})).await;
    let max_copies: Vec<String> = out["shared"].as_array().unwrap().iter().map(|c| id(&c["memory"])).collect();

    // Erasing Zoe through agent a alone reaches her copies in b and c.
    let (status, e) = post_json(&admin, "/v1/erasure", &json!({"user_id": "zoe", "agent_id": "a"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{e}");
    let done = wait_for(&admin, e["id"].as_str().unwrap(), "completed").await;
    let episodes: u64 = done["deleted"].as_object().unwrap().values().filter_map(|s| s["episodic"].as_u64()).sum();
    assert_eq!(episodes, 3, "the original and its two copies: {done}");
    for c in &zoe_copies {
        assert_eq!(writer.get_json(&format!("/v1/memories/{c}")).await.0, StatusCode::NOT_FOUND);
    }
    // Withdrawing the grant erases Max's copies; the original stays.
    let r = admin.delete(&format!("/v1/share/grants/{}?withdraw=true", id(&g))).await;
    let status = r.status();
    let revoked: Value = r.json().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{revoked}");
    assert!(revoked["grant"]["revoked_at"].is_string());
    let withdrawal = revoked["withdrawal"]["id"].as_str().unwrap();
    wait_for(&admin, withdrawal, "completed").await;
    for c in &max_copies {
        assert_eq!(writer.get_json(&format!("/v1/memories/{c}")).await.0, StatusCode::NOT_FOUND);
    }
    assert_eq!(writer.get_json(&format!("/v1/memories/{}", id(&mine[1]))).await.0, StatusCode::OK);
    // Revoked: no more shares.
    let again = json!({"from_agent_id": "a", "team": "floor", "memory_ids": [id(&mine[1])]});
    expect_error(writer.post("/v1/share", &again).await, StatusCode::FORBIDDEN, "share_not_granted").await;
    let (_, grants) = admin.get_json("/v1/share/grants").await;
    assert!(grants["grants"][0]["revoked_at"].is_string(), "{grants}");
    // The 201 and a later read show the same instant.
    assert_eq!(grants["grants"][0]["created_at"], g["created_at"], "{grants}");
}

#[tokio::test]
async fn sharing_stays_inside_the_tenant_and_bad_requests_name_the_field() {
    let (_server, writer, admin, other_writer, other_admin) = keyed().await;
    let mine =
        writer.write_one(json!({"agent_id": "a", "tier": "episodic", "content": "Tenant one's secret plan"})).await;
    let g = grant(&admin, json!({"from_agent_id": "a", "to_agent_ids": ["b"]})).await;
    // The other tenant, with the same agent names and its own grant, cannot
    // reach tenant one's memory, grants or copies.
    grant(&other_admin, json!({"from_agent_id": "a", "to_agent_ids": ["b"]})).await;
    let out =
        share(&other_writer, json!({"from_agent_id": "a", "to_agent_ids": ["b"], "memory_ids": [id(&mine)]})).await;
    assert_eq!(out["shared"], json!([]));
    assert_eq!(out["refused"][0]["reason"], "not_found");
    let (_, theirs) = other_admin.get_json("/v1/share/grants").await;
    assert_eq!(theirs["grants"].as_array().unwrap().len(), 1);
    assert_ne!(theirs["grants"][0]["id"], g["id"]);
    let r = other_admin.delete(&format!("/v1/share/grants/{}", id(&g))).await;
    expect_error(r, StatusCode::NOT_FOUND, "grant_not_found").await;
    share(&writer, json!({"from_agent_id": "a", "to_agent_ids": ["b"], "memory_ids": [id(&mine)]})).await;
    let (_, into_b) = other_writer.get_json("/v1/share?agent_id=b").await;
    assert_eq!(into_b["memories"], json!([]));
    assert_eq!(found(&other_writer, "b", "secret plan").await, "[]");

    for (body, field) in [
        (json!({"from_agent_id": "a", "memory_ids": [id(&mine)]}), "/to_agent_ids"),
        (json!({"from_agent_id": "a", "to_agent_ids": ["b"], "team": "t", "memory_ids": [id(&mine)]}), "/to_agent_ids"),
        (json!({"from_agent_id": "a", "to_agent_ids": ["a"], "memory_ids": [id(&mine)]}), "/to_agent_ids"),
        (json!({"from_agent_id": "a", "to_agent_ids": []}), "/to_agent_ids"),
        (json!({"from_agent_id": "a", "to_agent_ids": ["b"]}), "/memory_ids"),
        (json!({"from_agent_id": "a", "to_agent_ids": ["b"], "memory_ids": []}), "/memory_ids"),
        (json!({"from_agent_id": "a", "to_agent_ids": ["b"], "query": "x", "top_k": 0}), "/top_k"),
        (json!({"from_agent_id": "a", "to_agent_ids": ["b"], "query": "x", "top_k": 51}), "/top_k"),
        (json!({"from_agent_id": "", "to_agent_ids": ["b"], "query": "x"}), "/from_agent_id"),
        (json!({"from_agent_id": "a", "team": "nobody", "query": "x"}), "/team"),
    ] {
        let e = expect_error(writer.post("/v1/share", &body).await, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field")
            .await;
        assert_eq!(e["error"]["field"], field, "{body}: {e}");
    }
    let r = admin.post("/v1/share/grants", &json!({"from_agent_id": "a", "to_agent_ids": ["a"]})).await;
    expect_error(r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field").await;
    let r = admin.delete("/v1/share/grants/not-a-uuid").await;
    expect_error(r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field").await;
}

#[tokio::test]
async fn a_key_bound_to_an_agent_acts_only_for_it_so_a_grant_is_the_only_way_across() {
    let t = format!("s-{}", Uuid::new_v4().simple());
    let bound = |key: &str, agents: &[&str]| ApiKeyConfig {
        agents: agents.iter().map(|a| a.to_string()).collect(),
        ..ApiKeyConfig::from_plain(&t, key, Scope::ReadWrite)
    };
    let server = spawn_isolated(|c| {
        c.auth.keys = vec![
            bound("key-a", &["a"]),
            bound("key-b", &["b"]),
            bound("key-ab", &["a", "b"]),
            ApiKeyConfig::from_plain(&t, "admin", Scope::Admin),
        ];
    })
    .await;
    let [ka, kb, kab, admin] = ["key-a", "key-b", "key-ab", "admin"].map(|k| server.as_key(k));
    let mine =
        ka.write_one(json!({"agent_id": "a", "tier": "episodic", "content": "Agent a keeps the vault code"})).await;
    let theirs =
        kb.write_one(json!({"agent_id": "b", "tier": "episodic", "content": "Agent b plans the launch"})).await;
    let theirs_path = format!("/v1/memories/{}", id(&theirs));

    // Naming another agent is 403 naming the field; another agent's memory
    // by id is 404, as if it did not exist.
    let refused = |r| expect_error(r, StatusCode::FORBIDDEN, "agent_not_allowed");
    let e = refused(
        ka.post(
            "/v1/memories",
            &json!({"memories": [
        {"agent_id": "a", "tier": "episodic", "content": "fine"},
        {"agent_id": "b", "tier": "episodic", "content": "not mine to write"}]}),
        )
        .await,
    )
    .await;
    assert_eq!(e["error"]["field"], "/memories/1/agent_id", "{e}");
    let e = refused(ka.post("/v1/memories/search", &json!({"agent_id": "b", "query": "launch"})).await).await;
    assert_eq!(e["error"]["field"], "/agent_id", "{e}");
    refused(ka.post("/v1/context", &json!({"agent_id": "b", "query": "launch", "max_context_tokens": 500})).await)
        .await;
    refused(ka.get("/v1/memories?agent_id=b").await).await;
    refused(ka.get("/v1/share?agent_id=b").await).await;
    for r in [
        ka.get(&theirs_path).await,
        ka.get(&format!("{theirs_path}/history")).await,
        ka.patch(&theirs_path, &json!({"importance": 0.9})).await,
        ka.delete(&theirs_path).await,
    ] {
        expect_error(r, StatusCode::NOT_FOUND, "memory_not_found").await;
    }
    let (_, still) = kb.get_json(&theirs_path).await;
    assert_eq!(still["importance"], theirs["importance"], "{still}");
    // Nothing of the refused batch was written.
    let (_, listed) = ka.get_json("/v1/memories").await;
    assert_eq!(listed["memories"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed["memories"][0]["id"], mine["id"], "a key bound to one agent lists that agent: {listed}");
    // A key for several agents must say which it lists.
    let e = expect_error(kab.get("/v1/memories").await, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field").await;
    assert_eq!(e["error"]["field"], "agent_id", "{e}");
    let (status, _) = kab.get_json("/v1/memories?agent_id=b").await;
    assert_eq!(status, StatusCode::OK);

    // Sharing: only as the key's own agent, and only along a grant.
    let body = json!({"from_agent_id": "a", "to_agent_ids": ["b"], "memory_ids": [id(&mine)]});
    expect_error(ka.post("/v1/share", &body).await, StatusCode::FORBIDDEN, "share_not_granted").await;
    let e = refused(
        kb.post(
            "/v1/share",
            &json!({"from_agent_id": "a", "to_agent_ids": ["b"],
                                                "memory_ids": [id(&mine)]}),
        )
        .await,
    )
    .await;
    assert_eq!(e["error"]["field"], "/from_agent_id", "{e}");
    grant(&admin, json!({"from_agent_id": "a", "to_agent_ids": ["b"]})).await;
    let out = share(&ka, body).await;
    let copy = &out["shared"][0]["memory"];
    assert_eq!(copy["agent_id"], "b", "{out}");
    // b's key reads the copy, never a's original; a's key not the copy.
    let (status, _) = kb.get_json(&format!("/v1/memories/{}", id(copy))).await;
    assert_eq!(status, StatusCode::OK);
    expect_error(kb.get(&format!("/v1/memories/{}", id(&mine))).await, StatusCode::NOT_FOUND, "memory_not_found").await;
    expect_error(ka.get(&format!("/v1/memories/{}", id(copy))).await, StatusCode::NOT_FOUND, "memory_not_found").await;
}

#[tokio::test]
async fn a_copy_expires_no_later_than_its_source() {
    let (server, writer, admin, _, _) = keyed().await;
    let source = writer
        .write_one(json!({"agent_id": "a", "tier": "episodic", "retention": "short_term",
                          "content": "The badge reader on floor two is broken"}))
        .await;
    let also_forever = writer
        .write_one(json!({"agent_id": "a", "tier": "episodic", "retention": "permanent",
                          "content": "The building opened in 1998"}))
        .await;
    grant(&admin, json!({"from_agent_id": "a", "to_agent_ids": ["b"]})).await;
    // Shared five days into the source's seven: the copy's own short_term
    // would run to day twelve, the source ends on day seven.
    server.clock.advance(chrono::Duration::days(5));
    let out = share(
        &writer,
        json!({"from_agent_id": "a", "to_agent_ids": ["b"],
                                    "memory_ids": [id(&source), id(&also_forever)]}),
    )
    .await;
    let copies = out["shared"].as_array().unwrap();
    assert_eq!(copies.len(), 2, "{out}");
    let copy_of = |original: &Value| {
        copies.iter().find(|c| c["source_memory_id"] == original["id"]).unwrap_or_else(|| panic!("{out}"))["memory"]
            .clone()
    };
    assert_eq!(copy_of(&source)["expires_at"], source["expires_at"], "{out}");
    assert!(copy_of(&also_forever)["expires_at"].is_null(), "{out}");
    // Past the source's end the copy is gone from the target's reads too.
    server.clock.advance(chrono::Duration::days(2) + chrono::Duration::seconds(1));
    let copy = id(&copy_of(&source));
    assert_eq!(writer.get_json(&format!("/v1/memories/{copy}")).await.0, StatusCode::NOT_FOUND);
}
