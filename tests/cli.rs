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
