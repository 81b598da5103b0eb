//! The `engram` command: serve, migrate, export and import a tenant, print
//! the OpenAPI document, print the effective configuration.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use engram::config::{Config, EmbeddingProvider};

/// mimalloc instead of the C library's allocator: a search allocates and
/// frees many short-lived strings and buffers (rows read as JSON, candidate
/// lists), where glibc's allocator spent a tenth of the server's CPU time
/// and returned large buffers to the kernel only to fault them in again.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "engram", version, about = "A memory server for AI agents")]
struct Cli {
    /// A TOML configuration file layered over the defaults.
    #[arg(long, global = true, env = "ENGRAM_CONFIG")]
    config: Option<PathBuf>,
    /// Directory of the embedded database (used when no DATABASE_URL is set);
    /// wins over ENGRAM_DATA_DIR and embedded.data_dir.
    #[arg(long, global = true)]
    data_dir: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the HTTP server.
    Serve {
        /// Address to listen on (overrides ENGRAM_LISTEN and server.listen).
        #[arg(long)]
        listen: Option<String>,
    },
    /// Apply pending database migrations (Postgres, or the embedded database) and exit.
    Migrate,
    /// Write every memory of a tenant (all tiers) as JSON Lines, from the
    /// configured backend.
    Export {
        /// The tenant to export.
        #[arg(long)]
        tenant: String,
        /// Include each memory's vector (else the importing side re-embeds).
        #[arg(long)]
        vectors: bool,
        /// Write to this file instead of standard output.
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
    /// Read an export into the configured backend; memories whose id exists
    /// are skipped, so an import can be re-run.
    Import {
        /// Import as this tenant instead of the one in the file's header.
        #[arg(long)]
        tenant: Option<String>,
        /// The export to read; `-` or nothing reads standard input.
        file: Option<PathBuf>,
    },
    /// The audit log of erasures, exports and imports.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Serve the MCP tools (remember, recall, context, forget) over standard
    /// input and output, for MCP clients that start their servers as
    /// commands. Opens the configured store, unless `--url` names a running
    /// server to forward to (the embedded store is owned by one process).
    Mcp {
        /// A running engram server to forward to, e.g. http://127.0.0.1:8080.
        #[arg(long)]
        url: Option<String>,
        /// The API key the tools act with, when the server has keys.
        #[arg(long, env = "ENGRAM_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
    },
    /// Print the OpenAPI document.
    Openapi,
    /// Print the effective configuration, secrets masked.
    Config,
}

#[derive(Subcommand)]
enum AuditCommand {
    /// Recompute the audit log's hash chains from the first entry and name
    /// the first entry that was edited, removed or reordered (exit status 1).
    Verify {
        /// Only this tenant's chain (default: every tenant's).
        #[arg(long)]
        tenant: Option<String>,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let mut config = match Config::load_with(cli.config.as_deref(), cli.data_dir.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("engram: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    if let Command::Serve { listen: Some(listen) } = &cli.command {
        config.server.listen = listen.clone();
        if let Err(e) = config.validate() {
            eprintln!("engram: {e}");
            return std::process::ExitCode::from(2);
        }
    }
    if config.embedding.provider == EmbeddingProvider::Local {
        // SAFETY: the process has one thread here; the runtime starts below.
        unsafe { engram::embed::local::pin_candle_threads(config.embedding.local.threads) };
    }
    let result = match cli.command {
        Command::Openapi => {
            print!("{}", engram::http::openapi_json());
            Ok(())
        }
        Command::Config => {
            print!("{}", config.redacted().to_toml());
            Ok(())
        }
        Command::Mcp { url, api_key } => runtime().and_then(|rt| rt.block_on(mcp(config, url, api_key))),
        Command::Migrate => runtime().and_then(|rt| rt.block_on(migrate(config))),
        Command::Serve { .. } => runtime().and_then(|rt| rt.block_on(serve(config))),
        Command::Export { tenant, vectors, output } => {
            runtime().and_then(|rt| rt.block_on(export(config, tenant, vectors, output)))
        }
        Command::Import { tenant, file } => runtime().and_then(|rt| rt.block_on(import(config, tenant, file))),
        Command::Audit { command: AuditCommand::Verify { tenant } } => {
            runtime().and_then(|rt| rt.block_on(verify_audit(config, tenant)))
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("engram: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")
}

async fn migrate(config: Config) -> anyhow::Result<()> {
    engram::telemetry::init_logging(&config.log);
    if config.database.url.is_empty() {
        let settings = engram::store::sqlite::SqliteSettings::default();
        let store = engram::store::sqlite::SqliteStore::open(config.embedded.data_dir.as_ref(), &settings).await?;
        store.close().await;
        tracing::info!(data_dir = %config.embedded.data_dir, "embedded database migrated");
        return Ok(());
    }
    let pool = engram::store::postgres::connect_lazy(&config.database, &config.search)?;
    engram::store::postgres::migrate(&pool).await?;
    tracing::info!("migrations applied");
    Ok(())
}

async fn serve(config: Config) -> anyhow::Result<()> {
    engram::telemetry::init_logging(&config.log);
    let listen = config.server.listen.clone();
    if let Ok(address) = listen.parse() {
        engram::app::refuse_keyless_on_network(&config, address)?;
    }
    let app = engram::app::build(config).await?;
    let listener = tokio::net::TcpListener::bind(&listen).await.with_context(|| format!("binding {listen}"))?;
    let shutdown = CancellationToken::new();
    engram::app::cancel_on_signal(shutdown.clone());
    engram::app::run(listener, app, shutdown).await
}

async fn mcp(config: Config, url: Option<String>, key: Option<String>) -> anyhow::Result<()> {
    use std::sync::Arc;

    use engram::mcp::{EngramMcp, Upstream};
    // Standard output carries the protocol: logs go to standard error.
    engram::telemetry::init_logging(&config.log);
    let shutdown = CancellationToken::new();
    engram::app::cancel_on_signal(shutdown.clone());
    if let Some(url) = url {
        let client = reqwest::Client::builder()
            .timeout(std::time::Duration::from_millis(config.server.write_timeout_ms + 5_000))
            .build()
            .context("building the HTTP client")?;
        let upstream = Upstream::Remote { client, base: url.trim_end_matches('/').to_string() };
        let server = EngramMcp::new(Arc::new(upstream), key.as_deref())?;
        return engram::mcp::serve_stdio(server, shutdown).await;
    }
    let mut app = engram::app::build(config).await?;
    if key.is_none() && !app.state.auth.is_open() {
        anyhow::bail!("the configuration has API keys: give the tools' key in ENGRAM_API_KEY (or --api-key)");
    }
    let tracker = tokio_util::task::TaskTracker::new();
    engram::jobs::spawn_all(&tracker, &mut app, shutdown.clone());
    tracker.close();
    let upstream = Upstream::Local(engram::http::router(app.state.clone()));
    let server = EngramMcp::new(Arc::new(upstream), key.as_deref())?;
    let served = engram::mcp::serve_stdio(server, shutdown.clone()).await;
    shutdown.cancel();
    tracker.wait().await;
    app.storage.maintenance.close().await;
    served
}

async fn export(config: Config, tenant: String, vectors: bool, output: Option<PathBuf>) -> anyhow::Result<()> {
    engram::telemetry::init_logging(&config.log);
    let now = chrono::Utc::now();
    let storage = engram::app::open_storage(&config).await?;
    let counts = match &output {
        Some(path) => {
            let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
            let mut out = std::io::BufWriter::new(file);
            engram::transfer::export(&storage, &tenant, vectors, &mut out, now).await
        }
        None => {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            engram::transfer::export(&storage, &tenant, vectors, &mut out, now).await
        }
    };
    let audited = match &counts {
        Ok(counts) => {
            let counts: serde_json::Map<String, serde_json::Value> =
                counts.iter().map(|(tier, n)| (tier.as_str().to_string(), (*n).into())).collect();
            audit(&storage, &tenant, "export", serde_json::json!({"tenant": tenant, "vectors": vectors}), counts.into())
                .await
        }
        Err(_) => Ok(()),
    };
    storage.maintenance.close().await;
    let counts = counts?;
    audited?;
    let listed: Vec<String> = counts.iter().map(|(tier, n)| format!("{} {n}", tier.as_str())).collect();
    eprintln!("exported tenant {tenant}: {}", listed.join(", "));
    Ok(())
}

/// Appends an entry for a command-line operation to the tenant's audit log.
async fn audit(
    storage: &engram::store::Storage,
    tenant: &str,
    operation: &str,
    target: serde_json::Value,
    counts: serde_json::Value,
) -> anyhow::Result<()> {
    let entry = engram::domain::erasure::NewAuditEntry {
        tenant: tenant.to_string(),
        at: chrono::Utc::now(),
        actor: "cli".into(),
        operation: operation.into(),
        target,
        counts,
    };
    storage.erasure.append_audit(&entry).await.context("appending to the audit log")?;
    Ok(())
}

async fn verify_audit(config: Config, tenant: Option<String>) -> anyhow::Result<()> {
    engram::telemetry::init_logging(&config.log);
    let storage = engram::app::open_storage(&config).await?;
    let result = engram::jobs::erasure::verify_audit(storage.erasure.as_ref(), tenant.as_deref()).await;
    storage.maintenance.close().await;
    match result? {
        (checked, None) => {
            println!("audit log intact: {checked} entries verified");
            Ok(())
        }
        (checked, Some(broken)) => anyhow::bail!(
            "audit log broken at entry seq {} (tenant {}): {}; {checked} entries before it verified",
            broken.seq,
            broken.tenant,
            broken.reason
        ),
    }
}

async fn import(config: Config, tenant: Option<String>, file: Option<PathBuf>) -> anyhow::Result<()> {
    engram::telemetry::init_logging(&config.log);
    let now = chrono::Utc::now();
    let storage = engram::app::open_storage(&config).await?;
    // Progress over the bytes read: with a file's size, also the time left.
    let summary = match file.filter(|f| f.as_os_str() != "-") {
        Some(path) => {
            let file = std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
            let bar = engram::progress::bytes("import", file.metadata().ok().map(|m| m.len()));
            let input = std::io::BufReader::new(bar.wrap_read(file));
            let summary = engram::transfer::import(&storage, tenant.as_deref(), input, now).await;
            bar.finish_and_clear();
            summary
        }
        None => {
            let bar = engram::progress::bytes("import", None);
            let input = std::io::BufReader::new(bar.wrap_read(std::io::stdin().lock()));
            let summary = engram::transfer::import(&storage, tenant.as_deref(), input, now).await;
            bar.finish_and_clear();
            summary
        }
    };
    let audited = match &summary {
        Ok(s) => {
            let counts: serde_json::Map<String, serde_json::Value> = s
                .tiers
                .iter()
                .map(|(tier, t)| {
                    let v = serde_json::json!({"imported": t.imported, "skipped_existing": t.skipped_existing,
                        "skipped_expired": t.skipped_expired});
                    (tier.as_str().to_string(), v)
                })
                .collect();
            audit(&storage, &s.tenant, "import", serde_json::json!({"tenant": s.tenant}), counts.into()).await
        }
        Err(_) => Ok(()),
    };
    storage.maintenance.close().await;
    print!("{}", summary?);
    audited?;
    Ok(())
}
