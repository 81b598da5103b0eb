//! The write rules: dedup, supersede, upsert, idempotency, expiry, tenancy.

use super::*;
use crate::domain::{MemoryPatch, Outcome, Retention};
use crate::store::{IdempotencyKey, ListFilter, StoreError};

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
    let fact = |content: &str, object: &str, confidence: f64| {
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
    // A less confident claim does not retire the valid one: it is kept as a
    // candidate contesting it, never valid.
    let c = write_one(&store, "t1", prepared(fact("Eve lives in Lima.", "Lima", 0.5), None), at(20)).await;
    assert_eq!((c.supersedes, c.contested_by), (None, Some(b.id)));
    assert_eq!(c.valid_until, c.valid_from);
    assert_eq!(store.get("t1", b.id, at(21)).await.unwrap().valid_until, None);
    // A confident one retires the current fact and points at it.
    let d = write_one(&store, "t1", prepared(fact("Eve lives in Kyiv.", "Kyiv", 0.9), None), at(30)).await;
    assert_eq!(d.supersedes, Some(b.id));
    assert_eq!(store.get("t1", b.id, at(31)).await.unwrap().valid_until, Some(micro(at(30))));

    // The chain a <- b <- d with b's candidate c, from any member, oldest first.
    for id in [a.id, b.id, c.id, d.id] {
        assert_eq!(ids(&store.history("t1", id, at(31)).await.unwrap()), vec![a.id, b.id, c.id, d.id]);
    }

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
    let skill = |content: &str, outcome: Option<Outcome>, reward: Option<f64>, meta: Value| {
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
    // (1.0 + 0.3) / 2 in double precision, as written: no rounding to 4-byte floats.
    assert_eq!(v2.avg_reward, Some(0.65));
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
    // The running mean: (0.65 · 2 + 0.0) / 3, exactly as Postgres computes it.
    assert_eq!(v4.avg_reward, Some((0.65 * 2.0 + 0.0) / 3.0));
    assert_eq!(v4.success_rate, Some(2.0 / 3.0));
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
    assert!(matches!(store.delete("t2", m.id, Utc::now()).await, Err(StoreError::NotFound)));
    store.record_access("t2", &[(Tier::Semantic, m.id)], now, now).await.unwrap();
    assert_eq!(store.get("t1", m.id, now).await.unwrap(), m);
}

/// A write future dropped at any point (a request timeout, a client that went
/// away) leaves its memory either absent or stored and searchable: never
/// committed but missing from the in-process indexes.
#[tokio::test]
async fn a_write_dropped_at_any_point_is_either_absent_or_searchable() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let mut committed_after_drop = 0;
    // Each attempt polls its write a few more times than the last before
    // dropping it (cycling), so the drops sweep over every await of the
    // write; it goes on until some drops have landed after the commit began.
    for attempt in 0..3_000u32 {
        if committed_after_drop >= 3 {
            break;
        }
        let polls = attempt % 200;
        let vector = [1.0, attempt as f32 / 3_000.0];
        let item = prepared(new_memory(Tier::Episodic, "a", &format!("zebra sighting {attempt}")), emb("m1", &vector));
        let id = item.memory.id;
        let items = vec![item];
        let mut write = Box::pin(store.write("t1", &items, None, &render, at(0)));
        let mut finished = false;
        for _ in 0..polls {
            if futures::poll!(write.as_mut()).is_ready() {
                finished = true;
                break;
            }
            tokio::task::yield_now().await;
        }
        drop(write);
        // The next write transaction waits for the gate, so a commit still
        // in flight has reached the indexes once this returns.
        drop(store.begin().await.unwrap());

        let stored = store.get("t1", id, at(1)).await.is_ok();
        let text = store.search("t1", &query("a", &format!("zebra sighting {attempt}"), None), at(1)).await.unwrap();
        let by_text = text.hits.iter().any(|h| h.memory.id == id);
        let near = store.search("t1", &query("a", "", emb("m1", &vector)), at(1)).await.unwrap();
        let by_vector = near.hits.iter().any(|h| h.memory.id == id);
        assert_eq!((stored, stored), (by_text, by_vector), "attempt {attempt}, dropped after {polls} polls");
        if stored && !finished {
            committed_after_drop += 1;
        }
    }
    // Some drops must have landed after the commit began, or the test proved nothing.
    assert!(committed_after_drop > 0, "no write was dropped after its commit began");
}
