//! Store-level tests of the SQLite backend, each on a fresh data directory,
//! with real SQL and real files: helpers here, tests by topic beside.

mod lifecycle;
mod records;
mod rules;
mod search;

use std::path::PathBuf;

use chrono::{DateTime, TimeZone, Utc};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::{SqliteSettings, SqliteStore};
use crate::domain::{Memory, NewMemory, Tier, WrittenMemory};
use crate::store::{Embedding, MemoryStore, PreparedMemory, SearchQuery, WriteOutcome};

/// A data directory under the system temp dir, removed on drop.
pub(super) struct TempDir(pub(super) PathBuf);

impl TempDir {
    pub(super) fn new() -> TempDir {
        let dir = std::env::temp_dir().join(format!("engram-sqlite-test-{}", Uuid::new_v4()));
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(super) async fn open(dir: &TempDir) -> SqliteStore {
    SqliteStore::open(&dir.0, &SqliteSettings::default()).await.expect("open the store")
}

/// 2026-03-01 12:00:00 UTC plus `secs` seconds and 123_456_789 ns (so that
/// the stored value shows truncation to microseconds).
pub(super) fn at(secs: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 1, 12, 0, 0).unwrap()
        + chrono::Duration::seconds(secs)
        + chrono::Duration::nanoseconds(123_456_789)
}

pub(super) fn micro(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap()
}

pub(super) fn new_memory(tier: Tier, agent: &str, content: &str) -> NewMemory {
    NewMemory {
        id: Uuid::now_v7(),
        tier,
        agent_id: agent.into(),
        user_id: None,
        session_id: None,
        content: content.into(),
        importance: 0.5,
        retention: tier.default_retention(),
        metadata: Map::new(),
        private: false,
        occurred_at: None,
        event_type: None,
        outcome: None,
        subject: None,
        predicate: None,
        object: None,
        confidence: None,
        source_episode_id: None,
        skill_name: None,
        trigger_pattern: None,
        policy: None,
        tool_sequence: None,
        reward: None,
    }
}

/// A write of `memory`, living as long as the default policy keeps its retention.
pub(super) fn prepared(memory: NewMemory, embedding: Option<Embedding>) -> PreparedMemory {
    PreparedMemory::new(memory, embedding)
}

pub(super) fn emb(model: &str, vector: &[f32]) -> Option<Embedding> {
    Some(Embedding { model: model.into(), vector: vector.to_vec() })
}

pub(super) fn render(written: &[WrittenMemory]) -> Value {
    json!({ "ids": written.iter().map(|w| w.memory.id.to_string()).collect::<Vec<_>>() })
}

pub(super) async fn write(
    store: &SqliteStore,
    tenant: &str,
    items: Vec<PreparedMemory>,
    now: DateTime<Utc>,
) -> Vec<WrittenMemory> {
    match store.write(tenant, &items, None, &render, now).await.expect("write") {
        WriteOutcome::Written(w) => w,
        WriteOutcome::Replayed(_) => panic!("no idempotency key, no replay"),
    }
}

pub(super) async fn write_one(store: &SqliteStore, tenant: &str, item: PreparedMemory, now: DateTime<Utc>) -> Memory {
    write(store, tenant, vec![item], now).await.remove(0).memory
}

pub(super) fn query(agent: &str, text: &str, vector: Option<Embedding>) -> SearchQuery {
    SearchQuery {
        agent_id: agent.into(),
        user_id: None,
        tiers: vec![Tier::Episodic, Tier::Semantic, Tier::Procedural],
        text: text.into(),
        vector,
        metadata: Vec::new(),
        since: None,
        until: None,
        per_leg: 10,
        include_candidates: false,
        as_of: None,
        valid_at: None,
    }
}

pub(super) fn ids(memories: &[Memory]) -> Vec<Uuid> {
    memories.iter().map(|m| m.id).collect()
}
