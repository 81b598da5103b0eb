//! Input hardening: what no backend can store (NUL), repeated JSON keys,
//! hidden characters in identifiers, the bearer scheme's case, 401's
//! challenge, readiness that leaks nothing, and error messages in the API's
//! words. Each answer is the same on both backends.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{expect_error, spawn_app, spawn_app_with};

/// Expects 422 `invalid_field` naming `field`.
async fn expect_field(r: reqwest::Response, field: &str) -> Value {
    let err = expect_error(r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field").await;
    assert_eq!(err["error"]["field"], field, "{err}");
    err
}

#[tokio::test]
async fn a_nul_character_anywhere_is_422_naming_the_field() {
    let app = spawn_app().await;
    let nul = "a\u{0000}b";
    let writes = [
        (json!({"agent_id": "n", "content": nul}), "/content"),
        (json!({"agent_id": "n", "content": "x", "metadata": {"a": {"b": [1, nul]}}}), "/metadata/a/b/1"),
        (json!({"agent_id": "n", "content": "x", "metadata": {"ok": {nul: 1}}}), "/metadata/ok/a\u{0000}b"),
        (json!({"agent_id": "n", "content": "x", "subject": nul, "predicate": "p"}), "/subject"),
        (json!({"agent_id": "n", "content": "x", "object": nul}), "/object"),
        (json!({"agent_id": "n", "content": "x", "skill_name": "s", "policy": {"steps": [nul]}}), "/policy/steps/0"),
        (
            json!({"agent_id": "n", "content": "x", "skill_name": "s", "tool_sequence": [{"tool": nul}]}),
            "/tool_sequence/0/tool",
        ),
        (json!({"agent_id": "n", "content": "x", "skill_name": nul}), "/skill_name"),
        (json!({"agent_id": "n", "content": "x", "trigger_pattern": nul, "skill_name": "s"}), "/trigger_pattern"),
        (json!({"agent_id": nul, "content": "x"}), "/agent_id"),
        (
            json!({"memories": [{"agent_id": "n", "content": "x"}, {"agent_id": "n", "content": nul}]}),
            "/memories/1/content",
        ),
    ];
    for (body, field) in writes {
        expect_field(app.post("/v1/memories", &body).await, field).await;
    }
    let m = app.write_one(json!({"agent_id": "n", "tier": "episodic", "content": "clean"})).await;
    let path = format!("/v1/memories/{}", m["id"].as_str().unwrap());
    expect_field(app.patch(&path, &json!({"content": nul})).await, "/content").await;
    expect_field(app.patch(&path, &json!({"metadata": {"k": nul}})).await, "/metadata/k").await;

    let search = |extra: Value| {
        let mut body = json!({"agent_id": "n", "query": "clean"});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    expect_field(app.post("/v1/memories/search", &search(json!({"query": nul}))).await, "/query").await;
    let filtered = search(json!({"filter": {"metadata": {"k": nul}}}));
    expect_field(app.post("/v1/memories/search", &filtered).await, "/filter/metadata/k").await;
    let context = json!({"agent_id": "n", "query": nul, "max_context_tokens": 9000});
    expect_field(app.post("/v1/context", &context).await, "/query").await;
    expect_field(app.get("/v1/memories?agent_id=n&metadata.k=a%00b").await, "metadata.k").await;
    expect_field(app.get("/v1/memories?agent_id=a%00b").await, "agent_id").await;

    // Nothing of the above was stored, and the server still serves.
    let (status, listed) = app.get_json("/v1/memories?agent_id=n").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["memories"].as_array().unwrap().len(), 1, "{listed}");
}

#[tokio::test]
async fn a_number_a_json_field_cannot_read_back_is_422_naming_it_and_one_within_the_bound_round_trips() {
    let app = spawn_app().await;
    let huge = -1.7976931348623157e308;
    let writes = [
        (
            json!({"agent_id": "n", "content": "x", "skill_name": "s", "tool_sequence": [{"t": [1, huge]}]}),
            "/tool_sequence/0/t/1",
        ),
        (json!({"agent_id": "n", "content": "x", "skill_name": "s", "policy": {"p": 1e301}}), "/policy/p"),
        (json!({"agent_id": "n", "content": "x", "metadata": {"m": huge}}), "/metadata/m"),
    ];
    for (body, field) in writes {
        expect_field(app.post("/v1/memories", &body).await, field).await;
    }
    let kept = json!([{"tool": "t", "big": -1e300, "tiny": 2.225073858507e-311, "n": 29194883699754255410790400.0}]);
    let m = app
        .write_one(json!({"agent_id": "n", "tier": "procedural", "content": "x", "skill_name": "edge",
                          "tool_sequence": kept}))
        .await;
    let (status, got) = app.get_json(&format!("/v1/memories/{}", m["id"].as_str().unwrap())).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    assert_eq!(got["tool_sequence"], kept);
}

#[tokio::test]
async fn identifiers_refuse_bidi_and_invisible_characters_and_keep_letters() {
    let app = spawn_app().await;
    for bad in [
        "ad\u{202E}min",
        "a\u{2066}b\u{2069}",
        "a\u{200E}",
        "zero\u{200B}width",
        "join\u{200D}er",
        "\u{FEFF}bom",
        "w\u{2060}j",
    ] {
        expect_field(app.post("/v1/memories", &json!({"agent_id": bad, "content": "x"})).await, "/agent_id").await;
        let body = json!({"agent_id": "a", "user_id": bad, "content": "x"});
        expect_field(app.post("/v1/memories", &body).await, "/user_id").await;
        let body = json!({"agent_id": "a", "session_id": bad, "tier": "working", "content": "x"});
        expect_field(app.post("/v1/memories", &body).await, "/session_id").await;
        let body = json!({"agent_id": "a", "skill_name": bad, "content": "x"});
        expect_field(app.post("/v1/memories", &body).await, "/skill_name").await;
        let body = json!({"agent_id": "a", "content": "x", "metadata": {bad: 1}});
        expect_field(app.post("/v1/memories", &body).await, &format!("/metadata/{bad}")).await;
        expect_field(app.post("/v1/memories/search", &json!({"agent_id": bad, "query": "q"})).await, "/agent_id").await;
    }
    // E-mail addresses, accents and other scripts are identifiers like any other.
    let m = app
        .write_one(json!({"agent_id": "josé@example.com", "user_id": "Zoë Ångström", "tier": "episodic",
                          "content": "accents stay", "metadata": {"café": "北京"}}))
        .await;
    assert_eq!(m["agent_id"], "josé@example.com");
    let (_, listed) = app.get_json("/v1/memories?agent_id=jos%C3%A9%40example.com").await;
    assert_eq!(listed["memories"][0]["id"], m["id"]);
}

#[tokio::test]
async fn a_repeated_json_key_is_refused_naming_it() {
    let app = spawn_app().await;
    let r = app.post_raw("/v1/memories", r#"{"agent_id": "a", "content": "x", "agent_id": "b"}"#).await;
    expect_field(r, "/agent_id").await;
    let r = app
        .post_raw("/v1/memories", r#"{"memories": [{"agent_id": "a", "content": "x", "metadata": {"k": 1, "k": 2}}]}"#)
        .await;
    expect_field(r, "/memories/0/metadata/k").await;
    let r = app.post_raw("/v1/memories/search", r#"{"agent_id": "a", "query": "q", "top_k": 1, "top_k": 2}"#).await;
    expect_field(r, "/top_k").await;
    let (_, listed) = app.get_json("/v1/memories?agent_id=a").await;
    assert_eq!(listed["memories"].as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive_and_every_401_names_it() {
    let tenant = format!("t-{}", uuid::Uuid::new_v4().simple());
    let app = spawn_app_with(|c| {
        c.auth.keys = vec![engram::config::ApiKeyConfig::from_plain(&tenant, "secret-key", Default::default())]
    })
    .await;
    let url = format!("{}/v1/memories?agent_id=a", app.base);
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let r = app.client.get(&url).header("authorization", format!("{scheme} secret-key")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{scheme}");
    }
    for authorization in [None, Some("Bearer wrong"), Some("Basic c2VjcmV0LWtleQ=="), Some("Bearer")] {
        let mut rb = app.client.get(&url);
        if let Some(a) = authorization {
            rb = rb.header("authorization", a);
        }
        let r = rb.send().await.unwrap();
        assert_eq!(
            r.headers().get("www-authenticate").map(|v| v.to_str().unwrap()),
            Some("Bearer"),
            "{authorization:?}"
        );
        expect_error(r, StatusCode::UNAUTHORIZED, "unauthorized").await;
    }
}

#[tokio::test]
async fn readiness_says_unavailable_and_nothing_of_the_cause() {
    let app = spawn_app_with(|c| {
        c.redis.url = "redis://127.0.0.1:1".into();
        c.redis.timeout_ms = 200;
    })
    .await;
    if app.postgres_only("Redis").is_none() {
        return;
    }
    let (status, ready) = app.get_json("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(ready, json!({"status": "not_ready", "checks": {"database": "ok", "working_memory": "unavailable"}}));
}

/// Words of Rust and serde that have no place in a message to a JSON client.
const RUST_WORDS: [&str; 17] = [
    "usize", "u64", "u32", "i64", "i32", "f64", "f32", "struct", "variant", "enum", "map", "sequence", "unit",
    "option", "Option", "Vec", "untagged",
];

#[tokio::test]
async fn no_error_message_speaks_rust() {
    let app = spawn_app().await;
    let m = app.write_one(json!({"agent_id": "r", "tier": "episodic", "content": "x"})).await;
    let path = format!("/v1/memories/{}", m["id"].as_str().unwrap());
    let search = json!({"agent_id": "a", "query": "q"});
    let with = |base: &Value, key: &str, v: Value| {
        let mut b = base.clone();
        b[key] = v;
        b
    };
    let write = json!({"agent_id": "a", "content": "x"});
    let context = json!({"agent_id": "a", "query": "q", "max_context_tokens": 1000});
    let mut bodies: Vec<(&str, Value)> = Vec::new();
    for (key, bad) in [
        ("agent_id", json!(5)),
        ("agent_id", json!(null)),
        ("content", json!([])),
        ("importance", json!("high")),
        ("importance", json!({})),
        ("tier", json!("dream")),
        ("tier", json!(3)),
        ("retention", json!(true)),
        ("private", json!("yes")),
        ("metadata", json!([1])),
        ("metadata", json!("m")),
        ("occurred_at", json!(12)),
        ("occurred_at", json!("soon")),
        ("source_episode_id", json!("nope")),
        ("policy", json!([])),
        ("tool_sequence", json!({})),
        ("reward", json!("1")),
        ("event_type", json!("party")),
        ("outcome", json!(1)),
        ("colour", json!("red")),
    ] {
        bodies.push(("/v1/memories", with(&write, key, bad)));
    }
    bodies.push(("/v1/memories", json!([1, 2])));
    bodies.push(("/v1/memories", json!("text")));
    bodies.push(("/v1/memories", json!({"memories": {}})));
    bodies.push(("/v1/memories", json!({"memories": [5]})));
    for (key, bad) in [
        ("top_k", json!(-1)),
        ("top_k", json!(1.5)),
        ("top_k", json!("ten")),
        ("top_k", json!(1e30)),
        ("top_k", json!(0)),
        ("tiers", json!("episodic")),
        ("tiers", json!(["dream"])),
        ("weights", json!({"relevance": 1})),
        ("weights", json!([1])),
        ("weights", json!({"relevance": "x"})),
        ("filter", json!({"since": 5})),
        ("filter", json!({"colour": 1})),
        ("filter", json!([])),
        ("min_relevance", json!("x")),
        ("query", json!(7)),
    ] {
        bodies.push(("/v1/memories/search", with(&search, key, bad)));
    }
    for (key, bad) in [
        ("max_context_tokens", json!(-5)),
        ("max_context_tokens", json!(1.5)),
        ("max_context_tokens", json!("lots")),
        ("max_context_tokens", json!(1e20)),
        ("system_prompt_tokens", json!(-1.5)),
        ("tokenizer", json!("gpt2")),
        ("allocation", json!({"working": 1})),
        ("output_reserve_tokens", json!([])),
    ] {
        bodies.push(("/v1/context", with(&context, key, bad)));
    }
    bodies.push(("/v1/context", json!({"agent_id": "a", "query": "q"})));
    let mut messages = Vec::new();
    for (route, body) in &bodies {
        let r = app.post(route, body).await;
        assert!(r.status().is_client_error(), "{route} {body}: {}", r.status());
        messages.push((format!("{route} {body}"), r.json::<Value>().await.unwrap()));
    }
    for (key, bad) in [("importance", json!("x")), ("retention", json!("forever")), ("metadata", json!(1))] {
        let r = app.patch(&path, &json!({key: bad})).await;
        messages.push((format!("PATCH {key}"), r.json::<Value>().await.unwrap()));
    }
    for query in ["limit=-1", "limit=1.5", "limit=x", "tier=dream", "include_superseded=maybe", "created_after=x"] {
        let r = app.get(&format!("/v1/memories?{query}")).await;
        messages.push((query.to_string(), r.json::<Value>().await.unwrap()));
    }
    let top_k = app.post("/v1/memories/search", &with(&search, "top_k", json!(-1))).await;
    let err = expect_field(top_k, "/top_k").await;
    assert_eq!(err["error"]["message"], "must be a whole number from 1 to 200");
    for (what, err) in &messages {
        let message = err["error"]["message"].as_str().unwrap_or_else(|| panic!("{what}: {err}"));
        for word in message.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
            assert!(!RUST_WORDS.contains(&word), "{what}: `{word}` in {message:?}");
        }
    }
}

#[tokio::test]
async fn a_query_with_nothing_to_embed_still_scores_numbers() {
    // Found by schemathesis: pgvector's cosine with an all-zero query vector
    // is NaN, which JSON renders as null.
    let app = spawn_app().await;
    app.write_one(json!({"agent_id": "z", "tier": "episodic", "content": "0"})).await;
    app.write_one(json!({"agent_id": "z", "tier": "semantic", "content": "ü"})).await;
    for query in ["ìø®\u{1e4a6}\u{86}", "!!", "0", "\u{86}"] {
        let r = app.post("/v1/memories/search", &json!({"agent_id": "z", "query": query})).await;
        assert_eq!(r.status(), StatusCode::OK);
        let body: Value = r.json().await.unwrap();
        for hit in body["results"].as_array().unwrap() {
            assert!(hit["score"].is_f64(), "{query:?}: {hit}");
            assert!(hit["components"]["relevance"].is_f64(), "{query:?}: {hit}");
        }
        let r = app.post("/v1/context", &json!({"agent_id": "z", "query": query, "max_context_tokens": 9000})).await;
        let body: Value = r.json().await.unwrap();
        for item in body["sections"].as_object().unwrap().values().flat_map(|v| v.as_array().unwrap()) {
            assert!(item["score"].is_f64(), "{query:?}: {item}");
        }
    }
}
