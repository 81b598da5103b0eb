//! Store-level tests of the SQLite backend, each on a fresh data directory.

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::{LocalSkillCache, SqliteSettings, SqliteStore};
use crate::domain::content::content_hash;
use crate::domain::{EventType, Memory, MemoryPatch, NewMemory, Outcome, Retention, Tier, WrittenMemory};
use crate::store::{
    Cursor, Embedding, IdempotencyKey, ListFilter, MemoryStore, PreparedMemory, SearchQuery, SkillCache, StoreError,
    WorkingMemory, WriteOutcome,
};

/// A data directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let dir = std::env::temp_dir().join(format!("engram-sqlite-test-{}", Uuid::new_v4()));
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn open(dir: &TempDir) -> SqliteStore {
    SqliteStore::open(&dir.0, &SqliteSettings::default()).await.expect("open the store")
}

/// 2026-03-01 12:00:00 UTC plus `secs` seconds and 123_456_789 ns (so that
/// the stored value shows truncation to microseconds).
fn at(secs: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 1, 12, 0, 0).unwrap()
        + chrono::Duration::seconds(secs)
        + chrono::Duration::nanoseconds(123_456_789)
}

fn micro(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap()
}

fn new_memory(tier: Tier, agent: &str, content: &str) -> NewMemory {
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

fn prepared(memory: NewMemory, embedding: Option<Embedding>) -> PreparedMemory {
    PreparedMemory { content_hash: content_hash(&memory.content), memory, embedding }
}

fn emb(model: &str, vector: &[f32]) -> Option<Embedding> {
    Some(Embedding { model: model.into(), vector: vector.to_vec() })
}

fn render(written: &[WrittenMemory]) -> Value {
    json!({ "ids": written.iter().map(|w| w.memory.id.to_string()).collect::<Vec<_>>() })
}

async fn write(
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

async fn write_one(store: &SqliteStore, tenant: &str, item: PreparedMemory, now: DateTime<Utc>) -> Memory {
    write(store, tenant, vec![item], now).await.remove(0).memory
}

fn query(agent: &str, text: &str, vector: Option<Embedding>) -> SearchQuery {
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
    }
}

fn ids(memories: &[Memory]) -> Vec<Uuid> {
    memories.iter().map(|m| m.id).collect()
}

#[tokio::test]
async fn every_field_round_trips_with_microsecond_timestamps() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let now = at(0);

    let mut e = new_memory(Tier::Episodic, "agent-1", "The user asked for a refund of order 1042.");
    e.user_id = Some("u1".into());
    e.session_id = Some("s1".into());
    e.importance = 0.75;
    e.retention = Retention::ShortTerm;
    e.metadata = json!({"channel": "email", "n": 3, "nested": {"a": [1, 2]}}).as_object().unwrap().clone();
    e.private = true;
    e.occurred_at = Some(at(-3600));
    e.event_type = Some(EventType::Action);
    e.outcome = Some(Outcome::Partial);
    let episode = write_one(&store, "t1", prepared(e.clone(), emb("m1", &[0.5, -0.25, 1.0])), now).await;
    assert_eq!(episode.id, e.id);
    assert_eq!(episode.tier, Tier::Episodic);
    assert_eq!(episode.user_id.as_deref(), Some("u1"));
    assert_eq!(episode.session_id.as_deref(), Some("s1"));
    assert_eq!(episode.importance, 0.75);
    assert_eq!(episode.retention, Retention::ShortTerm);
    assert_eq!(Value::Object(episode.metadata.clone()), json!({"channel": "email", "n": 3, "nested": {"a": [1, 2]}}));
    assert!(episode.private);
    assert_eq!(episode.occurred_at, micro(at(-3600)));
    assert_eq!(episode.created_at, micro(now));
    assert_eq!(episode.created_at.timestamp_subsec_nanos(), 123_456_000);
    assert_eq!(episode.updated_at, micro(now));
    assert_eq!(episode.expires_at, Some(micro(now + chrono::Duration::days(7))));
    assert_eq!(episode.access_count, 0);
    assert_eq!(episode.last_accessed_at, None);
    assert_eq!(episode.embedding_model.as_deref(), Some("m1"));
    assert_eq!(episode.event_type, Some(EventType::Action));
    assert_eq!(episode.outcome, Some(Outcome::Partial));
    assert_eq!(episode.namespace, None);
    assert_eq!(episode.version, None);

    let mut s = new_memory(Tier::Semantic, "agent-1", "Ada lives in Paris.");
    s.user_id = Some("u1".into());
    s.subject = Some("Ada".into());
    s.predicate = Some("lives_in".into());
    s.object = Some("Paris".into());
    s.confidence = Some(0.9);
    s.source_episode_id = Some(episode.id);
    let fact = write_one(&store, "t1", prepared(s, None), now).await;
    assert_eq!(fact.namespace.as_deref(), Some("user:u1"));
    assert_eq!(fact.confidence, Some(0.9));
    assert_eq!(fact.source_episode_id, Some(episode.id));
    assert_eq!(fact.valid_from, Some(micro(now)));
    assert_eq!(fact.valid_until, None);
    assert_eq!(fact.supersedes, None);
    assert_eq!(fact.expires_at, Some(micro(now + chrono::Duration::days(365))));
    assert_eq!(fact.embedding_model, None);
    assert_eq!(fact.event_type, None);

    let mut p = new_memory(Tier::Procedural, "agent-1", "Refund: check the order, then call the payments API.");
    p.skill_name = Some("refund".into());
    p.trigger_pattern = Some("refund request".into());
    p.policy = Some(json!({"max_amount": 100}));
    p.tool_sequence = Some(json!([{"tool": "orders.get"}, {"tool": "payments.refund"}]));
    p.outcome = Some(Outcome::Success);
    p.reward = Some(0.8);
    let skill = write_one(&store, "t1", prepared(p, emb("m1", &[1.0, 0.0, 0.0])), now).await;
    assert_eq!(skill.skill_name.as_deref(), Some("refund"));
    assert_eq!(skill.trigger_pattern.as_deref(), Some("refund request"));
    assert_eq!(skill.policy, Some(json!({"max_amount": 100})));
    assert_eq!(skill.tool_sequence, Some(json!([{"tool": "orders.get"}, {"tool": "payments.refund"}])));
    assert_eq!(skill.success_count, Some(1));
    assert_eq!(skill.failure_count, Some(0));
    assert_eq!(skill.success_rate, Some(1.0));
    assert_eq!(skill.avg_reward, Some(0.8));
    assert_eq!(skill.version, Some(1));
    assert_eq!(skill.expires_at, None);
    // Postgres stores no outcome on a skill: it only moves the counters.
    assert_eq!(skill.outcome, None);

    for m in [&episode, &fact, &skill] {
        assert_eq!(&store.get("t1", m.id, now).await.unwrap(), m);
    }
}

#[tokio::test]
async fn list_is_newest_first_with_keyset_pages_and_the_filters_of_list_filter() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let mut all = Vec::new();
    for i in 0..7i64 {
        let tier = [Tier::Episodic, Tier::Semantic, Tier::Procedural][i as usize % 3];
        let mut m = new_memory(tier, if i % 2 == 0 { "a" } else { "b" }, &format!("memory number {i}"));
        m.user_id = (i % 3 == 0).then(|| "u1".to_string());
        m.session_id = Some(format!("s{}", i % 2));
        m.skill_name = (tier == Tier::Procedural).then(|| format!("skill {i}"));
        m.metadata = json!({"k": if i < 4 { "x" } else { "y" }, "n": i}).as_object().unwrap().clone();
        all.push(write_one(&store, "t1", prepared(m, None), at(i)).await);
    }
    // Two memories written at the same instant are ordered by id.
    let same = write(
        &store,
        "t1",
        vec![
            prepared(new_memory(Tier::Episodic, "a", "twin one"), None),
            prepared(new_memory(Tier::Episodic, "a", "twin two"), None),
        ],
        at(10),
    )
    .await;
    all.extend(same.into_iter().map(|w| w.memory));
    let now = at(20);

    // Whole tenant, pages of 3: the store returns limit + 1 to flag a next page.
    let mut expected = all.clone();
    expected.sort_by_key(|m| std::cmp::Reverse((m.created_at, m.id)));
    let mut filter = ListFilter { limit: 3, ..ListFilter::default() };
    let mut pages = Vec::new();
    loop {
        let page = store.list("t1", &filter, now).await.unwrap();
        let more = page.len() > filter.limit;
        pages.extend(page.into_iter().take(filter.limit));
        if !more {
            break;
        }
        let last = pages.last().unwrap();
        filter.after = Some(Cursor { created_at: last.created_at, id: last.id });
    }
    assert_eq!(ids(&pages), ids(&expected));

    // Each filter gives exactly what ListFilter::matches says.
    let filters = [
        ListFilter { agent_id: Some("a".into()), ..ListFilter::default() },
        ListFilter { user_id: Some("u1".into()), ..ListFilter::default() },
        ListFilter { session_id: Some("s1".into()), ..ListFilter::default() },
        ListFilter { tiers: vec![Tier::Semantic, Tier::Procedural], ..ListFilter::default() },
        ListFilter { tiers: vec![Tier::Working], ..ListFilter::default() },
        ListFilter { created_after: Some(micro(at(2))), created_before: Some(micro(at(5))), ..ListFilter::default() },
        ListFilter { metadata: vec![("k".into(), "y".into())], ..ListFilter::default() },
        ListFilter { metadata: vec![("n".into(), "4".into())], ..ListFilter::default() },
        ListFilter { metadata: vec![("missing".into(), "x".into())], ..ListFilter::default() },
        ListFilter { after: Some(Cursor { created_at: all[3].created_at, id: all[3].id }), ..ListFilter::default() },
    ];
    for f in filters {
        let f = ListFilter { limit: 100, ..f };
        let got = store.list("t1", &f, now).await.unwrap();
        let want: Vec<Memory> = expected.iter().filter(|m| f.matches(m)).cloned().collect();
        assert_eq!(ids(&got), ids(&want), "filter {f:?}");
    }
    assert_eq!(
        store
            .list(
                "t1",
                &ListFilter { metadata: vec![("n".into(), "4".into())], limit: 10, ..ListFilter::default() },
                now
            )
            .await
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test]
async fn update_merges_metadata_moves_expiry_and_reembeds() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let mut m = new_memory(Tier::Episodic, "a", "The printer on floor two is broken.");
    m.metadata = json!({"keep": 1, "drop": 2, "obj": {"x": 1}}).as_object().unwrap().clone();
    let written = write_one(&store, "t1", prepared(m, emb("m1", &[1.0, 0.0])), at(0)).await;

    let patch = MemoryPatch {
        content: Some("The printer on floor two was repaired.".into()),
        importance: Some(0.9),
        metadata: Some(json!({"drop": null, "obj": {"y": 2}, "new": "v"}).as_object().unwrap().clone()),
        retention: Some(Retention::Transient),
    };
    let updated = store.update("t1", written.id, &patch, emb("m1", &[0.0, 1.0]).as_ref(), at(60)).await.unwrap();
    assert_eq!(updated.content, "The printer on floor two was repaired.");
    assert_eq!(updated.importance, 0.9);
    assert_eq!(Value::Object(updated.metadata.clone()), json!({"keep": 1, "obj": {"x": 1, "y": 2}, "new": "v"}));
    assert_eq!(updated.retention, Retention::Transient);
    // The new lifetime counts from ingestion, not from the patch.
    assert_eq!(updated.expires_at, Some(micro(at(0) + chrono::Duration::hours(1))));
    assert_eq!(updated.updated_at, micro(at(60)));
    assert_eq!(updated.created_at, written.created_at);
    assert_eq!(store.get("t1", written.id, at(60)).await.unwrap(), updated);

    // The vector index and the text index follow the new content.
    let hits = store.search("t1", &query("a", "repaired", emb("m1", &[0.0, 1.0])), at(61)).await.unwrap();
    assert_eq!(hits.hits.len(), 1);
    assert!((hits.hits[0].similarity.unwrap() - 1.0).abs() < 1e-6);
    assert!(hits.hits[0].text_rank.unwrap() > 0.0);
    let hits = store.search("t1", &query("a", "broken", None), at(61)).await.unwrap();
    assert!(hits.text_leg);
    assert!(hits.hits.is_empty());

    // Content without a new vector drops the old one (it described the old text).
    let patch = MemoryPatch { content: Some("Printer fine.".into()), ..MemoryPatch::default() };
    let updated = store.update("t1", written.id, &patch, None, at(62)).await.unwrap();
    assert_eq!(updated.embedding_model, None);
    let hits = store.search("t1", &query("a", "zzz", emb("m1", &[0.0, 1.0])), at(63)).await.unwrap();
    assert!(hits.hits.is_empty());

    let missing = store.update("t1", Uuid::now_v7(), &MemoryPatch::default(), None, at(63)).await;
    assert!(matches!(missing, Err(StoreError::NotFound)));
}

#[tokio::test]
async fn delete_removes_the_row_its_vector_and_its_text() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let m = write_one(
        &store,
        "t1",
        prepared(new_memory(Tier::Semantic, "a", "Bob likes tea."), emb("m1", &[1.0, 0.0])),
        at(0),
    )
    .await;
    assert_eq!(store.delete("t1", m.id).await.unwrap(), Tier::Semantic);
    assert!(matches!(store.get("t1", m.id, at(1)).await, Err(StoreError::NotFound)));
    let hits = store.search("t1", &query("a", "tea", emb("m1", &[1.0, 0.0])), at(1)).await.unwrap();
    assert!(hits.vector_leg && hits.text_leg);
    assert!(hits.hits.is_empty());
    assert!(matches!(store.delete("t1", m.id).await, Err(StoreError::NotFound)));
    assert_eq!(store.inner.vectors.read().unwrap().len(), 0);
}

#[tokio::test]
async fn identical_valid_facts_are_deduplicated_but_an_expired_one_is_replaced() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let first =
        write_one(&store, "t1", prepared(new_memory(Tier::Semantic, "a", "Carol speaks French."), None), at(0)).await;
    // Same normalised content, same agent and namespace: the stored fact comes back.
    let again =
        write(&store, "t1", vec![prepared(new_memory(Tier::Semantic, "a", "Carol speaks French."), None)], at(5)).await;
    assert!(again[0].deduplicated);
    assert_eq!(again[0].memory, first);
    // Another agent, or another user's namespace, or another tenant: new facts.
    let other_agent =
        write(&store, "t1", vec![prepared(new_memory(Tier::Semantic, "b", "Carol speaks French."), None)], at(5)).await;
    assert!(!other_agent[0].deduplicated);
    let mut user = new_memory(Tier::Semantic, "a", "Carol speaks French.");
    user.user_id = Some("u1".into());
    assert!(!write(&store, "t1", vec![prepared(user, None)], at(5)).await[0].deduplicated);
    assert!(
        !write(&store, "t2", vec![prepared(new_memory(Tier::Semantic, "a", "Carol speaks French."), None)], at(5))
            .await[0]
            .deduplicated
    );

    // A transient fact past its expiry does not swallow the same fact.
    let mut short = new_memory(Tier::Semantic, "a", "Dan is in the lobby.");
    short.retention = Retention::Transient;
    let old = write_one(&store, "t1", prepared(short, None), at(0)).await;
    let later = at(2 * 3600);
    let fresh =
        write(&store, "t1", vec![prepared(new_memory(Tier::Semantic, "a", "Dan is in the lobby."), None)], later).await;
    assert!(!fresh[0].deduplicated);
    assert_ne!(fresh[0].memory.id, old.id);
    assert!(matches!(store.get("t1", old.id, at(0)).await, Err(StoreError::NotFound)));
}

#[tokio::test]
async fn a_fact_about_the_same_subject_and_predicate_supersedes_and_history_is_oldest_first() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let fact = |content: &str, object: &str, confidence: f32| {
        let mut m = new_memory(Tier::Semantic, "a", content);
        m.subject = Some("Eve".into());
        m.predicate = Some("lives_in".into());
        m.object = Some(object.into());
        m.confidence = Some(confidence);
        m
    };
    let a =
        write_one(&store, "t1", prepared(fact("Eve lives in Oslo.", "Oslo", 0.7), emb("m1", &[1.0, 0.0])), at(0)).await;
    let b = write_one(&store, "t1", prepared(fact("Eve lives in Rome.", "Rome", 0.8), emb("m1", &[1.0, 0.1])), at(10))
        .await;
    assert_eq!(b.supersedes, Some(a.id));
    let a_now = store.get("t1", a.id, at(11)).await.unwrap();
    assert_eq!(a_now.valid_until, Some(micro(at(10))));
    assert_eq!(a_now.updated_at, micro(at(10)));
    // A less confident claim does not retire the valid one; both stay valid.
    let c = write_one(&store, "t1", prepared(fact("Eve lives in Lima.", "Lima", 0.5), None), at(20)).await;
    assert_eq!(c.supersedes, None);
    assert_eq!(store.get("t1", b.id, at(21)).await.unwrap().valid_until, None);
    // A confident one retires both; it points at the newer.
    let d = write_one(&store, "t1", prepared(fact("Eve lives in Kyiv.", "Kyiv", 0.9), None), at(30)).await;
    assert_eq!(d.supersedes, Some(c.id));
    assert_eq!(store.get("t1", b.id, at(31)).await.unwrap().valid_until, Some(micro(at(30))));

    // The chain a <- b, from any member, oldest first.
    for id in [a.id, b.id] {
        assert_eq!(ids(&store.history("t1", id, at(31)).await.unwrap()), vec![a.id, b.id]);
    }
    assert_eq!(ids(&store.history("t1", d.id, at(31)).await.unwrap()), vec![c.id, d.id]);

    // Listing hides superseded facts unless asked; search never returns them.
    let valid = store.list("t1", &ListFilter { limit: 10, ..ListFilter::default() }, at(31)).await.unwrap();
    assert_eq!(ids(&valid), vec![d.id]);
    let every = ListFilter { limit: 10, include_superseded: true, ..ListFilter::default() };
    assert_eq!(ids(&store.list("t1", &every, at(31)).await.unwrap()), vec![d.id, c.id, b.id, a.id]);
    let hits = store.search("t1", &query("a", "Eve lives", emb("m1", &[1.0, 0.0])), at(31)).await.unwrap();
    assert_eq!(hits.hits.iter().map(|h| h.memory.id).collect::<Vec<_>>(), vec![d.id]);
}

#[tokio::test]
async fn a_skill_is_upserted_by_name_with_counters_running_mean_and_version() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let skill = |content: &str, outcome: Option<Outcome>, reward: Option<f32>, meta: Value| {
        let mut m = new_memory(Tier::Procedural, "a", content);
        m.skill_name = Some("deploy".into());
        m.outcome = outcome;
        m.reward = reward;
        m.metadata = meta.as_object().unwrap().clone();
        m
    };
    let mut first = skill("Deploy with the script.", Some(Outcome::Success), Some(1.0), json!({"a": 1, "b": {"x": 1}}));
    first.trigger_pattern = Some("deploy request".into());
    first.user_id = Some("u1".into());
    let v1 = write_one(&store, "t1", prepared(first, emb("m1", &[1.0, 0.0])), at(0)).await;
    let v2 = write_one(
        &store,
        "t1",
        prepared(
            skill("Deploy with the pipeline.", Some(Outcome::Failure), Some(0.3), json!({"b": {"y": 2}, "c": 3})),
            None,
        ),
        at(10),
    )
    .await;
    assert_eq!(v2.id, v1.id);
    assert_eq!(v2.created_at, v1.created_at);
    assert_eq!(v2.content, "Deploy with the pipeline.");
    assert_eq!(v2.trigger_pattern.as_deref(), Some("deploy request"));
    assert_eq!(v2.user_id.as_deref(), Some("u1"));
    assert_eq!((v2.success_count, v2.failure_count, v2.success_rate), (Some(1), Some(1), Some(0.5)));
    assert_eq!(v2.avg_reward, Some(((1.0f64 + f64::from(0.3f32)) / 2.0) as f32));
    assert_eq!(v2.version, Some(2));
    // Shallow merge: a key of the new metadata replaces the old value whole.
    assert_eq!(Value::Object(v2.metadata.clone()), json!({"a": 1, "b": {"y": 2}, "c": 3}));
    assert_eq!(v2.embedding_model, None);
    // No outcome and no reward: counters and mean stay, the version moves.
    let v3 = write_one(&store, "t1", prepared(skill("Deploy with the pipeline.", None, None, json!({})), None), at(20))
        .await;
    assert_eq!(
        (v3.success_count, v3.failure_count, v3.avg_reward, v3.version),
        (Some(1), Some(1), v2.avg_reward, Some(3))
    );
    let v4 =
        write_one(&store, "t1", prepared(skill("Deploy.", Some(Outcome::Success), Some(0.0), json!({})), None), at(30))
            .await;
    let two = f64::from(v3.avg_reward.unwrap());
    assert_eq!(v4.avg_reward, Some(((two * 2.0 + 0.0) / 3.0) as f32));
    assert!((v4.success_rate.unwrap() - 2.0 / 3.0).abs() < 1e-7);
    // Still one row.
    let all = store.list("t1", &ListFilter { limit: 10, ..ListFilter::default() }, at(31)).await.unwrap();
    assert_eq!(ids(&all), vec![v1.id]);
}

#[tokio::test]
async fn an_idempotency_key_replays_its_response_and_reports_its_request_hash() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let key = IdempotencyKey { key: "k1".into(), request_hash: "h1".into() };
    let items = vec![prepared(new_memory(Tier::Episodic, "a", "Paid invoice 7."), None)];
    let WriteOutcome::Written(first) = store.write("t1", &items, Some(&key), &render, at(0)).await.unwrap() else {
        panic!("first use of a key writes");
    };
    let body = render(&first);
    let stored = store.idempotent_response("t1", "k1", at(1)).await.unwrap().unwrap();
    assert_eq!((stored.request_hash.as_str(), stored.status, &stored.body), ("h1", 201, &body));

    // Same key again (same or other body): nothing written, the first response comes back
    // with its request hash, which the service compares to answer a replay or 409.
    let other = IdempotencyKey { key: "k1".into(), request_hash: "h2".into() };
    let again = vec![prepared(new_memory(Tier::Episodic, "a", "Paid invoice 8."), None)];
    let WriteOutcome::Replayed(replay) = store.write("t1", &again, Some(&other), &render, at(2)).await.unwrap() else {
        panic!("a used key replays");
    };
    assert_eq!((replay.request_hash.as_str(), replay.status, &replay.body), ("h1", 201, &body));
    assert_eq!(store.list("t1", &ListFilter { limit: 10, ..ListFilter::default() }, at(3)).await.unwrap().len(), 1);

    // Keys are per tenant.
    assert!(store.idempotent_response("t2", "k1", at(1)).await.unwrap().is_none());
    // After the TTL (24 h) the key is free again.
    let later = at(25 * 3600);
    assert!(store.idempotent_response("t1", "k1", later).await.unwrap().is_none());
    let WriteOutcome::Written(_) = store.write("t1", &again, Some(&other), &render, later).await.unwrap() else {
        panic!("an expired key is claimed anew");
    };
    assert_eq!(store.idempotent_response("t1", "k1", later).await.unwrap().unwrap().request_hash, "h2");
    assert_eq!(store.forget_idempotency_keys(at(50 * 3600)).await.unwrap(), 1);
}

#[tokio::test]
async fn a_failed_batch_writes_nothing_and_keeps_its_key_free() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let key = IdempotencyKey { key: "k".into(), request_hash: "h".into() };
    let mut bad = new_memory(Tier::Episodic, "a", "out of range");
    bad.importance = 2.0;
    let items = vec![prepared(new_memory(Tier::Episodic, "a", "fine"), emb("m1", &[1.0])), prepared(bad, None)];
    assert!(store.write("t1", &items, Some(&key), &render, at(0)).await.is_err());
    assert!(store.list("t1", &ListFilter { limit: 10, ..ListFilter::default() }, at(1)).await.unwrap().is_empty());
    assert!(store.idempotent_response("t1", "k", at(1)).await.unwrap().is_none());
    assert_eq!(store.inner.vectors.read().unwrap().len(), 0);
}

#[tokio::test]
async fn expired_memories_are_invisible_before_any_sweep() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let mut m = new_memory(Tier::Episodic, "a", "Temporary door code 4411.");
    m.retention = Retention::Transient;
    let m = write_one(&store, "t1", prepared(m, emb("m1", &[1.0, 0.0])), at(0)).await;
    let before = at(3599);
    let after = at(3601);
    assert!(store.get("t1", m.id, before).await.is_ok());
    assert!(matches!(store.get("t1", m.id, after).await, Err(StoreError::NotFound)));
    let all = ListFilter { limit: 10, ..ListFilter::default() };
    assert_eq!(store.list("t1", &all, before).await.unwrap().len(), 1);
    assert!(store.list("t1", &all, after).await.unwrap().is_empty());
    let q = query("a", "door code", emb("m1", &[1.0, 0.0]));
    assert_eq!(store.search("t1", &q, before).await.unwrap().hits.len(), 1);
    let hits = store.search("t1", &q, after).await.unwrap();
    assert!(hits.vector_leg && hits.text_leg && hits.hits.is_empty());
    assert!(matches!(store.history("t1", m.id, after).await, Err(StoreError::NotFound)));
}

#[tokio::test]
async fn tenants_never_see_or_touch_each_others_memories() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let m = write_one(
        &store,
        "t1",
        prepared(new_memory(Tier::Semantic, "a", "Frank owns a red bike."), emb("m1", &[1.0, 0.0])),
        at(0),
    )
    .await;
    let now = at(1);
    assert!(matches!(store.get("t2", m.id, now).await, Err(StoreError::NotFound)));
    assert!(store.list("t2", &ListFilter { limit: 10, ..ListFilter::default() }, now).await.unwrap().is_empty());
    let hits = store.search("t2", &query("a", "red bike", emb("m1", &[1.0, 0.0])), now).await.unwrap();
    assert!(hits.hits.is_empty());
    assert!(matches!(store.history("t2", m.id, now).await, Err(StoreError::NotFound)));
    let patch = MemoryPatch { importance: Some(0.1), ..MemoryPatch::default() };
    assert!(matches!(store.update("t2", m.id, &patch, None, now).await, Err(StoreError::NotFound)));
    assert!(matches!(store.delete("t2", m.id).await, Err(StoreError::NotFound)));
    store.record_access_since("t2", &[(Tier::Semantic, m.id)], now, now).await.unwrap();
    assert_eq!(store.get("t1", m.id, now).await.unwrap(), m);
}

#[tokio::test]
async fn search_fills_both_legs_and_scores_each_row_on_the_other_legs_measure() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let mut near = new_memory(Tier::Episodic, "a", "We booked a hotel in Lisbon for the conference.");
    near.user_id = Some("u1".into());
    near.metadata = json!({"trip": "lisbon", "n": 2, "tags": ["x", "y"]}).as_object().unwrap().clone();
    let near = write_one(&store, "t1", prepared(near, emb("m1", &[1.0, 0.0, 0.0])), at(0)).await;
    // Text matches, vector far.
    let texty = write_one(
        &store,
        "t1",
        prepared(
            new_memory(Tier::Episodic, "a", "The hotels in Lisbon were all booked out."),
            emb("m1", &[0.0, 0.0, 1.0]),
        ),
        at(10),
    )
    .await;
    // Vector near, no word in common.
    let vecty = write_one(
        &store,
        "t1",
        prepared(new_memory(Tier::Semantic, "a", "Gina prefers aisle seats."), emb("m1", &[0.9, 0.1, 0.0])),
        at(20),
    )
    .await;
    // No vector at all.
    let plain = write_one(
        &store,
        "t1",
        prepared(new_memory(Tier::Episodic, "a", "Lisbon trip budget approved."), None),
        at(30),
    )
    .await;
    // Another agent's memory never shows.
    write_one(
        &store,
        "t1",
        prepared(new_memory(Tier::Episodic, "b", "Lisbon hotel booked."), emb("m1", &[1.0, 0.0, 0.0])),
        at(40),
    )
    .await;
    let now = at(50);

    let q = query("a", "Which hotel did we book in Lisbon?", emb("m1", &[1.0, 0.0, 0.0]));
    let hits = store.search("t1", &q, now).await.unwrap();
    assert!(hits.vector_leg && hits.text_leg);
    assert!(hits.vector_ms >= 0.0 && hits.text_ms >= 0.0);
    let by_id = |id: Uuid| hits.hits.iter().find(|h| h.memory.id == id).unwrap_or_else(|| panic!("{id} missing"));
    assert_eq!(hits.hits.len(), 4);
    // Vector leg first, tier by tier, nearest first: episodic near, texty; semantic vecty.
    assert_eq!(hits.hits[..3].iter().map(|h| h.memory.id).collect::<Vec<_>>(), vec![near.id, texty.id, vecty.id]);
    assert_eq!(hits.hits[3].memory.id, plain.id);
    let h = by_id(near.id);
    assert!((h.similarity.unwrap() - 1.0).abs() < 1e-6);
    assert!(h.text_rank.unwrap() > 0.0);
    assert_eq!(h.vector.as_deref(), Some(&[1.0f32, 0.0, 0.0][..]));
    let h = by_id(texty.id);
    assert!(h.similarity.unwrap().abs() < 1e-6);
    assert!(h.text_rank.unwrap() > 0.0);
    let h = by_id(vecty.id);
    assert!((h.similarity.unwrap() - 0.9 / (0.82f64).sqrt()).abs() < 1e-6);
    // Found by the vector leg, matches no query word: rank 0, not None.
    assert_eq!(h.text_rank, Some(0.0));
    let h = by_id(plain.id);
    assert_eq!(h.similarity, None);
    assert_eq!(h.vector, None);
    assert!(h.text_rank.unwrap() > 0.0);

    // bm25: the text with more query words ranks higher.
    let text_only = store.search("t1", &query("a", "hotel booked Lisbon", None), now).await.unwrap();
    assert!(!text_only.vector_leg && text_only.text_leg);
    assert_eq!(text_only.hits[0].memory.id, texty.id);
    assert!(text_only.hits.iter().all(|h| h.similarity.is_none() && h.vector.is_none()));
    assert!(text_only.hits.windows(2).all(|w| w[0].text_rank >= w[1].text_rank));

    // Stop words only: no text leg; the vector hits carry no text rank.
    let stop = store.search("t1", &query("a", "what is it?", emb("m1", &[1.0, 0.0, 0.0])), now).await.unwrap();
    assert!(stop.vector_leg && !stop.text_leg);
    assert!(stop.hits.iter().all(|h| h.text_rank.is_none()));
    // FTS5 syntax in the query is taken as words.
    let odd = store.search("t1", &query("a", "\"hotel* NEAR( OR AND -Lisbon^ :", None), now).await.unwrap();
    assert!(odd.text_leg && !odd.hits.is_empty());

    // Filters: user, metadata (JSON equality), occurred_at bounds, tiers.
    let mut f = q.clone();
    f.user_id = Some("u1".into());
    assert_eq!(
        store.search("t1", &f, now).await.unwrap().hits.iter().map(|h| h.memory.id).collect::<Vec<_>>(),
        vec![near.id]
    );
    for (key, value, expect) in [
        ("trip", json!("lisbon"), true),
        ("n", json!(2.0), true),
        ("n", json!("2"), false),
        ("tags", json!(["x", "y"]), true),
        ("tags", json!(["y", "x"]), false),
    ] {
        let mut f = q.clone();
        f.metadata = vec![(key.into(), value.clone())];
        let got: Vec<Uuid> = store.search("t1", &f, now).await.unwrap().hits.iter().map(|h| h.memory.id).collect();
        assert_eq!(got, if expect { vec![near.id] } else { vec![] }, "{key} = {value}");
    }
    let mut f = q.clone();
    f.since = Some(at(5));
    f.until = Some(at(25));
    let got: Vec<Uuid> = store.search("t1", &f, now).await.unwrap().hits.iter().map(|h| h.memory.id).collect();
    assert_eq!(got, vec![texty.id, vecty.id]);
    let mut f = q.clone();
    f.tiers = vec![Tier::Semantic, Tier::Working];
    let got: Vec<Uuid> = store.search("t1", &f, now).await.unwrap().hits.iter().map(|h| h.memory.id).collect();
    assert_eq!(got, vec![vecty.id]);
    let mut f = q.clone();
    f.per_leg = 1;
    let got: Vec<Uuid> = store.search("t1", &f, now).await.unwrap().hits.iter().map(|h| h.memory.id).collect();
    // One per tier and leg: vector episodic near, semantic vecty; text episodic texty (best bm25).
    assert_eq!(got, vec![near.id, vecty.id, texty.id]);
}

#[tokio::test]
async fn the_vector_leg_keeps_looking_past_rows_the_metadata_filter_drops() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    // 30 near vectors without the tag, then 3 farther ones with it.
    for i in 0..30 {
        let m = new_memory(Tier::Episodic, "a", &format!("untagged note {i}"));
        write_one(&store, "t1", prepared(m, emb("m1", &[1.0, 0.01 * i as f32])), at(i)).await;
    }
    let mut tagged = Vec::new();
    for i in 0..3 {
        let mut m = new_memory(Tier::Episodic, "a", &format!("tagged note {i}"));
        m.metadata = json!({"tag": "keep"}).as_object().unwrap().clone();
        tagged.push(write_one(&store, "t1", prepared(m, emb("m1", &[0.1 * i as f32, 1.0])), at(100 + i)).await.id);
    }
    let mut q = query("a", "", emb("m1", &[1.0, 0.0]));
    q.per_leg = 2;
    q.metadata = vec![("tag".into(), json!("keep"))];
    let hits = store.search("t1", &q, at(200)).await.unwrap();
    assert!(!hits.text_leg);
    assert_eq!(hits.hits.iter().map(|h| h.memory.id).collect::<Vec<_>>(), vec![tagged[2], tagged[1]]);
}

#[tokio::test]
async fn vectors_of_another_model_are_never_compared() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let a = write_one(
        &store,
        "t1",
        prepared(new_memory(Tier::Episodic, "a", "Model A wrote this about kiwis."), emb("model-a", &[1.0, 0.0])),
        at(0),
    )
    .await;
    let b = write_one(
        &store,
        "t1",
        prepared(new_memory(Tier::Episodic, "a", "Model B wrote this about kiwis."), emb("model-b", &[1.0, 0.0])),
        at(1),
    )
    .await;
    let c = write_one(
        &store,
        "t1",
        prepared(new_memory(Tier::Episodic, "a", "Model A, three dimensions."), emb("model-a", &[1.0, 0.0, 0.0])),
        at(2),
    )
    .await;
    let hits = store.search("t1", &query("a", "zzz", emb("model-a", &[1.0, 0.0])), at(3)).await.unwrap();
    assert_eq!(hits.hits.iter().map(|h| h.memory.id).collect::<Vec<_>>(), vec![a.id]);
    // The text leg's rows of another model get no similarity and no vector.
    let hits = store.search("t1", &query("a", "kiwis", emb("model-a", &[1.0, 0.0])), at(3)).await.unwrap();
    let hb = hits.hits.iter().find(|h| h.memory.id == b.id).unwrap();
    assert_eq!((hb.similarity, hb.vector.as_ref()), (None, None));
    let ha = hits.hits.iter().find(|h| h.memory.id == a.id).unwrap();
    assert!((ha.similarity.unwrap() - 1.0).abs() < 1e-9);
    assert!(hits.hits.iter().all(|h| h.memory.id != c.id));
    let index = store.inner.vectors.read().unwrap();
    assert_eq!(index.group_len("t1", "a", "model-a", 2), 1);
    assert_eq!(index.group_len("t1", "a", "model-b", 2), 1);
    assert_eq!(index.group_len("t1", "a", "model-a", 3), 1);
}

#[tokio::test]
async fn an_access_is_counted_once_per_interval() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let m = write_one(&store, "t1", prepared(new_memory(Tier::Episodic, "a", "Hank called twice."), None), at(0)).await;
    let hit = [(Tier::Episodic, m.id)];
    let interval = chrono::Duration::seconds(60);
    store.record_access_since("t1", &hit, at(100), at(100) - interval).await.unwrap();
    let got = store.get("t1", m.id, at(101)).await.unwrap();
    assert_eq!((got.access_count, got.last_accessed_at), (1, Some(micro(at(100)))));
    // 30 s later: within the interval, not counted, not stamped.
    store.record_access_since("t1", &hit, at(130), at(130) - interval).await.unwrap();
    let got = store.get("t1", m.id, at(131)).await.unwrap();
    assert_eq!((got.access_count, got.last_accessed_at), (1, Some(micro(at(100)))));
    // Exactly one interval later: counted.
    store.record_access_since("t1", &hit, at(160), at(160) - interval).await.unwrap();
    let got = store.get("t1", m.id, at(161)).await.unwrap();
    assert_eq!((got.access_count, got.last_accessed_at), (2, Some(micro(at(160)))));
    // The tier must match the row's.
    store.record_access_since("t1", &[(Tier::Semantic, m.id)], at(500), at(440)).await.unwrap();
    assert_eq!(store.get("t1", m.id, at(501)).await.unwrap().access_count, 2);
    // The batch form adds its counts.
    store.record_access("t1", &[(Tier::Episodic, m.id, 3)], at(600)).await.unwrap();
    let got = store.get("t1", m.id, at(601)).await.unwrap();
    assert_eq!((got.access_count, got.last_accessed_at), (5, Some(micro(at(600)))));
}

#[tokio::test]
async fn data_and_the_vector_index_come_back_after_a_restart() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let kept = write_one(
        &store,
        "t1",
        prepared(new_memory(Tier::Episodic, "a", "Ivy's birthday is in May."), emb("m1", &[0.0, 1.0])),
        at(0),
    )
    .await;
    let gone = write_one(
        &store,
        "t1",
        prepared(new_memory(Tier::Episodic, "a", "Scratch this one."), emb("m1", &[0.0, 1.0])),
        at(1),
    )
    .await;
    store.delete("t1", gone.id).await.unwrap();
    let mut old = new_memory(Tier::Semantic, "a", "Ivy works at Acme.");
    old.subject = Some("Ivy".into());
    old.predicate = Some("works_at".into());
    let old = write_one(&store, "t1", prepared(old, emb("m1", &[0.0, 1.0])), at(2)).await;
    let mut new = new_memory(Tier::Semantic, "a", "Ivy works at Globex.");
    new.subject = Some("Ivy".into());
    new.predicate = Some("works_at".into());
    let new = write_one(&store, "t1", prepared(new, emb("m1", &[0.0, 1.0])), at(3)).await;
    store.working_memory().append("t1", &[working_entry("a", "s", "draft reply")], Utc::now()).await.unwrap();
    store.close().await;
    drop(store);

    let store = open(&dir).await;
    assert_eq!(store.get("t1", kept.id, at(4)).await.unwrap(), kept);
    assert_eq!(store.inner.vectors.read().unwrap().len(), 3);
    let hits = store.search("t1", &query("a", "", emb("m1", &[0.0, 1.0])), at(4)).await.unwrap();
    // The superseded fact is in the index but never returned.
    assert_eq!(hits.hits.iter().map(|h| h.memory.id).collect::<Vec<_>>(), vec![kept.id, new.id]);
    assert!(hits.hits.iter().all(|h| h.memory.id != old.id));
    let session = store.working_memory().session("t1", "a", "s").await.unwrap();
    assert_eq!(session.iter().map(|m| m.content.as_str()).collect::<Vec<_>>(), vec!["draft reply"]);
}

#[tokio::test]
async fn a_second_open_of_the_same_directory_fails_while_the_first_is_open() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let err = SqliteStore::open(&dir.0, &SqliteSettings::default()).await.err().expect("second open must fail");
    assert_eq!(err.to_string(), format!("data directory {} is in use by another engram process", dir.0.display()));
    store.close().await;
    drop(store);
    assert!(SqliteStore::open(&dir.0, &SqliteSettings::default()).await.is_ok());
}

#[test]
fn the_postgres_migrator_does_not_pick_up_the_sqlite_migrations() {
    let pg: Vec<&str> = crate::store::postgres::MIGRATOR.iter().map(|m| m.description.as_ref()).collect();
    assert!(pg.iter().all(|d| *d != "memories"), "{pg:?}");
    assert!(crate::store::postgres::MIGRATOR.iter().all(|m| !m.sql.as_str().contains("fts5")));
    let sqlite: Vec<&str> = super::MIGRATOR.iter().map(|m| m.description.as_ref()).collect();
    assert_eq!(sqlite, vec!["memories"]);
}

fn working_entry(agent: &str, session: &str, content: &str) -> Memory {
    let now = Utc::now();
    Memory {
        id: Uuid::now_v7(),
        tier: Tier::Working,
        agent_id: agent.into(),
        user_id: None,
        session_id: Some(session.into()),
        content: content.into(),
        importance: 0.5,
        retention: Retention::Session,
        metadata: Map::new(),
        private: false,
        occurred_at: now,
        created_at: now,
        updated_at: now,
        expires_at: Retention::Session.expires_at(now),
        access_count: 0,
        last_accessed_at: None,
        embedding_model: None,
        event_type: None,
        outcome: None,
        namespace: None,
        subject: None,
        predicate: None,
        object: None,
        confidence: None,
        valid_from: None,
        valid_until: None,
        supersedes: None,
        source_episode_id: None,
        skill_name: None,
        trigger_pattern: None,
        policy: None,
        tool_sequence: None,
        success_count: None,
        failure_count: None,
        success_rate: None,
        avg_reward: None,
        version: None,
    }
}

#[tokio::test]
async fn working_memory_keeps_sessions_in_order_bounded_and_expiring() {
    let dir = TempDir::new();
    let settings = SqliteSettings { working_max_entries: 3, ..SqliteSettings::default() };
    let store = SqliteStore::open(&dir.0, &settings).await.unwrap();
    let wm = store.working_memory();
    let now = Utc::now();
    let entries: Vec<Memory> = (0..4).map(|i| working_entry("a", "s1", &format!("turn {i}"))).collect();
    wm.append("t1", &entries[..2], now).await.unwrap();
    wm.append("t1", &entries[2..], now).await.unwrap();
    wm.append("t1", &[working_entry("a", "s2", "other session")], now).await.unwrap();
    // At most 3 per session: the oldest went.
    let s1 = wm.session("t1", "a", "s1").await.unwrap();
    assert_eq!(s1, entries[1..].to_vec());
    assert_eq!(wm.get("t1", entries[0].id).await.unwrap(), None);
    assert_eq!(wm.get("t1", entries[2].id).await.unwrap().as_ref(), Some(&entries[2]));
    assert_eq!(wm.session("t2", "a", "s1").await.unwrap(), vec![]);
    assert_eq!(wm.get("t2", entries[2].id).await.unwrap(), None);

    let mut changed = entries[2].clone();
    changed.content = "turn 2, edited".into();
    wm.replace("t1", &changed, now).await.unwrap();
    let s1 = wm.session("t1", "a", "s1").await.unwrap();
    assert_eq!(s1.iter().map(|m| m.content.as_str()).collect::<Vec<_>>(), vec!["turn 1", "turn 2, edited", "turn 3"]);

    wm.remove("t1", &entries[1..2]).await.unwrap();
    assert_eq!(wm.session("t1", "a", "s1").await.unwrap().len(), 2);

    // An entry whose expiry is already past lives one second (Redis's minimum TTL).
    let mut brief = working_entry("a", "s3", "gone soon");
    brief.expires_at = Some(now - chrono::Duration::seconds(10));
    wm.append("t1", std::slice::from_ref(&brief), now).await.unwrap();
    assert_eq!(wm.session("t1", "a", "s3").await.unwrap().len(), 1);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(wm.session("t1", "a", "s3").await.unwrap(), vec![]);
    assert_eq!(wm.get("t1", brief.id).await.unwrap(), None);
    wm.ping().await.unwrap();
}

#[tokio::test]
async fn the_skill_cache_serves_puts_until_evicted_or_stale() {
    let cache = LocalSkillCache::new(Duration::from_millis(200), 2);
    let a = working_entry("a", "s", "skill a");
    let b = working_entry("a", "s", "skill b");
    cache.put("t1", &a).await.unwrap();
    assert_eq!(cache.get("t1", a.id).await.unwrap().as_ref(), Some(&a));
    assert_eq!(cache.get("t2", a.id).await.unwrap(), None);
    cache.evict("t1", a.id).await.unwrap();
    assert_eq!(cache.get("t1", a.id).await.unwrap(), None);
    cache.put("t1", &a).await.unwrap();
    cache.put("t1", &b).await.unwrap();
    // Full: the entry closest to expiry (a) makes room.
    let c = working_entry("a", "s", "skill c");
    cache.put("t1", &c).await.unwrap();
    assert_eq!(cache.get("t1", a.id).await.unwrap(), None);
    assert!(cache.get("t1", b.id).await.unwrap().is_some());
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(cache.get("t1", c.id).await.unwrap(), None);
}
