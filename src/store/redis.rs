//! Working memory and the procedural-skill cache on Redis (fred).
//!
//! Layout, every key under the configured prefix, components escaped so that
//! an id containing `:` or a brace can never collide with another or pick
//! its own hash slot:
//!   `{prefix}:{tenant}:wm:l:{S}`        a session's entry ids, oldest first
//!   `{prefix}:{tenant}:wm:e:{S}:{id}`   one working entry (JSON), with its TTL
//!   `{prefix}:{tenant}:wm:p:{id}`       the key of entry `id` (reads by id), same TTL
//!   `{prefix}:{tenant}:skill:{id}`      a cached procedural memory (JSON)
//! where `{S}` is the hash tag `{tenant:agent:session}`, braces included: on
//! Redis Cluster a session's list and entries hash to one slot, so a session
//! lives on one node and is read with one LRANGE and one MGET. Appending is
//! RPUSH (O(1)); a session keeps at most `working_max_entries` ids and the
//! entries pushed out are deleted. Every other command is single-key or
//! pipelined per key, so the layout works on a single server and a cluster.
//!
//! Versions before this layout kept entries at `{prefix}:{tenant}:wm:m:{id}`
//! and lists at `{prefix}:{tenant}:wm:s:{agent}:{session}`;
//! `move_old_layout` (run by the maintenance job at every start) moves them.
//!
//! When Redis cannot be reached, calls fail with `Unavailable` and the HTTP
//! layer answers 503 with Retry-After. Request-path calls go through a
//! circuit breaker (`breaker.rs`), so once Redis is known down they fail at
//! once instead of waiting the command timeout: nothing here slows the
//! persistent tiers.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use fred::prelude::*;
use fred::types::Expiration;
use uuid::Uuid;

use super::breaker::Breaker;
use super::{Doomed, SkillCache, StoreError, StoreResult, WorkingMemory};
use crate::config::RedisConfig;
use crate::domain::Memory;

/// RPUSH the ids the list does not hold yet (an entry written again, from
/// the outbox, keeps its place), stretch the list's TTL to the longest
/// entry's, and pop (returning) what exceeds the bound. ARGV: ttl seconds,
/// max length, ids...
const APPEND_SCRIPT: &str = r#"
local n = redis.call('LLEN', KEYS[1])
for i = 3, #ARGV do
  if not redis.call('LPOS', KEYS[1], ARGV[i]) then n = redis.call('RPUSH', KEYS[1], ARGV[i]) end
end
local ttl = redis.call('TTL', KEYS[1])
if ttl < tonumber(ARGV[1]) then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
local max = tonumber(ARGV[2])
if n > max then return redis.call('LPOP', KEYS[1], n - max) end
return {}
"#;

#[derive(Clone)]
pub struct RedisStore {
    /// Pooled, auto-reconnecting clients.
    pool: Pool,
    prefix: String,
    max_entries: usize,
    skill_ttl_secs: i64,
    retry_after_secs: u64,
    /// Per-command timeout (also bounds each step of a SCAN).
    timeout: Duration,
    /// Shared by every clone: request-path calls fail at once while Redis
    /// is known down (`breaker.rs`).
    breaker: std::sync::Arc<Breaker>,
}

/// The client configuration of a Redis URL: a single server, or a cluster
/// (`redis-cluster://host1:port1,host2:port2,...`).
pub fn client_config(url: &str) -> Result<Config, fred::error::Error> {
    if url.starts_with("redis-cluster://") || url.starts_with("rediss-cluster://") {
        Config::from_url_clustered(&cluster_url(url))
    } else {
        Config::from_url(url)
    }
}

/// A cluster URL as the configuration takes it, `redis-cluster://[user:pass@]
/// host1:port1,host2:port2[/db][?query]`, in the form the client parses:
/// the first node in the authority, the others as `node` query parameters.
fn cluster_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    let mut nodes = hosts.split(',').map(str::trim).filter(|h| !h.is_empty());
    let Some(first) = nodes.next() else { return url.to_string() };
    let others: Vec<String> = nodes.map(|n| format!("node={n}")).collect();
    if others.is_empty() {
        return url.to_string();
    }
    let (path, query) = match tail.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (tail, None),
    };
    let mut params = others.join("&");
    if let Some(q) = query.filter(|q| !q.is_empty()) {
        params = format!("{q}&{params}");
    }
    format!("{scheme}://{userinfo}{first}{path}?{params}")
}

/// Escapes `%` and `:` so key components cannot run into each other, and
/// braces so that no component can open or close a hash tag.
fn esc(s: &str) -> String {
    s.replace('%', "%25").replace(':', "%3A").replace('{', "%7B").replace('}', "%7D")
}

/// The keys of one session: its list, and the stem its entries' keys share.
struct SessionKeys {
    list: String,
    entry_stem: String,
}

/// The keys of a session, `{S}` being the hash tag `{tenant:agent:session}`.
fn session_keys(prefix: &str, tenant: &str, agent: &str, session: &str) -> SessionKeys {
    let t = esc(tenant);
    let tag = format!("{{{t}:{}:{}}}", esc(agent), esc(session));
    SessionKeys { list: format!("{prefix}:{t}:wm:l:{tag}"), entry_stem: format!("{prefix}:{t}:wm:e:{tag}:") }
}

impl SessionKeys {
    fn entry(&self, id: Uuid) -> String {
        format!("{}{id}", self.entry_stem)
    }
}

impl RedisStore {
    /// Builds the client pool and starts connecting in the background: the
    /// server comes up even when Redis is down, and reconnects on its own.
    pub fn connect(config: &RedisConfig) -> anyhow::Result<RedisStore> {
        let redis_config = client_config(&config.url)?;
        let timeout = Duration::from_millis(config.timeout_ms);
        let pool = Builder::from_config(redis_config)
            .with_performance_config(|p| p.default_command_timeout = timeout)
            .with_connection_config(|c| {
                c.connection_timeout = timeout;
                c.internal_command_timeout = timeout;
                c.max_command_attempts = 1;
            })
            .set_policy(ReconnectPolicy::new_exponential(0, 100, 2_000, 2))
            .build_pool(config.pool_size)?;
        pool.connect();
        Ok(RedisStore {
            pool,
            prefix: config.key_prefix.clone(),
            max_entries: config.working_max_entries,
            skill_ttl_secs: config.procedural_cache_ttl_secs as i64,
            retry_after_secs: config.retry_after_secs,
            timeout,
            breaker: std::sync::Arc::new(Breaker::new(
                config.breaker_failures,
                Duration::from_millis(config.breaker_cooldown_ms),
            )),
        })
    }

    /// The keys of a session. The prefix has no braces (checked at start)
    /// and the components are escaped, so `{S}` is the key's only hash tag.
    fn session_keys(&self, tenant: &str, agent: &str, session: &str) -> SessionKeys {
        session_keys(&self.prefix, tenant, agent, session)
    }

    fn keys_of(&self, tenant: &str, m: &Memory) -> SessionKeys {
        self.session_keys(tenant, &m.agent_id, m.session_id.as_deref().unwrap_or_default())
    }

    /// The keys of the session whose list is `list`, and its tenant.
    fn parse_list_key(&self, list: &str) -> Option<(String, SessionKeys)> {
        let rest = list.strip_prefix(&self.prefix)?.strip_prefix(':')?;
        // An escaped tenant has no `:`, so the first marker is the right one.
        let (tenant, tag) = rest.split_once(":wm:l:")?;
        let entry_stem = format!("{}:{tenant}:wm:e:{tag}:", self.prefix);
        Some((unesc(tenant), SessionKeys { list: list.to_string(), entry_stem }))
    }

    /// Where the key of entry `id` is kept, for reads by id.
    fn pointer_key(&self, tenant: &str, id: Uuid) -> String {
        format!("{}:{}:wm:p:{id}", self.prefix, esc(tenant))
    }

    pub fn skill_key(&self, tenant: &str, id: Uuid) -> String {
        format!("{}:{}:skill:{id}", self.prefix, esc(tenant))
    }

    pub async fn shutdown(&self) {
        let _ = self.pool.quit().await;
    }

    fn unavailable(&self, e: fred::error::Error) -> StoreError {
        StoreError::Unavailable { what: "working memory", retry_after_secs: self.retry_after_secs, source: e.into() }
    }

    /// The error of a call the open breaker refused.
    fn refused(&self) -> StoreError {
        self.unavailable(fred::error::Error::new(fred::error::ErrorKind::Unknown, "circuit breaker open"))
    }

    /// Runs a request-path call through the breaker: refused at once while
    /// it is open; an `Unavailable` answer counts as a failure.
    async fn guarded<T>(&self, call: impl std::future::Future<Output = StoreResult<T>>) -> StoreResult<T> {
        let Some(permit) = self.breaker.admit() else { return Err(self.refused()) };
        let result = call.await;
        match &result {
            Err(StoreError::Unavailable { .. }) => permit.failure(),
            _ => permit.success(),
        }
        result
    }

    fn skill_ttl(&self) -> Duration {
        Duration::from_secs(self.skill_ttl_secs.max(1) as u64)
    }

    fn observe(op: &'static str, started: std::time::Instant) {
        metrics::histogram!("engram_store_operation_duration_seconds", "backend" => "redis", "op" => op)
            .record(started.elapsed().as_secs_f64());
    }

    async fn get_json(&self, key: String) -> StoreResult<Option<Memory>> {
        let raw: Option<String> = self.pool.get(key).await.map_err(|e| self.unavailable(e))?;
        raw.map(|s| serde_json::from_str(&s).map_err(|e| StoreError::Internal(e.into()))).transpose()
    }

    async fn get_many(&self, keys: Vec<String>) -> StoreResult<Vec<Option<String>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let pipeline = self.pool.next().pipeline();
        for key in keys {
            let _: () = pipeline.get(key).await.map_err(|e| self.unavailable(e))?;
        }
        pipeline.all().await.map_err(|e| self.unavailable(e))
    }

    /// How many of these skills the cache holds (an erasure's verification).
    pub async fn cached_skills(&self, tenant: &str, ids: &[Uuid]) -> StoreResult<u64> {
        let mut n = 0;
        for id in ids {
            let exists: i64 = self.pool.exists(self.skill_key(tenant, *id)).await.map_err(|e| self.unavailable(e))?;
            n += exists as u64;
        }
        Ok(n)
    }

    /// A session's listed ids and, in the same order, their entries (None:
    /// gone by its TTL). One LRANGE and one MGET: the keys share a slot.
    async fn listed(&self, keys: &SessionKeys) -> StoreResult<(Vec<Uuid>, Vec<Option<String>>)> {
        let ids: Vec<String> = self.pool.lrange(&keys.list, 0, -1).await.map_err(|e| self.unavailable(e))?;
        let ids: Vec<Uuid> = ids.iter().filter_map(|id| id.parse().ok()).collect();
        if ids.is_empty() {
            return Ok((ids, Vec::new()));
        }
        let entry_keys: Vec<String> = ids.iter().map(|id| keys.entry(*id)).collect();
        let raws: Vec<Option<String>> = self.pool.mget(entry_keys).await.map_err(|e| self.unavailable(e))?;
        Ok((ids, raws))
    }

    /// Every live working-memory entry of a tenant, session by session (in
    /// key order), each session oldest first (for export). The session
    /// lists are found with SCAN, which never blocks Redis.
    pub async fn entries(&self, tenant: &str) -> StoreResult<Vec<Memory>> {
        let pattern = format!("{}:{}:wm:l:*", glob_escape(&self.prefix), glob_escape(&esc(tenant)));
        let mut sessions = self.scan(pattern).await?;
        sessions.sort();
        let mut out = Vec::new();
        for list in sessions {
            let Some((_, keys)) = self.parse_list_key(&list) else { continue };
            for raw in self.listed(&keys).await?.1.into_iter().flatten() {
                out.push(parse(&raw)?);
            }
        }
        Ok(out)
    }

    /// Deletes working-memory entries expired at `now` (by their own
    /// `expires_at`, whatever their key's TTL says), up to about `limit` of
    /// them, and takes out of every session list the ids whose entry is gone
    /// (expired by its TTL, or deleted here); returns the deleted entries.
    /// Session lists are found with SCAN across tenants; a list emptied
    /// this way is deleted with its last id.
    pub async fn sweep_expired(&self, now: DateTime<Utc>, limit: usize) -> StoreResult<Vec<Doomed>> {
        let mut deleted = Vec::new();
        for list in self.scan(format!("{}:*:wm:l:*", glob_escape(&self.prefix))).await? {
            let Some((tenant, keys)) = self.parse_list_key(&list) else { continue };
            let (ids, raws) = self.listed(&keys).await?;
            for (id, raw) in ids.into_iter().zip(raws) {
                if let Some(raw) = raw {
                    if !parse(&raw)?.is_expired(now) {
                        continue;
                    }
                    // One by one: the pointer is on another slot.
                    for key in [keys.entry(id), self.pointer_key(&tenant, id)] {
                        let _: i64 = self.pool.del(key).await.map_err(|e| self.unavailable(e))?;
                    }
                    deleted.push(Doomed { tenant: tenant.clone(), id });
                }
                // Deleted here, or gone by its TTL: only the list still names it.
                let _: i64 = self.pool.lrem(&keys.list, 0, id.to_string()).await.map_err(|e| self.unavailable(e))?;
            }
            if deleted.len() >= limit {
                break;
            }
        }
        Ok(deleted)
    }

    /// Moves the entries kept in the layout of earlier versions (entries at
    /// `wm:m:{id}`, lists at `wm:s:{agent}:{session}`) into this one, session
    /// by session: written anew (their remaining time to live from their
    /// `expires_at`), then the old keys deleted. A crash in between leaves the
    /// old keys, and the next run writes the same entries again, which the
    /// append keeps once. Returns how many entries moved.
    pub async fn move_old_layout(&self, now: DateTime<Utc>) -> StoreResult<u64> {
        let mut moved = 0;
        // No key of this layout contains `:wm:s:` after the prefix: escaped
        // components have no `:`, and the hash tag ends with `}`.
        for list in self.scan(format!("{}:*:wm:s:*", glob_escape(&self.prefix))).await? {
            let Some(tenant) = list
                .strip_prefix(&self.prefix)
                .and_then(|r| r.strip_prefix(':'))
                .and_then(|r| r.split_once(":wm:s:"))
                .map(|(t, _)| t.to_string())
            else {
                continue;
            };
            let ids: Vec<String> = self.pool.lrange(&list, 0, -1).await.map_err(|e| self.unavailable(e))?;
            let old: Vec<String> = ids
                .iter()
                .filter_map(|id| id.parse::<Uuid>().ok())
                .map(|id| format!("{}:{tenant}:wm:m:{id}", self.prefix))
                .collect();
            let mut live = Vec::new();
            for raw in self.get_many(old.clone()).await?.into_iter().flatten() {
                let m = parse(&raw)?;
                if !m.is_expired(now) {
                    live.push(m);
                }
            }
            if !live.is_empty() {
                self.write_entries(&unesc(&tenant), &live, now).await?;
            }
            // Deleted one by one: the old keys need not share a slot.
            for key in old.into_iter().chain([list]) {
                let _: i64 = self.pool.del(key).await.map_err(|e| self.unavailable(e))?;
            }
            moved += live.len() as u64;
        }
        Ok(moved)
    }

    /// Writes entries, their pointers, then the session lists that name
    /// them; deletes what a list pushes out past its bound.
    async fn write_entries(&self, tenant: &str, items: &[Memory], now: DateTime<Utc>) -> StoreResult<()> {
        let pipeline = self.pool.next().pipeline();
        for m in items {
            let json = serde_json::to_string(m).map_err(|e| StoreError::Internal(e.into()))?;
            let expire = Self::ttl_secs(m.expires_at, now).map(Expiration::EX);
            let entry = self.keys_of(tenant, m).entry(m.id);
            let _: () = pipeline
                .set(self.pointer_key(tenant, m.id), entry.clone(), expire.clone(), None, false)
                .await
                .map_err(|e| self.unavailable(e))?;
            let _: () = pipeline.set(entry, json, expire, None, false).await.map_err(|e| self.unavailable(e))?;
        }
        let _: Vec<Value> = pipeline.all().await.map_err(|e| self.unavailable(e))?;

        let mut sessions: Vec<(SessionKeys, i64, Vec<String>)> = Vec::new();
        for m in items {
            let keys = self.keys_of(tenant, m);
            let ttl = Self::ttl_secs(m.expires_at, now).unwrap_or(i64::MAX / 2);
            match sessions.iter_mut().find(|(k, _, _)| k.list == keys.list) {
                Some((_, t, ids)) => {
                    *t = (*t).max(ttl);
                    ids.push(m.id.to_string());
                }
                None => sessions.push((keys, ttl, vec![m.id.to_string()])),
            }
        }
        for (keys, ttl, ids) in sessions {
            let mut args = vec![ttl.to_string(), self.max_entries.to_string()];
            args.extend(ids);
            let evicted: Vec<String> =
                self.pool.eval(APPEND_SCRIPT, vec![keys.list.clone()], args).await.map_err(|e| self.unavailable(e))?;
            for id in evicted.iter().filter_map(|id| id.parse::<Uuid>().ok()) {
                let _: i64 = self.pool.del(keys.entry(id)).await.map_err(|e| self.unavailable(e))?;
                let _: i64 = self.pool.del(self.pointer_key(tenant, id)).await.map_err(|e| self.unavailable(e))?;
            }
        }
        Ok(())
    }

    /// A tenant's working-memory entries expired at `now` but still stored:
    /// how many, and up to `limit` ids.
    pub async fn expired_of(&self, tenant: &str, now: DateTime<Utc>, limit: usize) -> StoreResult<(u64, Vec<Uuid>)> {
        let mut expired: Vec<Memory> = self.entries(tenant).await?.into_iter().filter(|m| m.is_expired(now)).collect();
        expired.sort_by_key(|m| (m.expires_at, m.id));
        let count = expired.len() as u64;
        Ok((count, expired.into_iter().take(limit).map(|m| m.id).collect()))
    }

    /// Keys matching `pattern`, with SCAN (which never blocks Redis). Each
    /// key must arrive within the command timeout: a SCAN stream does not
    /// time out by itself, and waits for a reconnection that may never come.
    async fn scan(&self, pattern: String) -> StoreResult<Vec<String>> {
        use futures::{StreamExt, TryStreamExt};
        // A SCAN stream of a client that lost its connection can end empty
        // instead of failing: an empty answer must mean "no keys", never
        // "Redis is down" (an erasure's verification relies on it).
        let _: String = self.pool.ping(None).await.map_err(|e| self.unavailable(e))?;
        let client = self.pool.next();
        let mut stream = if client.is_clustered() {
            client.scan_cluster_buffered(pattern, Some(500), None).boxed()
        } else {
            client.scan_buffered(pattern, Some(500), None).boxed()
        };
        let mut keys = Vec::new();
        loop {
            match tokio::time::timeout(self.timeout, stream.try_next()).await {
                Ok(Ok(Some(key))) => keys.extend(key.into_string()),
                Ok(Ok(None)) => return Ok(keys),
                Ok(Err(e)) => return Err(self.unavailable(e)),
                Err(_) => {
                    let e = fred::error::Error::new(fred::error::ErrorKind::Timeout, "SCAN timed out");
                    return Err(self.unavailable(e));
                }
            }
        }
    }

    /// Seconds until `expires_at`, at least 1 (None: no expiry).
    fn ttl_secs(expires_at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Option<i64> {
        expires_at.map(|e| (e - now).num_seconds().max(1))
    }
}

/// Reverses `esc`.
fn unesc(s: &str) -> String {
    s.replace("%7D", "}").replace("%7B", "{").replace("%3A", ":").replace("%25", "%")
}

/// An entry as stored.
fn parse(raw: &str) -> StoreResult<Memory> {
    serde_json::from_str(raw).map_err(|e| StoreError::Internal(e.into()))
}

/// Escapes the characters a SCAN pattern treats as wildcards.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[async_trait]
impl WorkingMemory for RedisStore {
    fn available(&self) -> StoreResult<()> {
        if self.breaker.is_open() { Err(self.refused()) } else { Ok(()) }
    }

    async fn entries(&self, tenant: &str) -> StoreResult<Vec<Memory>> {
        RedisStore::entries(self, tenant).await
    }

    async fn ping(&self) -> StoreResult<()> {
        self.guarded(async {
            let _: String = self.pool.ping(None).await.map_err(|e| self.unavailable(e))?;
            Ok(())
        })
        .await
    }

    async fn append(&self, tenant: &str, items: &[Memory], now: DateTime<Utc>) -> StoreResult<()> {
        self.guarded(async {
            let started = std::time::Instant::now();
            self.write_entries(tenant, items, now).await?;
            Self::observe("append", started);
            Ok(())
        })
        .await
    }

    async fn remove(&self, tenant: &str, items: &[Memory]) -> StoreResult<()> {
        self.guarded(async {
            let started = std::time::Instant::now();
            for m in items {
                let keys = self.keys_of(tenant, m);
                let _: i64 = self.pool.del(keys.entry(m.id)).await.map_err(|e| self.unavailable(e))?;
                let _: i64 = self.pool.del(self.pointer_key(tenant, m.id)).await.map_err(|e| self.unavailable(e))?;
                let _: i64 = self.pool.lrem(&keys.list, 0, m.id.to_string()).await.map_err(|e| self.unavailable(e))?;
            }
            Self::observe("remove", started);
            Ok(())
        })
        .await
    }

    async fn get(&self, tenant: &str, id: Uuid) -> StoreResult<Option<Memory>> {
        self.guarded(async {
            let started = std::time::Instant::now();
            let entry: Option<String> =
                self.pool.get(self.pointer_key(tenant, id)).await.map_err(|e| self.unavailable(e))?;
            let found = match entry {
                Some(key) => self.get_json(key).await?,
                None => None,
            };
            Self::observe("get", started);
            Ok(found)
        })
        .await
    }

    async fn session(&self, tenant: &str, agent_id: &str, session_id: &str) -> StoreResult<Vec<Memory>> {
        self.guarded(async {
            let started = std::time::Instant::now();
            let (_, raws) = self.listed(&self.session_keys(tenant, agent_id, session_id)).await?;
            let out = raws.iter().flatten().map(|raw| parse(raw)).collect::<StoreResult<Vec<_>>>()?;
            Self::observe("session", started);
            Ok(out)
        })
        .await
    }

    async fn replace(&self, tenant: &str, memory: &Memory, now: DateTime<Utc>) -> StoreResult<()> {
        self.guarded(async {
            let json = serde_json::to_string(memory).map_err(|e| StoreError::Internal(e.into()))?;
            let expire = Self::ttl_secs(memory.expires_at, now).map(Expiration::EX);
            let entry = self.keys_of(tenant, memory).entry(memory.id);
            // The pointer too: a patch may change the time to live.
            let _: () = self
                .pool
                .set(self.pointer_key(tenant, memory.id), entry.clone(), expire.clone(), None, false)
                .await
                .map_err(|e| self.unavailable(e))?;
            let _: () = self.pool.set(entry, json, expire, None, false).await.map_err(|e| self.unavailable(e))?;
            Ok(())
        })
        .await
    }
}

#[async_trait]
impl SkillCache for RedisStore {
    /// Misses while the breaker says Redis was in trouble within a skill's
    /// time to live: an eviction may have failed then, and an entry cached
    /// before it may be older than the database. Every entry cached before
    /// the trouble has expired once the window ends.
    async fn get(&self, tenant: &str, id: Uuid) -> StoreResult<Option<Memory>> {
        if self.breaker.troubled_within(self.skill_ttl()) {
            return Ok(None);
        }
        self.guarded(self.get_json(self.skill_key(tenant, id))).await
    }

    async fn put(&self, tenant: &str, memory: &Memory) -> StoreResult<()> {
        if self.breaker.troubled_within(self.skill_ttl()) {
            return Ok(());
        }
        let json = serde_json::to_string(memory).map_err(|e| StoreError::Internal(e.into()))?;
        self.guarded(async {
            let _: () = self
                .pool
                .set(
                    self.skill_key(tenant, memory.id),
                    json,
                    Some(Expiration::EX(self.skill_ttl_secs.max(1))),
                    None,
                    false,
                )
                .await
                .map_err(|e| self.unavailable(e))?;
            Ok(())
        })
        .await
    }

    async fn evict(&self, tenant: &str, id: Uuid) -> StoreResult<()> {
        self.guarded(async {
            let _: i64 = self.pool.del(self.skill_key(tenant, id)).await.map_err(|e| self.unavailable(e))?;
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::{cluster_url, esc, session_keys, unesc};
    use fred::prelude::Config;

    #[test]
    fn a_cluster_url_lists_its_other_nodes_as_node_parameters() {
        assert_eq!(
            cluster_url("redis-cluster://127.0.0.1:7001,127.0.0.1:7002, 127.0.0.1:7003"),
            "redis-cluster://127.0.0.1:7001?node=127.0.0.1:7002&node=127.0.0.1:7003"
        );
        assert_eq!(cluster_url("rediss-cluster://u:p@a:1,b:2/0?x=1"), "rediss-cluster://u:p@a:1/0?x=1&node=b:2");
        // The client's own form passes through.
        let own = "redis-cluster://a:1?node=b:2";
        assert_eq!(cluster_url(own), own);
        assert!(Config::from_url_clustered(&cluster_url("redis-cluster://127.0.0.1:7001,127.0.0.1:7002")).is_ok());
    }

    #[test]
    fn a_session_lives_on_one_slot() {
        use fred::util::redis_keyslot;
        let id = uuid::Uuid::new_v4();
        let keys = session_keys("engram", "t", "agent-1", "s-1");
        assert_eq!(keys.list, "engram:t:wm:l:{t:agent-1:s-1}");
        assert_eq!(keys.entry(id), format!("engram:t:wm:e:{{t:agent-1:s-1}}:{id}"));
        assert_eq!(redis_keyslot(keys.list.as_bytes()), redis_keyslot(keys.entry(id).as_bytes()));
        assert_eq!(redis_keyslot(keys.list.as_bytes()), redis_keyslot(b"t:agent-1:s-1"));
        // Braces in a component cannot make a tag of their own or end ours.
        let odd = session_keys("engram", "{t}", "a}b", "{");
        assert_eq!(odd.list, "engram:%7Bt%7D:wm:l:{%7Bt%7D:a%7Db:%7B}");
        assert_eq!(redis_keyslot(odd.list.as_bytes()), redis_keyslot(b"%7Bt%7D:a%7Db:%7B"));
        assert_eq!(unesc(&esc("{a}:%7B")), "{a}:%7B");
        // Another session of the same agent is another tag.
        assert_ne!(session_keys("engram", "t", "agent-1", "s-2").list, keys.list);
    }

    #[test]
    fn key_components_cannot_collide() {
        // agent "a:b" + session "c" must differ from agent "a" + session "b:c".
        assert_ne!(format!("{}:{}", esc("a:b"), esc("c")), format!("{}:{}", esc("a"), esc("b:c")));
        assert_eq!(esc("50%:x"), "50%25%3Ax");
        assert_eq!(unesc(&esc("50%3A:x%")), "50%3A:x%");
    }
}
