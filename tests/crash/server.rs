//! The `engram serve` process the crash tests start, kill and restart.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How long the server may take to answer /readyz (it migrates at start).
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The environment one server run gets; a restart reuses it unchanged.
pub struct ServerEnv {
    /// Empty: the embedded backend in `data_dir`.
    pub database_url: String,
    pub data_dir: String,
    pub redis_url: String,
    pub listen: String,
    pub tenant: String,
    pub key_prefix: String,
    /// More `ENGRAM_*` settings, set after the ones above.
    pub extra: Vec<(&'static str, String)>,
}

/// The running `engram serve` process. Dropping it kills the process, so a
/// failing assertion never leaves a server behind.
pub struct ServerProcess {
    child: Child,
    pub base: String,
}

impl ServerProcess {
    pub fn start(env: &ServerEnv) -> anyhow::Result<ServerProcess> {
        let mut command = Command::new(env!("CARGO_BIN_EXE_engram"));
        if env.database_url.is_empty() {
            command.env_remove("DATABASE_URL").env("ENGRAM_DATA_DIR", &env.data_dir);
        } else {
            command.env("DATABASE_URL", &env.database_url);
        }
        let child = command
            .arg("serve")
            // A developer's own settings must not turn on API keys or point
            // the server elsewhere.
            .env_remove("ENGRAM_API_KEYS")
            .env_remove("ENGRAM_CONFIG")
            .env("REDIS_URL", &env.redis_url)
            .env("ENGRAM_LISTEN", &env.listen)
            .env("ENGRAM_AUTH__DEFAULT_TENANT", &env.tenant)
            .env("ENGRAM_REDIS__KEY_PREFIX", &env.key_prefix)
            .env("ENGRAM_EMBEDDING__PROVIDER", "lexical-hash")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Startup failures and server-side errors show up in the test output.
            .stderr(Stdio::inherit())
            .envs(env.extra.iter().map(|(k, v)| (k, v)))
            .spawn()
            .context("spawning engram serve")?;
        Ok(ServerProcess { child, base: format!("http://{}", env.listen) })
    }

    /// Polls /readyz until it answers 200; fails early if the process exits.
    pub async fn wait_ready(&mut self, client: &reqwest::Client) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("engram serve exited before it was ready ({status}); its log is above");
            }
            if let Ok(r) = client.get(format!("{}/readyz", self.base)).send().await
                && r.status() == reqwest::StatusCode::OK
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("engram serve was not ready within {READY_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGKILL (what `Child::kill` sends on unix), then reap the process.
    pub fn kill_9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill_9();
    }
}

/// A port nobody listened on a moment ago.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}

/// A test service's address from the environment scripts/test.sh sets up.
pub fn service_url(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: run the tests with scripts/test.sh, which starts Postgres and Redis")
    })
}

/// A Postgres database of a test's own, on the test server: a server's
/// background workers (erasure, consolidation) work on everything in their
/// database, so a test that watches them gets one to itself.
pub struct OwnDatabase {
    admin: sqlx::PgPool,
    name: String,
    pub url: String,
}

impl OwnDatabase {
    pub async fn create() -> OwnDatabase {
        let base = service_url("ENGRAM_TEST_DATABASE_URL");
        let name = format!("engram_crash_{}", uuid::Uuid::new_v4().simple());
        let admin = sqlx::PgPool::connect(&base).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&admin).await.unwrap();
        let (server, _) = base.rsplit_once('/').expect("a database URL ends with its name");
        let url = format!("{server}/{name}");
        OwnDatabase { admin, name, url }
    }

    pub async fn drop(self) {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&self.admin).await.unwrap();
    }
}

/// A `redis-server` of a test's own on a free loopback port, never the
/// shared one: freezing or stopping it stops nobody else. Dropping it kills
/// it, frozen or not, so a failing assertion never leaves it behind.
pub struct OwnRedis {
    child: Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl OwnRedis {
    pub fn start() -> OwnRedis {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("engram-crash-redis-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let child = Self::spawn(port, &dir);
        let redis = OwnRedis { child, port, dir };
        redis.wait_up();
        redis
    }

    /// No save points: only `stop_saving` writes the data to disk.
    fn spawn(port: u16, dir: &std::path::Path) -> Child {
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on PATH")
    }

    fn wait_up(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.cli(&["ping"]).trim() != "PONG" {
            assert!(Instant::now() < deadline, "redis-server did not start on port {}", self.port);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// An outage that keeps the data: the server saves and exits, and
    /// `start_again` brings it back with what it held.
    pub fn stop_saving(&mut self) {
        let _ = self.cli(&["shutdown", "save"]);
        let status = self.child.wait().expect("redis-server exit");
        assert!(self.dir.join("dump.rdb").exists(), "redis-server exited ({status}) without saving");
    }

    /// Back on the same port with the data `stop_saving` saved.
    pub fn start_again(&mut self) {
        self.child = Self::spawn(self.port, &self.dir);
        self.wait_up();
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([signal, &self.child.id().to_string()]).status().expect("kill");
        assert!(status.success(), "kill {signal} of redis-server failed");
    }

    /// SIGSTOP: connections stay open, nothing is answered.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    /// What `redis-cli --raw` prints (one value a line).
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "--raw"])
            .args(args)
            .output()
            .expect("redis-cli on PATH");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn lines(&self, args: &[&str]) -> Vec<String> {
        self.cli(args).lines().filter(|l| !l.is_empty()).map(str::to_string).collect()
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        // A stopped process dies of SIGKILL too; SIGCONT first is only tidy.
        let _ = Command::new("kill").args(["-CONT", &self.child.id().to_string()]).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
