//! The binary as an operator meets it: subcommands, configuration errors,
//! and a clean exit on SIGTERM.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn engram() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_engram"));
    // Start from a clean slate: no configuration from the environment running the tests.
    for (k, _) in std::env::vars() {
        if k.starts_with("ENGRAM_") || k == "DATABASE_URL" || k == "REDIS_URL" {
            c.env_remove(k);
        }
    }
    c
}

#[test]
fn config_prints_the_effective_configuration_without_secrets() {
    let out = engram()
        .arg("config")
        .env("DATABASE_URL", "postgres://app:s3cret@db:5432/engram")
        .env("ENGRAM_EMBEDDING__OPENAI__API_KEY", "sk-very-secret")
        .env("ENGRAM_API_KEYS", "acme:plain-key")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("postgres://app:<redacted>@db:5432/engram"), "{text}");
    assert!(!text.contains("s3cret") && !text.contains("sk-very-secret") && !text.contains("plain-key"), "{text}");
    assert!(text.contains(r#"tenant = "acme""#), "{text}");
}

#[test]
fn a_bad_setting_stops_the_server_naming_the_key() {
    let out = engram().args(["serve"]).env("ENGRAM_SERVER__BODY_LIMIT_BYTES", "huge").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap().to_lowercase();
    assert!(err.contains("server.body_limit_bytes"), "{err}");
    let out = engram().args(["serve", "--listen", "nowhere"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8(out.stderr).unwrap().contains("server.listen"));
}

#[test]
fn openapi_prints_the_committed_document() {
    let out = engram().arg("openapi").output().unwrap();
    assert!(out.status.success());
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let committed: serde_json::Value = serde_json::from_str(include_str!("../openapi/openapi.json")).unwrap();
    assert_eq!(printed, committed);
}

fn model_dir() -> String {
    std::env::var("ENGRAM_MODEL_DIR").expect("ENGRAM_MODEL_DIR is not set: run the tests with scripts/test.sh")
}

#[test]
fn a_missing_model_stops_the_server_at_start_naming_the_fetch_script() {
    let db = std::env::var("ENGRAM_TEST_DATABASE_URL")
        .expect("ENGRAM_TEST_DATABASE_URL is not set: run the tests with scripts/test.sh");
    let empty = std::env::temp_dir().join(format!("engram-no-model-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&empty).unwrap();
    let out = engram()
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("DATABASE_URL", db)
        .env("ENGRAM_MODEL_DIR", &empty)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&empty).unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("scripts/fetch-model.sh") && stderr.contains(&*empty.to_string_lossy()), "{stderr}");
}

#[test]
fn sigterm_drains_and_exits_cleanly() {
    let db = std::env::var("ENGRAM_TEST_DATABASE_URL")
        .expect("ENGRAM_TEST_DATABASE_URL is not set: run the tests with scripts/test.sh");
    let redis = std::env::var("ENGRAM_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // The default embedder, the bundled model; no re-embedding of the shared test database.
    let mut child = engram()
        .arg("serve")
        .env("DATABASE_URL", db)
        .env("REDIS_URL", redis)
        .env("ENGRAM_MODEL_DIR", model_dir())
        .env("ENGRAM_EMBEDDING__REEMBED_BATCH", "0")
        .env("ENGRAM_LISTEN", format!("127.0.0.1:{port}"))
        .env("ENGRAM_AUTH__DEFAULT_TENANT", format!("cli-{}", uuid::Uuid::new_v4().simple()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status}");
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("server did not exit after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs engram with `args` and the environment pairs; panics with stderr on failure; returns stdout.
fn run_ok(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut c = engram();
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "engram {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// An export's memory records by id.
fn records(file: &str) -> std::collections::BTreeMap<String, serde_json::Value> {
    file.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["kind"] == "memory")
        .map(|r| (r["id"].as_str().unwrap().to_string(), r))
        .collect()
}

#[test]
fn export_and_import_move_a_tenant_from_the_embedded_backend_to_postgres() {
    use serde_json::json;
    let db = std::env::var("ENGRAM_TEST_DATABASE_URL")
        .expect("ENGRAM_TEST_DATABASE_URL is not set: run the tests with scripts/test.sh");
    let redis = std::env::var("ENGRAM_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let tenant = format!("cli-{}", uuid::Uuid::new_v4().simple());
    let dir = std::env::temp_dir().join(format!("engram-cli-export-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let data_dir = dir.join("data");
    let data_dir = data_dir.to_str().unwrap();

    // A hand-written export: one memory of each tier, a superseded fact, a vector.
    let vector: Vec<f32> = (0..384).map(|i| (i as f32 / 384.0) - 0.5).collect();
    let (old_fact, new_fact) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let common = |id: uuid::Uuid, tier: &str, content: &str| {
        json!({"kind": "memory", "id": id, "tier": tier, "agent_id": "a", "user_id": null, "session_id": null,
            "content": content, "importance": 0.5, "retention": "permanent", "metadata": {"k": "v"}, "private": false,
            "occurred_at": "2025-06-01T10:00:00Z", "created_at": "2025-06-01T10:00:00Z",
            "updated_at": "2025-06-02T10:00:00Z", "expires_at": null, "access_count": 3,
            "last_accessed_at": "2025-06-03T10:00:00Z", "embedding_model": null})
    };
    let mut working = common(uuid::Uuid::new_v4(), "working", "the current turn");
    working["session_id"] = json!("s1");
    working["expires_at"] = json!("2999-01-01T00:00:00Z");
    let mut episode = common(uuid::Uuid::new_v4(), "episodic", "we met in Lisbon");
    episode["event_type"] = json!("conversation");
    episode["embedding_model"] = json!("lexical-hash-v1-384");
    episode["vector"] = json!(vector);
    let fact = |id, content: &str, until: serde_json::Value, supersedes: serde_json::Value| {
        let mut f = common(id, "semantic", content);
        f["namespace"] = json!("agent:a");
        f["subject"] = json!("user");
        f["predicate"] = json!("city");
        f["confidence"] = json!(0.7);
        f["valid_from"] = json!("2025-06-01T10:00:00Z");
        f["valid_until"] = until;
        f["supersedes"] = supersedes;
        f
    };
    let mut skill = common(uuid::Uuid::new_v4(), "procedural", "deploy with the script");
    for (k, v) in [
        ("skill_name", json!("deploy")),
        ("success_count", json!(4)),
        ("failure_count", json!(1)),
        ("avg_reward", json!(0.25)),
        ("reward_count", json!(5)),
        ("version", json!(6)),
    ] {
        skill[k] = v;
    }
    let lines = [
        json!({"kind": "header", "format": "engram-export", "version": 1, "tenant": tenant,
            "exported_at": "2025-07-01T00:00:00Z", "vectors": true}),
        working,
        episode,
        fact(old_fact, "the user lives in Paris", json!("2025-06-05T00:00:00Z"), json!(null)),
        fact(new_fact, "the user lives in Berlin", json!(null), json!(old_fact)),
        skill,
        json!({"kind": "end", "counts": {"working": 1, "episodic": 1, "semantic": 2, "procedural": 1}}),
    ];
    let input = dir.join("input.jsonl");
    std::fs::write(&input, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();

    // Into a fresh data directory, then out again with vectors.
    let summary = run_ok(&["--data-dir", data_dir, "import", input.to_str().unwrap()], &[]);
    assert!(summary.contains(&format!("tenant {tenant}")), "{summary}");
    let embedded = dir.join("embedded.jsonl");
    run_ok(
        &["--data-dir", data_dir, "export", "--tenant", &tenant, "--vectors", "--output", embedded.to_str().unwrap()],
        &[],
    );
    let embedded = std::fs::read_to_string(&embedded).unwrap();
    let from_embedded = records(&embedded);
    assert_eq!(from_embedded.len(), 5);
    assert_eq!(from_embedded[&new_fact.to_string()]["supersedes"], json!(old_fact));
    assert_eq!(from_embedded[&old_fact.to_string()]["valid_until"], "2025-06-05T00:00:00Z");

    // Into Postgres and Redis from standard input, and out to standard output.
    let services = [("DATABASE_URL", db.as_str()), ("REDIS_URL", redis.as_str())];
    let mut child = engram()
        .args(["import", "-"])
        .env("DATABASE_URL", &db)
        .env("REDIS_URL", &redis)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), embedded.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let from_postgres = run_ok(&["export", "--tenant", &tenant, "--vectors"], &services);
    assert_eq!(records(&from_postgres), from_embedded);

    // A second import finds everything in place.
    let again = run_ok(&["import", input.to_str().unwrap()], &services);
    let semantic = again.lines().find(|l| l.starts_with("semantic")).unwrap();
    assert_eq!(semantic.split_whitespace().collect::<Vec<_>>(), ["semantic", "0", "2", "0"], "{again}");
    std::fs::remove_dir_all(&dir).unwrap();
}
