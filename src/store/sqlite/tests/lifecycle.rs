//! Access counts, restart, the directory lock, migrations, working memory, skill cache.

use super::*;
use crate::domain::Retention;
use crate::store::{ListFilter, SkillCache, WorkingMemory};
use std::time::Duration;

use super::super::LocalSkillCache;

#[tokio::test]
async fn an_access_is_counted_once_per_interval() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let m = write_one(&store, "t1", prepared(new_memory(Tier::Episodic, "a", "Hank called twice."), None), at(0)).await;
    let hit = [(Tier::Episodic, m.id)];
    let interval = chrono::Duration::seconds(60);
    store.record_access("t1", &hit, at(100), at(100) - interval).await.unwrap();
    let got = store.get("t1", m.id, at(101)).await.unwrap();
    assert_eq!((got.access_count, got.last_accessed_at), (1, Some(micro(at(100)))));
    // 30 s later: within the interval, not counted, not stamped.
    store.record_access("t1", &hit, at(130), at(130) - interval).await.unwrap();
    let got = store.get("t1", m.id, at(131)).await.unwrap();
    assert_eq!((got.access_count, got.last_accessed_at), (1, Some(micro(at(100)))));
    // Exactly one interval later: counted.
    store.record_access("t1", &hit, at(160), at(160) - interval).await.unwrap();
    let got = store.get("t1", m.id, at(161)).await.unwrap();
    assert_eq!((got.access_count, got.last_accessed_at), (2, Some(micro(at(160)))));
    // The tier must match the row's.
    store.record_access("t1", &[(Tier::Semantic, m.id)], at(500), at(440)).await.unwrap();
    assert_eq!(store.get("t1", m.id, at(501)).await.unwrap().access_count, 2);
    // The same id twice in one batch is one access.
    store.record_access("t1", &[hit[0], hit[0]], at(600), at(540)).await.unwrap();
    let got = store.get("t1", m.id, at(601)).await.unwrap();
    assert_eq!((got.access_count, got.last_accessed_at), (3, Some(micro(at(600)))));
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
    store.delete("t1", gone.id, Utc::now()).await.unwrap();
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
    let sqlite: Vec<&str> = super::super::MIGRATOR.iter().map(|m| m.description.as_ref()).collect();
    assert_eq!(
        sqlite,
        vec![
            "memories",
            "drop fts",
            "exact numbers",
            "fact provenance",
            "retention",
            "working outbox",
            "erasure audit",
            "legal holds",
            "sharing",
            "consolidation",
            "skill evictions"
        ]
    );
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
        expires_at: crate::domain::RetentionPolicy::default().expires_at(Retention::Session, now),
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
        source: None,
        contested_by: None,
        skill_name: None,
        trigger_pattern: None,
        policy: None,
        tool_sequence: None,
        success_count: None,
        failure_count: None,
        success_rate: None,
        avg_reward: None,
        version: None,
        provenance: None,
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

#[tokio::test]
async fn connections_run_in_wal_mode_with_full_sync_foreign_keys_and_a_busy_timeout() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let mut conn = store.pool().acquire().await.unwrap();
    let mode: String = sqlx::query_scalar("pragma journal_mode").fetch_one(&mut *conn).await.unwrap();
    let sync: i64 = sqlx::query_scalar("pragma synchronous").fetch_one(&mut *conn).await.unwrap();
    let fk: i64 = sqlx::query_scalar("pragma foreign_keys").fetch_one(&mut *conn).await.unwrap();
    let busy: i64 = sqlx::query_scalar("pragma busy_timeout").fetch_one(&mut *conn).await.unwrap();
    // synchronous 2 is FULL.
    assert_eq!((mode.as_str(), sync, fk, busy), ("wal", 2, 1, 5_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_and_searches_all_succeed_and_keep_one_valid_fact_per_subject() {
    let dir = TempDir::new();
    let store = open(&dir).await;
    let mut tasks = Vec::new();
    for w in 0..8 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..25i64 {
                // Every write reads (dedup, supersede) before it writes.
                let mut m = new_memory(Tier::Semantic, "a", &format!("writer {w} fact {i}"));
                m.subject = Some(format!("s{}", i % 5));
                m.predicate = Some("p".into());
                write_one(&store, "t1", prepared(m, emb("m1", &[1.0, w as f32, i as f32])), at(i)).await;
                let q = query("a", "writer fact", emb("m1", &[1.0, 0.0, 0.0]));
                store.search("t1", &q, at(100)).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let valid = ListFilter { limit: 1_000, ..ListFilter::default() };
    assert_eq!(store.list("t1", &valid, at(200)).await.unwrap().len(), 5);
    let every = ListFilter { limit: 1_000, include_superseded: true, ..ListFilter::default() };
    assert_eq!(store.list("t1", &every, at(200)).await.unwrap().len(), 200);
    assert_eq!(store.inner.vectors.read().unwrap().len(), 200);
    let hits = store.search("t1", &query("a", "", emb("m1", &[1.0, 0.0, 0.0])), at(200)).await.unwrap();
    assert_eq!(hits.hits.len(), 5);
}

/// The other half of `acknowledged_writes_survive_a_kill_9`: run in a child
/// process of this test binary, it writes, says so on stdout, and waits to
/// be killed. Does nothing when run on its own.
#[tokio::test]
#[ignore = "run by acknowledged_writes_survive_a_kill_9 in a child process"]
async fn crash_child_writes_then_waits_to_be_killed() {
    let Ok(dir) = std::env::var("ENGRAM_TEST_CRASH_DIR") else { return };
    let store = SqliteStore::open(std::path::Path::new(&dir), &SqliteSettings::default()).await.unwrap();
    let m = write_one(
        &store,
        "t1",
        prepared(new_memory(Tier::Episodic, "a", "Written just before the crash."), emb("m1", &[1.0, 0.0])),
        at(0),
    )
    .await;
    let w = working_entry("a", "s", "working entry before the crash");
    store.working_memory().append("t1", std::slice::from_ref(&w), Utc::now()).await.unwrap();
    println!("ACK {} {}", m.id, w.id);
    tokio::time::sleep(Duration::from_secs(600)).await;
}

#[tokio::test]
async fn acknowledged_writes_survive_a_kill_9() {
    use std::io::BufRead;

    let dir = TempDir::new();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "store::sqlite::tests::lifecycle::crash_child_writes_then_waits_to_be_killed"])
        .args(["--ignored", "--nocapture", "--test-threads=1"])
        .env("ENGRAM_TEST_CRASH_DIR", &dir.0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    // The harness prints "test NAME ... " without a newline before the child's line.
    let ack = stdout
        .lines()
        .map(|l| l.unwrap())
        .find_map(|l| l.find("ACK ").map(|at| l[at..].to_string()))
        .expect("the child acknowledges");
    // SIGKILL: no destructor, no close, no checkpoint.
    child.kill().unwrap();
    child.wait().unwrap();
    let ids: Vec<Uuid> = ack.split(' ').skip(1).map(|s| s.parse().unwrap()).collect();

    // The lock died with the process; the writes did not.
    let store = open(&dir).await;
    let m = store.get("t1", ids[0], at(1)).await.unwrap();
    assert_eq!(m.content, "Written just before the crash.");
    let hits = store.search("t1", &query("a", "", emb("m1", &[1.0, 0.0])), at(1)).await.unwrap();
    assert_eq!(hits.hits.iter().map(|h| h.memory.id).collect::<Vec<_>>(), vec![ids[0]]);
    let w = store.working_memory().get("t1", ids[1]).await.unwrap().expect("the working entry");
    assert_eq!(w.content, "working entry before the crash");
}
