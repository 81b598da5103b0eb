//! Round trips, listing, patches and deletes.

use super::*;
use crate::domain::{EventType, MemoryPatch, Outcome, Retention};
use crate::store::{Cursor, ListFilter, StoreError};

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
        lifetime: Some(chrono::Duration::hours(1)),
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
    assert_eq!(store.delete("t1", m.id, Utc::now()).await.unwrap(), Tier::Semantic);
    assert!(matches!(store.get("t1", m.id, at(1)).await, Err(StoreError::NotFound)));
    let hits = store.search("t1", &query("a", "tea", emb("m1", &[1.0, 0.0])), at(1)).await.unwrap();
    assert!(hits.vector_leg && hits.text_leg);
    assert!(hits.hits.is_empty());
    assert!(matches!(store.delete("t1", m.id, Utc::now()).await, Err(StoreError::NotFound)));
    assert_eq!(store.inner.vectors.read().unwrap().len(), 0);
}

#[tokio::test]
async fn migration_0003_rounds_numbers_stored_through_4_byte_floats_to_what_was_written() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    // What engram stored before: the client's decimals widened from f32.
    let widened = |x: f64| f64::from(x as f32);
    let mut fact = new_memory(Tier::Semantic, "a", "The lemon tree stands on the balcony.");
    fact.importance = widened(0.4);
    fact.confidence = Some(widened(0.9));
    let mut skill = new_memory(Tier::Procedural, "a", "Water the lemon tree weekly.");
    skill.skill_name = Some("water".into());
    skill.importance = widened(0.002877);
    skill.reward = Some(widened(-0.3));
    let fact = write_one(&store, "t1", prepared(fact, None), at(0)).await;
    let skill = write_one(&store, "t1", prepared(skill, None), at(0)).await;
    assert_eq!(fact.importance, 0.4000000059604645);

    // Run 0003 again on these rows, as on a database written before it.
    sqlx::query("delete from _sqlx_migrations where version = 3").execute(store.pool()).await.unwrap();
    store.close().await;
    drop(store);
    let store = open(&dir).await;

    let fact = store.get("t1", fact.id, at(1)).await.unwrap();
    assert_eq!((fact.importance, fact.confidence), (0.4, Some(0.9)));
    let skill = store.get("t1", skill.id, at(1)).await.unwrap();
    // SQLite's own round(x, 6) would give 0.0028770000000000002 here.
    assert_eq!((skill.importance, skill.avg_reward), (0.002877, Some(-0.3)));
}
