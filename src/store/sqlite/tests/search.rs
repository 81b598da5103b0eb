//! Both recall legs, their filters, and the vector index's model groups.

use super::*;

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

    // Filters: user scope (the user's and no user's memories), metadata
    // (JSON equality), occurred_at bounds, tiers.
    let mut f = q.clone();
    f.user_id = Some("u1".into());
    let mut found: Vec<Uuid> = store.search("t1", &f, now).await.unwrap().hits.iter().map(|h| h.memory.id).collect();
    found.sort();
    let mut all = vec![near.id, texty.id, vecty.id, plain.id];
    all.sort();
    assert_eq!(found, all);
    f.user_id = Some("u2".into());
    let found: Vec<Uuid> = store.search("t1", &f, now).await.unwrap().hits.iter().map(|h| h.memory.id).collect();
    assert!(found.len() == 3 && !found.contains(&near.id), "another user's memory is out of scope: {found:?}");
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

/// Whole searches and the index rebuild at 100K memories of one agent.
/// Prints, asserts nothing about time; run in an optimised build (see
/// `vectors::tests::scan_timing_at_100k_vectors_of_384_dimensions`):
///   ... store::sqlite::tests::search::search_timing -- --ignored --nocapture
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a timing printout, not a check"]
async fn search_timing_at_100k_memories_of_384_dimensions() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let n: usize = std::env::var("ENGRAM_TIMING_N").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let dims = 384usize;
    let words = ["alpha", "budget", "castle", "dinner", "engine", "forest", "garden", "harbor", "island", "jacket"];
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let started = std::time::Instant::now();
    for batch in 0..n / 1_000 {
        let items: Vec<PreparedMemory> = (0..1_000)
            .map(|i| {
                let k = batch * 1_000 + i;
                let text = format!("note {k} about the {} and the {}", words[k % 10], words[(k / 10) % 10]);
                let v: Vec<f32> = (0..dims).map(|_| (next() >> 11) as f32 / (1u64 << 53) as f32 - 0.5).collect();
                prepared(new_memory(Tier::Episodic, "a", &text), emb("m1", &v))
            })
            .collect();
        write(&store, "t1", items, at(batch as i64)).await;
    }
    let load_s = started.elapsed().as_secs_f64();
    store.close().await;
    drop(store);
    let started = std::time::Instant::now();
    let store = open(&dir).await;
    let open_ms = started.elapsed().as_secs_f64() * 1e3;

    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut report = format!(
        "{n} memories x {dims} dims: written in {load_s:.1} s (batches of 1000); reopen with index rebuild {open_ms:.0} ms"
    );
    // Both legs, the vector leg alone (no query word), the text leg alone (no vector).
    for (name, with_text, with_vector) in
        [("both legs", true, true), ("vector only", false, true), ("text only", true, false)]
    {
        let (mut vector_ms, mut text_ms, mut total_ms) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..30 {
            let v: Vec<f32> = (0..dims).map(|_| (next() >> 11) as f32 / (1u64 << 53) as f32 - 0.5).collect();
            let word = words[(next() % 10) as usize];
            let text = if with_text { format!("the {word} budget") } else { String::new() };
            let vector = if with_vector { emb("m1", &v) } else { None };
            let started = std::time::Instant::now();
            let hits = store.search("t1", &query("a", &text, vector), at(1_000)).await.unwrap();
            total_ms.push(started.elapsed().as_secs_f64() * 1e3);
            vector_ms.push(hits.vector_ms);
            text_ms.push(hits.text_ms);
            assert!(hits.vector_leg == with_vector && hits.text_leg == with_text && hits.hits.len() >= 10);
        }
        report += &format!(
            "; {name}: search median {:.2} ms (vector leg {:.2} ms, text leg {:.2} ms)",
            median(total_ms),
            median(vector_ms),
            median(text_ms)
        );
    }
    println!("{report}");
}

#[tokio::test]
async fn re_embedding_moves_every_row_into_the_new_models_space() {
    use crate::embed::Embedder;
    use crate::embed::lexical::LexicalHashEmbedder;

    let dir = TempDir::new();
    let store = open(&dir).await;
    let embedder = LexicalHashEmbedder::new(64);
    let old = write_one(
        &store,
        "t1",
        prepared(new_memory(Tier::Episodic, "a", "Quarterly report is due Friday."), emb("old", &[1.0, 0.0])),
        at(0),
    )
    .await;
    let none =
        write_one(&store, "t2", prepared(new_memory(Tier::Semantic, "a", "Jill manages the budget."), None), at(1))
            .await;
    let mut skill = new_memory(Tier::Procedural, "a", "File the report in the shared drive.");
    skill.skill_name = Some("file report".into());
    write_one(&store, "t1", prepared(skill, emb("old", &[0.0, 1.0])), at(2)).await;
    assert_eq!(store.reembed_pending(embedder.model_id()).await.unwrap(), 3);

    for tier in [Tier::Episodic, Tier::Semantic, Tier::Procedural] {
        assert_eq!(store.reembed_batch(tier, &embedder, 10, at(3)).await.unwrap(), 1);
        assert_eq!(store.reembed_batch(tier, &embedder, 10, at(3)).await.unwrap(), 0);
    }
    assert_eq!(store.reembed_pending(embedder.model_id()).await.unwrap(), 0);
    let moved = store.get("t1", old.id, at(4)).await.unwrap();
    assert_eq!((moved.embedding_model.as_deref(), moved.updated_at), (Some(embedder.model_id()), micro(at(3))));

    // The index follows: the new model finds them, the old one finds nothing.
    let text = vec!["Quarterly report is due Friday.".to_string()];
    let qv = embedder.embed(&text).await.unwrap().remove(0);
    let hits = store
        .search("t1", &query("a", "", Some(Embedding { model: embedder.model_id().into(), vector: qv })), at(4))
        .await
        .unwrap();
    assert_eq!(hits.hits[0].memory.id, old.id);
    assert!((hits.hits[0].similarity.unwrap() - 1.0).abs() < 1e-5);
    assert!(store.search("t1", &query("a", "", emb("old", &[1.0, 0.0])), at(4)).await.unwrap().hits.is_empty());
    assert_eq!(store.get("t2", none.id, at(4)).await.unwrap().embedding_model.as_deref(), Some(embedder.model_id()));
}

#[tokio::test]
async fn the_text_leg_scopes_by_tenant_and_agent_whatever_characters_they_hold() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let (tenant, agent) = ("tënant:1 \"x\" OR", "agent/é NEAR(");
    let mine =
        write_one(&store, tenant, prepared(new_memory(Tier::Episodic, agent, "Kiwis ripen in May."), None), at(0))
            .await;
    write_one(&store, tenant, prepared(new_memory(Tier::Episodic, "agent/é", "Kiwis ripen in June."), None), at(1))
        .await;
    write_one(&store, "t1", prepared(new_memory(Tier::Episodic, agent, "Kiwis ripen in July."), None), at(2)).await;
    let hits = store.search(tenant, &query(agent, "when do kiwis ripen", None), at(3)).await.unwrap();
    assert_eq!(hits.hits.iter().map(|h| h.memory.id).collect::<Vec<_>>(), vec![mine.id]);
}

/// `count` episodic memories of agent "a" saying "Kiwi note number k." with
/// vector [0, 1], except where `special` gives a text and vector of its own.
fn kiwi_notes(count: usize, special: impl Fn(usize) -> Option<(&'static str, [f32; 2])>) -> Vec<PreparedMemory> {
    (0..count)
        .map(|k| {
            let (text, v) = special(k).map_or((format!("Kiwi note number {k}."), [0.0, 1.0]), |(t, v)| (t.into(), v));
            prepared(new_memory(Tier::Episodic, "a", &text), emb("m1", &v))
        })
        .collect()
}

/// (id, text rank) of each hit, in order.
fn ranked(hits: &crate::store::SearchHits) -> Vec<(Uuid, Option<f64>)> {
    hits.hits.iter().map(|h| (h.memory.id, h.text_rank)).collect()
}

#[tokio::test]
async fn every_match_is_ranked_and_both_legs_give_a_row_the_same_bm25() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    // 3,000 memories say "kiwi"; the oldest is the best match and the
    // query's nearest, the newest says neither query word and is next nearest.
    let n = 3_000;
    let items = kiwi_notes(n + 1, |k| match k {
        0 => Some(("The kiwi orchard by the river, kiwi after kiwi.", [1.0, 0.0])),
        k if k == n => Some(("A plum tart for dessert.", [0.9, 0.1])),
        _ => None,
    });
    let written = write(&store, "t1", items, at(0)).await;
    let (oldest, plum) = (written[0].memory.id, written[n].memory.id);

    let mut q = query("a", "kiwi orchard", None);
    q.per_leg = 2;
    let text = store.search("t1", &q, at(1)).await.unwrap();
    // However many rows match, the best is found: the oldest, first.
    assert_eq!(text.hits[0].memory.id, oldest);
    let best = text.hits[0].text_rank.unwrap();
    assert!(best > text.hits[1].text_rank.unwrap());

    // Now the vector leg finds the oldest and the plum first; their ranks
    // are the same numbers the text leg gives (0: no query word).
    q.vector = emb("m1", &[1.0, 0.0]);
    let both = store.search("t1", &q, at(1)).await.unwrap();
    assert_eq!(ranked(&both)[..2], [(oldest, Some(best)), (plum, Some(0.0))]);

    // Rebuilt at open (in several chunks), the index ranks the same.
    store.close().await;
    drop(store);
    let store = open(&dir).await;
    q.vector = None;
    assert_eq!(ranked(&store.search("t1", &q, at(1)).await.unwrap()), ranked(&text));
}

#[tokio::test]
async fn the_full_text_index_follows_every_write_and_is_rebuilt_the_same_at_open() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let items = kiwi_notes(40, |k| (k == 7).then_some(("Plum tart with kiwi on top.", [1.0, 0.0])));
    let written = write(&store, "t1", items, at(0)).await;
    let ids: Vec<Uuid> = written.iter().map(|w| w.memory.id).collect();
    let q = query("a", "plum tart", None);
    assert_eq!(ranked(&store.search("t1", &q, at(1)).await.unwrap()).len(), 1);

    // A new text is searched by its new words only.
    let patch = crate::domain::MemoryPatch { content: Some("Apple crumble.".into()), ..Default::default() };
    store.update("t1", ids[7], &patch, None, at(2)).await.unwrap();
    assert!(store.search("t1", &q, at(3)).await.unwrap().hits.is_empty());
    let patch = crate::domain::MemoryPatch { content: Some("A plum, no tart.".into()), ..Default::default() };
    store.update("t1", ids[8], &patch, None, at(2)).await.unwrap();
    // Deleted rows are gone from the counts too.
    for id in &ids[20..] {
        store.delete("t1", *id, Utc::now()).await.unwrap();
    }
    let mut kiwi = query("a", "kiwi plum", None);
    kiwi.per_leg = 50;
    let before = (
        ranked(&store.search("t1", &q, at(3)).await.unwrap()),
        ranked(&store.search("t1", &kiwi, at(3)).await.unwrap()),
    );
    assert_eq!(before.0.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [ids[8]]);
    assert_eq!(before.1.len(), 19, "the 20 kept but the one rewritten without either word");

    store.close().await;
    drop(store);
    let store = open(&dir).await;
    let after = (
        ranked(&store.search("t1", &q, at(3)).await.unwrap()),
        ranked(&store.search("t1", &kiwi, at(3)).await.unwrap()),
    );
    assert_eq!(after, before);
}

#[tokio::test]
async fn a_query_vector_that_arrives_late_gives_the_same_hits() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    for (k, (text, v)) in [
        ("We booked a hotel in Lisbon.", [1.0, 0.0]),
        ("The Lisbon hotels were full.", [0.0, 1.0]),
        ("Gina prefers aisle seats.", [0.8, 0.2]),
    ]
    .into_iter()
    .enumerate()
    {
        write_one(&store, "t1", prepared(new_memory(Tier::Episodic, "a", text), emb("m1", &v)), at(k as i64)).await;
    }
    let q = query("a", "hotel in Lisbon", emb("m1", &[1.0, 0.0]));
    let now = at(10);
    let summary = |hits: crate::store::SearchHits| -> Vec<(Uuid, Option<f64>, Option<f64>)> {
        hits.hits.iter().map(|h| (h.memory.id, h.similarity, h.text_rank)).collect()
    };
    let at_once = summary(store.search("t1", &q, now).await.unwrap());
    let vector = q.vector.clone();
    let late = Box::pin(async move {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        vector
    });
    let blank = SearchQuery { vector: None, ..q.clone() };
    let hits = store.search_embedding("t1", &blank, late, now).await.unwrap();
    assert!(hits.vector_leg && hits.text_leg);
    assert_eq!(summary(hits), at_once);
    assert_eq!(at_once.len(), 3);
    assert!(at_once.iter().all(|(_, s, r)| s.is_some() && r.is_some()));
}

#[tokio::test]
async fn search_hits_carry_every_field_as_a_plain_read_does() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let episode =
        write_one(&store, "t1", prepared(new_memory(Tier::Episodic, "a", "Kiwi harvest."), None), at(0)).await;
    let mut old = new_memory(Tier::Semantic, "a", "The kiwi harvest is in May.");
    (old.subject, old.predicate, old.object) = (Some("kiwi harvest".into()), Some("month".into()), Some("May".into()));
    old.user_id = Some("ü\"1".into());
    write_one(&store, "t1", prepared(old, emb("m1", &[1.0, 0.0])), at(1)).await;
    let mut fact = new_memory(Tier::Semantic, "a", "The kiwi harvest is in June.");
    (fact.subject, fact.predicate, fact.object) =
        (Some("kiwi harvest".into()), Some("month".into()), Some("June".into()));
    (fact.confidence, fact.source_episode_id, fact.user_id) = (Some(0.9), Some(episode.id), Some("ü\"1".into()));
    fact.metadata = json!({"n": 1.5, "tags": ["a"], "nested": {"x": null}}).as_object().unwrap().clone();
    fact.private = true;
    let fact = write_one(&store, "t1", prepared(fact, emb("m1", &[0.6, 0.8])), at(2)).await;
    assert!(fact.supersedes.is_some());
    let mut skill = new_memory(Tier::Procedural, "a", "Pick kiwis when soft.");
    skill.skill_name = Some("kiwi picking".into());
    skill.trigger_pattern = Some("harvest".into());
    skill.policy = Some(json!({"steps": ["feel", "pick"]}));
    skill.tool_sequence = Some(json!(["basket"]));
    skill.outcome = Some(crate::domain::Outcome::Success);
    skill.reward = Some(0.5);
    let skill = write_one(&store, "t1", prepared(skill, None), at(3)).await;

    let hits = store.search("t1", &query("a", "kiwi harvest", emb("m1", &[1.0, 0.0])), at(4)).await.unwrap();
    for id in [episode.id, fact.id, skill.id] {
        let hit = hits.hits.iter().find(|h| h.memory.id == id).unwrap_or_else(|| panic!("{id} missing"));
        assert_eq!(hit.memory, store.get("t1", id, at(4)).await.unwrap());
    }
    // Vectors come from the index, unit length: the fact's cosine is exact.
    let hit = hits.hits.iter().find(|h| h.memory.id == fact.id).unwrap();
    assert!((hit.similarity.unwrap() - 0.6).abs() < 1e-6);
    assert_eq!(hit.vector.as_deref(), Some(&[0.6f32, 0.8][..]));
}

/// The legs' cost on a real data directory (`ENGRAM_TIMING_DIR`, e.g. the
/// recall benchmark's; `ENGRAM_TIMING_TENANT`, `ENGRAM_TIMING_AGENT`), 200
/// of the agent's stored texts and vectors used as queries. Prints, asserts
/// nothing about time; run optimised as `search_timing` above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a timing printout, not a check"]
async fn search_timing_on_a_data_directory() {
    let Ok(dir) = std::env::var("ENGRAM_TIMING_DIR") else { return };
    let tenant = std::env::var("ENGRAM_TIMING_TENANT").unwrap_or_else(|_| "bench-recall".into());
    let agent = std::env::var("ENGRAM_TIMING_AGENT").unwrap_or_else(|_| "agent-a".into());
    let started = std::time::Instant::now();
    let store = SqliteStore::open(std::path::Path::new(&dir), &super::SqliteSettings::default()).await.unwrap();
    let open_ms = started.elapsed().as_secs_f64() * 1e3;
    let started = std::time::Instant::now();
    let texts = super::super::TextIndex::load(&store.inner.pool).await.unwrap().len();
    let text_ms = started.elapsed().as_secs_f64() * 1e3;
    let started = std::time::Instant::now();
    super::super::VectorIndex::load(&store.inner.pool).await.unwrap();
    let vectors_ms = started.elapsed().as_secs_f64() * 1e3;
    println!(
        "open {open_ms:.0} ms; alone: full-text index of {texts} rows {text_ms:.0} ms, vector index {vectors_ms:.0} ms"
    );
    let picked: Vec<(Uuid, String, String)> = sqlx::query_as(
        "select id, content, embedding_model from memories where tenant_id = ? and agent_id = ? \
         and embedding_model is not null order by random() limit 200",
    )
    .bind(&tenant)
    .bind(&agent)
    .fetch_all(&store.inner.pool)
    .await
    .unwrap();
    let queries: Vec<(String, Embedding)> = picked
        .into_iter()
        .filter_map(|(id, text, model)| {
            let index = store.inner.vectors.read().unwrap();
            let vector = index.normalised(&tenant, &agent, &model, 384, &[id]).remove(&id)?;
            Some((text, Embedding { model, vector }))
        })
        .collect();
    let now = Utc::now();
    let percentiles = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        format!("p50 {:.2} p95 {:.2}", v[v.len() / 2], v[v.len() * 95 / 100])
    };
    let mut report = format!("{} queries", queries.len());
    for per_leg in [40, 200] {
        let (mut rank, mut text, mut vector, mut both) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (text_q, e) in &queries {
            let terms = super::super::text::query_terms(text_q);
            let started = std::time::Instant::now();
            let tiers = [Tier::Episodic, Tier::Semantic, Tier::Procedural];
            let seen = std::collections::HashSet::new();
            let filter = super::super::vectors::ScanFilter {
                tiers: &tiers,
                user_id: None,
                since: None,
                until: None,
                now: now.timestamp_micros(),
                seen: &seen,
                candidates: false,
                as_of: None,
                valid_at: None,
            };
            store.inner.text.read().unwrap().best(&tenant, &agent, &terms, &filter, per_leg);
            rank.push(started.elapsed().as_secs_f64() * 1e3);
            let mut q = query(&agent, text_q, None);
            q.per_leg = per_leg;
            let started = std::time::Instant::now();
            store.search(&tenant, &q, now).await.unwrap();
            text.push(started.elapsed().as_secs_f64() * 1e3);
            let mut q = query(&agent, "", Some(e.clone()));
            q.per_leg = per_leg;
            let started = std::time::Instant::now();
            store.search(&tenant, &q, now).await.unwrap();
            vector.push(started.elapsed().as_secs_f64() * 1e3);
            let mut q = query(&agent, text_q, Some(e.clone()));
            q.per_leg = per_leg;
            let started = std::time::Instant::now();
            store.search(&tenant, &q, now).await.unwrap();
            both.push(started.elapsed().as_secs_f64() * 1e3);
        }
        report += &format!(
            "; per_leg {per_leg}: bm25 ranking {}, text-only search {}, vector-only search {}, both {}",
            percentiles(rank),
            percentiles(text),
            percentiles(vector),
            percentiles(both)
        );
    }
    println!("{report}");

    // The vector index's first pass against exact ranking: each query is a
    // stored vector, itself left out (as a row already seen).
    let index = store.inner.vectors.read().unwrap();
    let tiers = [Tier::Episodic, Tier::Semantic, Tier::Procedural];
    for want in [40, 200] {
        let first_pass = super::super::vectors::first_pass(want);
        for keep in [want * 5, first_pass, first_pass * 2, usize::MAX] {
            let (mut found, mut total, mut times) = (0usize, 0usize, Vec::new());
            for (_, e) in &queries {
                let own =
                    index.nearest_of(&tenant, &agent, &e.model, &e.vector, &exact_filter(&tiers, now), 1, usize::MAX);
                let seen: std::collections::HashSet<Uuid> =
                    own.iter().filter(|h| h.similarity > 0.9999).map(|h| h.id).collect();
                let filter = super::super::vectors::ScanFilter { seen: &seen, ..exact_filter(&tiers, now) };
                let started = std::time::Instant::now();
                let got = index.nearest_of(&tenant, &agent, &e.model, &e.vector, &filter, want, keep);
                times.push(started.elapsed().as_secs_f64() * 1e3);
                let exact = index.nearest_of(&tenant, &agent, &e.model, &e.vector, &filter, want, usize::MAX);
                let got: std::collections::HashSet<Uuid> = got.iter().map(|h| h.id).collect();
                found += exact.iter().filter(|h| got.contains(&h.id)).count();
                total += exact.len();
            }
            println!(
                "vector index, {want} per tier, first pass {}: recall@{want} {:.4} against exact, {}",
                if keep == usize::MAX { "everything".to_string() } else { keep.to_string() },
                found as f64 / total as f64,
                percentiles(times)
            );
        }
    }
}

fn exact_filter<'a>(tiers: &'a [Tier], now: chrono::DateTime<Utc>) -> super::super::vectors::ScanFilter<'a> {
    static NONE: std::sync::LazyLock<std::collections::HashSet<Uuid>> =
        std::sync::LazyLock::new(std::collections::HashSet::new);
    super::super::vectors::ScanFilter {
        tiers,
        user_id: None,
        since: None,
        until: None,
        now: now.timestamp_micros(),
        seen: &NONE,
        candidates: false,
        as_of: None,
        valid_at: None,
    }
}
