//! Working memory in the SQLite database, and the skill cache as an
//! in-process map: the Redis backend's two roles (`store/redis.rs`) without
//! Redis.
//!
//! Working memory is a table, not a map, so that an acknowledged write
//! survives a crash like every other write. Each entry is stored as the
//! Redis backend stores it (the memory as JSON) with a deadline that
//! follows Redis's TTL rule: the seconds from `now` to the memory's
//! `expires_at` (at least 1), counted from the wall clock at the write,
//! since reads (which take no `now`) check the wall clock.
//!
//! Sessions read by searches are kept parsed in process (`SessionCache`):
//! a search reads its whole session, up to `working_max_entries` entries,
//! and parsing them again for every search cost more than the rest of the
//! read. Every write to the table goes through this file and drops the
//! tenant's cached sessions after its commit.
//!
//! The skill cache holds copies of procedural memories for a few minutes;
//! losing it on restart costs one read per skill.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::rows::to_json_text;
use super::{Inner, micros, observe, store_error};
use crate::domain::Memory;
use crate::store::{SkillCache, StoreError, StoreResult, WorkingMemory};

/// A session: tenant, agent, session id.
type SessionKey = (String, String, String);

/// A session's entries, oldest first, each with its wall-clock deadline in
/// microseconds (None: never).
type Entries = Arc<Vec<(Memory, Option<i64>)>>;

/// Entries kept parsed across all cached sessions; past it, the cache starts
/// afresh (at 500 entries a session, 50 sessions: tens of MB of text).
const CACHED_ENTRIES: usize = 25_000;

/// Parsed sessions, as the database held them when they were read.
///
/// A read that raced a write must not cache what it read: each write bumps
/// `generation` after its commit, and a read caches its result only if the
/// generation is still the one it saw before reading.
#[derive(Default)]
pub(super) struct SessionCache {
    generation: u64,
    sessions: HashMap<SessionKey, Entries>,
}

impl SessionCache {
    /// After a commit that changed `tenant`'s working memory: forgets its
    /// sessions. All of them: a write names the sessions its entries go to,
    /// not those an entry it replaces came from.
    fn forget(&mut self, tenant: &str) {
        self.generation += 1;
        self.sessions.retain(|(t, _, _), _| t != tenant);
    }

    fn keep(&mut self, generation: u64, key: SessionKey, entries: Entries) {
        if generation != self.generation || entries.len() > CACHED_ENTRIES {
            return;
        }
        let held: usize = self.sessions.iter().filter(|(k, _)| **k != key).map(|(_, e)| e.len()).sum();
        if held + entries.len() > CACHED_ENTRIES {
            self.sessions.clear();
        }
        self.sessions.insert(key, entries);
    }
}

/// Working memory on the store's database (see `SqliteStore::working_memory`).
#[derive(Clone)]
pub struct SqliteWorkingMemory {
    inner: Arc<Inner>,
}

impl SqliteWorkingMemory {
    pub(super) fn new(inner: Arc<Inner>) -> Self {
        Self { inner }
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, SessionCache> {
        // Every change to the cache leaves it consistent, so a poisoned one is usable.
        self.inner.sessions.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Drops the tenant's cached sessions, after a commit that changed its
    /// working memory outside this file (the retention sweep).
    pub(super) fn forget_sessions(&self, tenant: &str) {
        self.sessions().forget(tenant);
    }

    /// Every live entry of a tenant, in append order (for export).
    pub async fn entries(&self, tenant: &str) -> StoreResult<Vec<Memory>> {
        let entries: Vec<String> = sqlx::query_scalar(
            "select entry from working_memory where tenant_id = ? and (expires_at is null or expires_at > ?) \
             order by seq",
        )
        .bind(tenant)
        .bind(micros(Utc::now()))
        .fetch_all(&self.inner.pool)
        .await
        .map_err(store_error)?;
        entries.iter().map(|e| parse(e)).collect()
    }
}

/// The wall-clock deadline of an entry, in microseconds (None: never).
fn deadline(expires_at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Option<i64> {
    expires_at.map(|e| micros(Utc::now() + chrono::Duration::seconds((e - now).num_seconds().max(1))))
}

fn parse(entry: &str) -> StoreResult<Memory> {
    serde_json::from_str(entry).map_err(|e| StoreError::Internal(e.into()))
}

#[async_trait]
impl WorkingMemory for SqliteWorkingMemory {
    async fn entries(&self, tenant: &str) -> StoreResult<Vec<Memory>> {
        SqliteWorkingMemory::entries(self, tenant).await
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("select 1").execute(&self.inner.pool).await.map_err(store_error)?;
        Ok(())
    }

    async fn append(&self, tenant: &str, items: &[Memory], now: DateTime<Utc>) -> StoreResult<()> {
        if items.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let _gate = self.inner.write_gate.lock().await;
        let mut tx = self.inner.pool.begin().await.map_err(store_error)?;
        let mut sessions: Vec<(&str, &str)> = Vec::new();
        for m in items {
            let session = m.session_id.as_deref().unwrap_or_default();
            // Writing an id again replaces its entry and keeps its place.
            sqlx::query(
                "insert into working_memory (tenant_id, id, agent_id, session_id, entry, expires_at, created_at, \
                     updated_at) values (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7) \
                 on conflict (tenant_id, id) do update set agent_id = excluded.agent_id, \
                     session_id = excluded.session_id, entry = excluded.entry, expires_at = excluded.expires_at, \
                     updated_at = excluded.updated_at",
            )
            .bind(tenant)
            .bind(m.id)
            .bind(&m.agent_id)
            .bind(session)
            .bind(to_json_text(m)?)
            .bind(deadline(m.expires_at, now))
            .bind(micros(now))
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
            if !sessions.contains(&(m.agent_id.as_str(), session)) {
                sessions.push((m.agent_id.as_str(), session));
            }
        }
        // Each session keeps its newest `working_max_entries` entries, as
        // the Redis list does; expired entries are swept on the way.
        for (agent, session) in sessions {
            sqlx::query(
                "delete from working_memory where tenant_id = ?1 and agent_id = ?2 and session_id = ?3 \
                 and (expires_at <= ?4 or seq not in (select seq from working_memory where tenant_id = ?1 \
                     and agent_id = ?2 and session_id = ?3 order by seq desc limit ?5))",
            )
            .bind(tenant)
            .bind(agent)
            .bind(session)
            .bind(micros(Utc::now()))
            .bind(self.inner.working_max_entries as i64)
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
        }
        tx.commit().await.map_err(store_error)?;
        self.sessions().forget(tenant);
        observe("working_append", started);
        Ok(())
    }

    async fn remove(&self, tenant: &str, items: &[Memory]) -> StoreResult<()> {
        if items.is_empty() {
            return Ok(());
        }
        let _gate = self.inner.write_gate.lock().await;
        let mut tx = self.inner.pool.begin().await.map_err(store_error)?;
        for m in items {
            sqlx::query("delete from working_memory where tenant_id = ? and id = ?")
                .bind(tenant)
                .bind(m.id)
                .execute(&mut *tx)
                .await
                .map_err(store_error)?;
        }
        tx.commit().await.map_err(store_error)?;
        self.sessions().forget(tenant);
        Ok(())
    }

    async fn get(&self, tenant: &str, id: Uuid) -> StoreResult<Option<Memory>> {
        let entry: Option<String> = sqlx::query_scalar(
            "select entry from working_memory where tenant_id = ? and id = ? and (expires_at is null or expires_at > ?)",
        )
        .bind(tenant)
        .bind(id)
        .bind(micros(Utc::now()))
        .fetch_optional(&self.inner.pool)
        .await
        .map_err(store_error)?;
        entry.as_deref().map(parse).transpose()
    }

    async fn session(&self, tenant: &str, agent_id: &str, session_id: &str) -> StoreResult<Vec<Memory>> {
        let started = Instant::now();
        let key: SessionKey = (tenant.to_string(), agent_id.to_string(), session_id.to_string());
        let (cached, generation) = {
            let cache = self.sessions();
            (cache.sessions.get(&key).cloned(), cache.generation)
        };
        let entries = match cached {
            Some(entries) => entries,
            None => {
                // One row holding the session as a JSON array of [entry,
                // deadline] pairs: the driver hands rows over one by one
                // between threads, which for a session of 500 entries cost
                // more than reading them. The entries are joined as the JSON
                // text they were written as (`json(...)` would parse each again).
                let rows: String = sqlx::query_scalar(
                    "select '[' || coalesce(group_concat('[' || entry || ',' || coalesce(expires_at, 'null') || ']', \
                         ',' order by seq), '') || ']' from working_memory \
                     where tenant_id = ? and agent_id = ? and session_id = ? and (expires_at is null or expires_at > ?)",
                )
                .bind(tenant)
                .bind(agent_id)
                .bind(session_id)
                .bind(micros(Utc::now()))
                .fetch_one(&self.inner.pool)
                .await
                .map_err(store_error)?;
                let entries: Entries =
                    Arc::new(serde_json::from_str(&rows).map_err(|e| StoreError::Internal(e.into()))?);
                self.sessions().keep(generation, key, entries.clone());
                entries
            }
        };
        let now = micros(Utc::now());
        let live = entries.iter().filter(|(_, deadline)| deadline.is_none_or(|d| d > now)).map(|(m, _)| m.clone());
        let live = live.collect();
        observe("working_session", started);
        Ok(live)
    }

    async fn replace(&self, tenant: &str, memory: &Memory, now: DateTime<Utc>) -> StoreResult<()> {
        let _gate = self.inner.write_gate.lock().await;
        sqlx::query(
            "insert into working_memory (tenant_id, id, agent_id, session_id, entry, expires_at, created_at, \
                 updated_at) values (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7) \
             on conflict (tenant_id, id) do update set entry = excluded.entry, expires_at = excluded.expires_at, \
                 updated_at = excluded.updated_at",
        )
        .bind(tenant)
        .bind(memory.id)
        .bind(&memory.agent_id)
        .bind(memory.session_id.as_deref().unwrap_or_default())
        .bind(to_json_text(memory)?)
        .bind(deadline(memory.expires_at, now))
        .bind(micros(now))
        .execute(&self.inner.pool)
        .await
        .map_err(store_error)?;
        self.sessions().forget(tenant);
        Ok(())
    }
}

/// Hot procedural skills, per (tenant, id), each kept for `ttl`.
pub struct LocalSkillCache {
    ttl: Duration,
    max_entries: usize,
    entries: Mutex<HashMap<(String, Uuid), (Memory, Instant)>>,
}

impl LocalSkillCache {
    pub fn new(ttl: Duration, max_entries: usize) -> Self {
        Self { ttl, max_entries: max_entries.max(1), entries: Mutex::new(HashMap::new()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, Uuid), (Memory, Instant)>> {
        // A panic while holding the lock cannot leave the map half-written
        // (every change is one insert or remove), so a poisoned map is usable.
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[async_trait]
impl SkillCache for LocalSkillCache {
    async fn get(&self, tenant: &str, id: Uuid) -> StoreResult<Option<Memory>> {
        let mut entries = self.lock();
        let key = (tenant.to_string(), id);
        match entries.get(&key) {
            Some((m, until)) if *until > Instant::now() => Ok(Some(m.clone())),
            Some(_) => {
                entries.remove(&key);
                Ok(None)
            }
            None => Ok(None),
        }
    }

    async fn put(&self, tenant: &str, memory: &Memory) -> StoreResult<()> {
        let mut entries = self.lock();
        let now = Instant::now();
        if entries.len() >= self.max_entries {
            entries.retain(|_, (_, until)| *until > now);
        }
        if entries.len() >= self.max_entries {
            // Still full of live entries: drop the one closest to expiry.
            if let Some(key) = entries.iter().min_by_key(|(_, (_, until))| *until).map(|(k, _)| k.clone()) {
                entries.remove(&key);
            }
        }
        entries.insert((tenant.to_string(), memory.id), (memory.clone(), now + self.ttl));
        Ok(())
    }

    async fn evict(&self, tenant: &str, id: Uuid) -> StoreResult<()> {
        self.lock().remove(&(tenant.to_string(), id));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tenant: &str, session: &str) -> SessionKey {
        (tenant.into(), "a".into(), session.into())
    }

    #[test]
    fn a_read_that_raced_a_write_is_not_kept_and_a_write_drops_only_its_tenant() {
        let mut cache = SessionCache::default();
        let empty: Entries = Arc::new(Vec::new());
        // The read saw the cache before a write to working memory committed.
        let seen = cache.generation;
        cache.forget("t1");
        cache.keep(seen, key("t1", "s"), empty.clone());
        assert!(cache.sessions.is_empty());

        let seen = cache.generation;
        cache.keep(seen, key("t1", "s"), empty.clone());
        cache.keep(seen, key("t1", "s2"), empty.clone());
        cache.keep(seen, key("t2", "s"), empty.clone());
        assert_eq!(cache.sessions.len(), 3);
        cache.forget("t1");
        let left: Vec<&SessionKey> = cache.sessions.keys().collect();
        assert_eq!(left, vec![&key("t2", "s")]);
    }
}
