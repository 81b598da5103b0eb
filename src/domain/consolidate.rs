//! The rules of consolidation: which episodes are summarised together, what
//! a summary and an extracted fact look like, and what a consolidation job
//! reports.
//!
//! Without an LLM both steps are rule-based and say so in what they write
//! (`metadata.consolidation.method`): a summary is `extractive` (sentences of
//! its episodes, verbatim, `extract::summarise`), a fact comes from `rules`
//! (first-person statements read by fixed patterns, `extract::facts_in`),
//! its object a piece of its episode's text.
//!
//! Rules, decided here for every backend:
//! - **Groups** never mix users or sessions: a summary belongs to one user
//!   (or to none), so erasing a user finds it by its `user_id` as well as by
//!   its sources. A group holds at most `group_size` episodes, oldest first.
//! - **Derived records name their sources**: a summary lists them in
//!   `metadata.consolidation.source_episode_ids`, a fact in
//!   `source_episode_id`; erasure follows both.
//! - **Privacy and retention follow the sources**: a summary is private when
//!   any of its episodes is, and keeps the longest retention of them; a fact
//!   has its episode's privacy and retention.
//! - **Trust**: a fact written by consolidation has the `consolidated`
//!   source, the least trusted, so it never replaces what the agent or the
//!   user stated (it is kept as a candidate instead).
//!
//! Must not: touch storage, or know about HTTP.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::draft::Draft;
use super::extract;
use super::memory::{EventType, Memory, Outcome, Retention, Tier};

/// The metadata key under which derived records say how they were made.
pub const METADATA_KEY: &str = "consolidation";

/// How a derived record was made.
pub const METHOD_EXTRACTIVE: &str = "extractive";
pub const METHOD_RULES: &str = "rules";

/// Episodes summarised together: one user's (or no user's) episodes of one
/// session, oldest first.
#[derive(Debug, Clone, PartialEq)]
pub struct Group<'a> {
    pub user_id: Option<&'a str>,
    pub session_id: Option<&'a str>,
    pub episodes: Vec<&'a Memory>,
}

/// Splits episodes into groups of at most `size` (at least 1), each one
/// user's and one session's, in the order of their first episode.
pub fn groups(episodes: &[Memory], size: usize) -> Vec<Group<'_>> {
    let size = size.max(1);
    let mut sorted: Vec<&Memory> = episodes.iter().collect();
    sorted.sort_by_key(|m| (m.created_at, m.id));
    let mut by_key: BTreeMap<(Option<&str>, Option<&str>), Vec<&Memory>> = BTreeMap::new();
    let mut order: Vec<(Option<&str>, Option<&str>)> = Vec::new();
    for m in sorted {
        let key = (m.user_id.as_deref(), m.session_id.as_deref());
        let slot = by_key.entry(key).or_default();
        if slot.is_empty() {
            order.push(key);
        }
        slot.push(m);
    }
    let mut out = Vec::new();
    for key in order {
        for chunk in by_key[&key].chunks(size) {
            out.push(Group { user_id: key.0, session_id: key.1, episodes: chunk.to_vec() });
        }
    }
    out
}

/// The retention of a derived record: the longest of its sources'.
fn longest(retentions: impl Iterator<Item = Retention>) -> Retention {
    retentions.max_by_key(|r| rank(*r)).unwrap_or(Retention::MediumTerm)
}

fn rank(r: Retention) -> u8 {
    match r {
        Retention::Transient => 0,
        Retention::Session => 1,
        Retention::ShortTerm => 2,
        Retention::MediumTerm => 3,
        Retention::LongTerm => 4,
        Retention::Permanent => 5,
    }
}

fn provenance(method: &str, job_id: Uuid, sources: &[Uuid]) -> Map<String, Value> {
    let mut metadata = Map::new();
    metadata.insert(METADATA_KEY.into(), json!({"method": method, "job_id": job_id, "source_episode_ids": sources}));
    metadata
}

/// The summary of a group: its most telling sentences, verbatim; `None`
/// when the group has a single episode (the summary would be the episode
/// again) or nothing to say.
pub fn summary_draft(agent_id: &str, group: &Group<'_>, sentences: usize, job_id: Uuid) -> Option<Draft> {
    if group.episodes.len() < 2 {
        return None;
    }
    let texts: Vec<&str> = group.episodes.iter().map(|m| m.content.as_str()).collect();
    let content = extract::summarise(&texts, sentences);
    if content.trim().is_empty() {
        return None;
    }
    let sources: Vec<Uuid> = group.episodes.iter().map(|m| m.id).collect();
    let last = group.episodes.last().expect("a group has episodes");
    Some(Draft {
        tier: Some(Tier::Episodic),
        agent_id: agent_id.to_string(),
        user_id: group.user_id.map(str::to_string),
        session_id: group.session_id.map(str::to_string),
        content,
        importance: group.episodes.iter().map(|m| m.importance).reduce(f64::max),
        retention: Some(longest(group.episodes.iter().map(|m| m.retention))),
        metadata: provenance(METHOD_EXTRACTIVE, job_id, &sources),
        private: group.episodes.iter().any(|m| m.private),
        // The summary speaks of the span up to its last episode.
        occurred_at: Some(last.occurred_at),
        event_type: Some(EventType::Observation),
        ..Draft::default()
    })
}

/// The episodes a summary covers (`metadata.consolidation.source_episode_ids`);
/// empty for any other memory.
pub fn summarised(memory: &Memory) -> Vec<Uuid> {
    if memory.tier != Tier::Episodic {
        return Vec::new();
    }
    memory
        .metadata
        .get(METADATA_KEY)
        .and_then(|c| c.get("source_episode_ids"))
        .and_then(Value::as_array)
        .map(|ids| ids.iter().filter_map(|v| v.as_str()?.parse().ok()).collect())
        .unwrap_or_default()
}

/// How a predicate reads in a fact's sentence.
fn phrase(predicate: &str) -> String {
    match predicate {
        "name" => "is named".into(),
        "works_as" => "works as".into(),
        "works_at" => "works at".into(),
        "lives_in" => "lives in".into(),
        "from" => "is from".into(),
        "has_pet" => "has a pet:".into(),
        "allergic_to" => "is allergic to".into(),
        "has_child" => "has a child:".into(),
        "has_partner" => "has a partner:".into(),
        "married_to" => "is married to".into(),
        other => other.replace('_', " "),
    }
}

/// The facts one episode states in the first person, as writes of the
/// user's facts (`subject` the user id, or `user` for an episode without
/// one: whoever spoke to the agent).
pub fn fact_drafts(agent_id: &str, episode: &Memory, job_id: Uuid) -> Vec<Draft> {
    let subject = episode.user_id.clone().unwrap_or_else(|| "user".into());
    extract::facts_in(&episode.content)
        .into_iter()
        .map(|f| Draft {
            tier: Some(Tier::Semantic),
            agent_id: agent_id.to_string(),
            user_id: episode.user_id.clone(),
            session_id: episode.session_id.clone(),
            content: format!("{subject} {} {}", phrase(f.predicate), f.object),
            importance: Some(episode.importance),
            retention: Some(episode.retention),
            metadata: provenance(METHOD_RULES, job_id, &[episode.id]),
            private: episode.private,
            occurred_at: Some(episode.occurred_at),
            subject: Some(subject.clone()),
            predicate: Some(f.predicate.to_string()),
            object: Some(f.object),
            confidence: Some(f.confidence),
            source_episode_id: Some(episode.id),
            ..Draft::default()
        })
        .collect()
}

/// How a derived record was made by a chat model.
pub const METHOD_LLM: &str = "llm";

// The schemas bound every answer's length (a grammar-constrained server
// cannot exceed them), so that an answer of the largest allowed shape fits
// the default `llm.max_output_tokens` and a small model that wanders is cut
// by the schema, not by the token limit mid-string.

/// Longest summary a model may write, in characters.
const MAX_SUMMARY_CHARS: usize = 1000;

/// Longest object of a fact a model may give, in characters: a fact's
/// object is a few words.
const MAX_OBJECT_CHARS: usize = 60;

/// Most facts one answer may hold.
const MAX_FACTS: usize = 8;

/// The episodes of a group as a model reads them: numbered, oldest first.
fn numbered(group: &Group<'_>) -> String {
    group
        .episodes
        .iter()
        .enumerate()
        .map(|(i, m)| format!("[{i}] ({}) {}", m.occurred_at.format("%Y-%m-%d %H:%M"), m.content))
        .collect::<Vec<_>>()
        .join("\n")
}

pub const SUMMARY_INSTRUCTIONS: &str = "You condense an AI agent's past interactions into a short memory. \
    Write a summary of the numbered episodes in at most five sentences. Keep decisions, outcomes, errors and \
    the user's preferences and personal facts; drop greetings and small talk. Use only what the episodes say. \
    Answer with JSON: {\"summary\": \"...\"}.";

pub const FACTS_INSTRUCTIONS: &str = "You extract durable facts about the user from an AI agent's past \
    interactions. For each fact the user states about themselves (name, job, workplace, home, origin, pets, \
    allergies, family, likes, dislikes, preferences), give the number of the episode that states it, a \
    snake_case predicate (name, works_as, works_at, lives_in, from, has_pet, allergic_to, has_child, \
    has_partner, likes, dislikes, prefers, or another short one), the object in a few words, and your \
    confidence as a whole percentage from 0 to 100. Leave out questions, guesses and what others said. Answer with JSON: \
    {\"facts\": [{\"episode\": 0, \"predicate\": \"...\", \"object\": \"...\", \"confidence\": 90}]}; \
    an empty list when there is none.";

/// The JSON schema of a summary answer.
pub fn summary_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"summary": {"type": "string", "minLength": 1, "maxLength": MAX_SUMMARY_CHARS}},
        "required": ["summary"],
        "additionalProperties": false,
    })
}

/// The JSON schema of a facts answer for a group of `episodes` (servers
/// that turn schemas into grammars then cannot answer out of range).
pub fn facts_schema(episodes: usize) -> Value {
    json!({
        "type": "object",
        "properties": {"facts": {"type": "array", "maxItems": episodes.clamp(1, MAX_FACTS), "items": {
            "type": "object",
            "properties": {
                "episode": {"type": "integer", "minimum": 0, "maximum": episodes.saturating_sub(1)},
                "predicate": {"type": "string", "minLength": 1, "maxLength": 40, "pattern": "^[a-z][a-z0-9_]*$"},
                "object": {"type": "string", "minLength": 1, "maxLength": MAX_OBJECT_CHARS},
                // A whole percentage: grammars bound integers but not
                // decimals, and a small model may write digits for ever.
                "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
            },
            "required": ["episode", "predicate", "object", "confidence"],
            "additionalProperties": false,
        }}},
        "required": ["facts"],
        "additionalProperties": false,
    })
}

/// The input of both model tasks for a group.
pub fn model_input(group: &Group<'_>) -> String {
    numbered(group)
}

/// A summary answer, checked: one non-empty string within the length.
pub fn parse_summary(v: &Value) -> Result<String, String> {
    let s = v.get("summary").and_then(Value::as_str).ok_or("no `summary` string")?.trim();
    if s.is_empty() || s.chars().count() > MAX_SUMMARY_CHARS {
        return Err(format!("the summary must be 1 to {MAX_SUMMARY_CHARS} characters"));
    }
    Ok(s.to_string())
}

/// A fact a model read off one episode of a group.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelFact {
    pub episode: usize,
    pub predicate: String,
    pub object: String,
    pub confidence: f64,
}

/// A facts answer, read against the group: each fact must name one of its
/// episodes, a snake_case predicate, a short object and a confidence in
/// whole percent (stored as 0..1). A fact out of shape is left out and counted (servers that turn a
/// schema into a grammar do not bound numbers, and small models wander);
/// an answer without a `facts` array is unusable as a whole (retried).
pub fn parse_facts(v: &Value, episodes: usize) -> Result<(Vec<ModelFact>, usize), String> {
    let items = v.get("facts").and_then(Value::as_array).ok_or("no `facts` array")?;
    let mut out = Vec::with_capacity(items.len());
    let mut rejected = 0;
    for f in items {
        match model_fact(f, episodes) {
            Some(fact) if !out.contains(&fact) => out.push(fact),
            Some(_) => {}
            None => rejected += 1,
        }
    }
    Ok((out, rejected))
}

fn model_fact(f: &Value, episodes: usize) -> Option<ModelFact> {
    let episode = f.get("episode").and_then(Value::as_u64).filter(|e| (*e as usize) < episodes)? as usize;
    let predicate = f.get("predicate").and_then(Value::as_str)?.trim().to_lowercase();
    let snake = predicate.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if predicate.is_empty() || predicate.len() > 64 || !snake || !predicate.as_bytes()[0].is_ascii_lowercase() {
        return None;
    }
    let object = f.get("object").and_then(Value::as_str)?.trim().to_string();
    if object.is_empty() || object.chars().count() > MAX_OBJECT_CHARS {
        return None;
    }
    let percent = f.get("confidence").and_then(Value::as_u64).filter(|c| *c <= 100)?;
    let confidence = percent as f64 / 100.0;
    Some(ModelFact { episode, predicate, object, confidence })
}

/// A summary a model wrote of a group.
pub fn model_summary_draft(agent_id: &str, group: &Group<'_>, text: String, job_id: Uuid, model: &str) -> Draft {
    let sources: Vec<Uuid> = group.episodes.iter().map(|m| m.id).collect();
    let last = group.episodes.last().expect("a group has episodes");
    let mut metadata = provenance(METHOD_LLM, job_id, &sources);
    metadata[METADATA_KEY]["model"] = Value::String(model.to_string());
    Draft {
        tier: Some(Tier::Episodic),
        agent_id: agent_id.to_string(),
        user_id: group.user_id.map(str::to_string),
        session_id: group.session_id.map(str::to_string),
        content: text,
        importance: group.episodes.iter().map(|m| m.importance).reduce(f64::max),
        retention: Some(longest(group.episodes.iter().map(|m| m.retention))),
        metadata,
        private: group.episodes.iter().any(|m| m.private),
        occurred_at: Some(last.occurred_at),
        event_type: Some(EventType::Observation),
        ..Draft::default()
    }
}

/// Facts a model read off a group, as writes of the user's facts.
pub fn model_fact_drafts(
    agent_id: &str,
    group: &Group<'_>,
    facts: Vec<ModelFact>,
    job_id: Uuid,
    model: &str,
) -> Vec<Draft> {
    facts
        .into_iter()
        .map(|f| {
            let episode = group.episodes[f.episode];
            let subject = episode.user_id.clone().unwrap_or_else(|| "user".into());
            let mut metadata = provenance(METHOD_LLM, job_id, &[episode.id]);
            metadata[METADATA_KEY]["model"] = Value::String(model.to_string());
            Draft {
                tier: Some(Tier::Semantic),
                agent_id: agent_id.to_string(),
                user_id: episode.user_id.clone(),
                session_id: episode.session_id.clone(),
                content: format!("{subject} {} {}", phrase(&f.predicate), f.object),
                importance: Some(episode.importance),
                retention: Some(episode.retention),
                metadata,
                private: episode.private,
                occurred_at: Some(episode.occurred_at),
                subject: Some(subject),
                predicate: Some(f.predicate),
                object: Some(f.object),
                confidence: Some(f.confidence),
                source_episode_id: Some(episode.id),
                ..Draft::default()
            }
        })
        .collect()
}

/// What happens to the episodes a summary covers once it is written
/// (`consolidation.sources`). Only a group that got a summary hands its
/// episodes on: a lone episode is its own summary and keeps its retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourcePolicy {
    /// They stay with their own retention (the default).
    Keep,
    /// Each lives at most this long from its consolidation.
    Shorten(chrono::Duration),
    /// Deleted in the transaction that writes their summary: the summary
    /// and the facts replace them.
    Delete,
}

impl SourcePolicy {
    /// The policy named `name` (`keep`, `shorten`, `delete`); `shorten`
    /// keeps sources `retention_secs` at most.
    pub fn parse(name: &str, retention_secs: u64) -> Option<SourcePolicy> {
        match name {
            "keep" => Some(SourcePolicy::Keep),
            "shorten" => Some(SourcePolicy::Shorten(
                i64::try_from(retention_secs)
                    .ok()
                    .and_then(chrono::Duration::try_seconds)
                    .unwrap_or(chrono::Duration::MAX),
            )),
            "delete" => Some(SourcePolicy::Delete),
            _ => None,
        }
    }

    /// Under `Shorten`, the expiry a source consolidated at `now` gets when
    /// that is sooner than its own (`expires_at`); `None` when it keeps its
    /// own.
    pub fn shortened(self, expires_at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let SourcePolicy::Shorten(at_most) = self else { return None };
        let cap = now.checked_add_signed(at_most)?;
        match expires_at {
            Some(own) if own <= cap => None,
            _ => Some(cap),
        }
    }
}

/// The metadata key by which an episode names the skill it used; with the
/// episode's `outcome` it moves the skill's counters once, when the episode
/// is consolidated.
pub const SKILL_KEY: &str = "skill";

/// What the episodes of a group report about one of the agent's skills.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillOutcomes {
    pub skill_name: String,
    pub successes: i32,
    pub failures: i32,
}

/// The outcomes a group's episodes report per skill, in the order the
/// skills first appear: an episode naming a skill (`metadata.skill`, a
/// string) counts one success or one failure; `partial`, `unknown` and no
/// outcome count nothing, as in the success rate itself.
pub fn skill_outcomes(group: &Group<'_>) -> Vec<SkillOutcomes> {
    let mut out: Vec<SkillOutcomes> = Vec::new();
    for m in &group.episodes {
        let Some(name) = m.metadata.get(SKILL_KEY).and_then(Value::as_str).map(str::trim) else { continue };
        let (s, f) = match m.outcome {
            Some(Outcome::Success) => (1, 0),
            Some(Outcome::Failure) => (0, 1),
            _ => continue,
        };
        if name.is_empty() {
            continue;
        }
        match out.iter_mut().find(|o| o.skill_name == name) {
            Some(o) => {
                o.successes += s;
                o.failures += f;
            }
            None => out.push(SkillOutcomes { skill_name: name.to_string(), successes: s, failures: f }),
        }
    }
    out
}

/// The facts of a slot family (one subject and predicate) that a new fact
/// nearly repeats: those whose object's vector is at least `threshold`
/// cosine to the new object's. The contradiction rule then
/// keeps one of them, the more trusted and confident (`domain::facts`).
pub fn near_duplicates(object: &[f32], others: &[(Uuid, Vec<f32>)], threshold: f64) -> Vec<Uuid> {
    others
        .iter()
        .filter(|(_, v)| v.len() == object.len() && cosine(object, v) >= threshold)
        .map(|(id, _)| *id)
        .collect()
}

/// The cosine of two vectors (0 when either is all zeros).
fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let n = norm(a) * norm(b);
    if n > 0.0 { dot / n } else { 0.0 }
}

/// Where a consolidation job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Waiting for a worker (or for another run of the agent to end).
    Queued,
    Running,
    Completed,
    /// Stopped by an error; `error` says which. Nothing of a failed group
    /// was written, and its episodes wait for the next run.
    Failed,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Completed => "completed",
            JobState::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<JobState> {
        [JobState::Queued, JobState::Running, JobState::Completed, JobState::Failed]
            .into_iter()
            .find(|j| j.as_str() == s)
    }
}

/// What a job produced.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct JobReport {
    /// Episodes consolidated (each is consolidated once).
    pub episodes: u64,
    /// Summaries written.
    pub summaries: u64,
    /// Facts written as new current facts.
    pub facts: u64,
    /// Facts the agent already held (same content): nothing new written.
    pub facts_deduplicated: u64,
    /// Facts kept as candidates behind a current fact they contradict or
    /// nearly repeat.
    pub facts_candidates: u64,
    /// Skills whose success and failure counts moved by the outcomes their
    /// episodes reported (`metadata.skill`).
    pub skills_updated: u64,
    /// Episodes deleted once a summary covered them (`consolidation.sources = "delete"`).
    pub episodes_deleted: u64,
    /// Episodes whose retention was cut once a summary covered them
    /// (`consolidation.sources = "shorten"`).
    pub episodes_shortened: u64,
    /// Groups the model's answers for stayed unusable after the retries:
    /// their episodes wait for a later run while the run goes on with the
    /// other groups (the job then ends `failed`, with what it wrote kept).
    pub groups_failed: u64,
    /// The summaries and facts written, by id.
    pub memory_ids: Vec<Uuid>,
}

/// A consolidation of one agent: asked for through the API, or made by the
/// schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub id: Uuid,
    pub tenant: String,
    pub agent_id: String,
    pub state: JobState,
    /// The key id that asked for it; `schedule` for the scheduled passes.
    pub requested_by: String,
    pub requested_at: DateTime<Utc>,
    /// Episodes ingested at or before this instant are taken.
    pub cutoff: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub report: JobReport,
    pub error: Option<String>,
}

/// The actor of scheduled jobs.
pub const SCHEDULE_ACTOR: &str = "schedule";

#[cfg(test)]
mod tests {
    use super::*;

    fn episode(user: Option<&str>, session: Option<&str>, at: i64, content: &str) -> Memory {
        let t = DateTime::from_timestamp(1_780_000_000 + at, 0).unwrap();
        serde_json::from_value(json!({
            "id": Uuid::now_v7(), "tier": "episodic", "agent_id": "a", "user_id": user, "session_id": session,
            "content": content, "importance": 0.5, "retention": "medium_term", "metadata": {}, "private": false,
            "occurred_at": t, "created_at": t, "updated_at": t, "expires_at": null, "access_count": 0,
            "last_accessed_at": null, "embedding_model": null,
        }))
        .unwrap()
    }

    #[test]
    fn groups_never_mix_users_or_sessions_and_keep_their_size() {
        let eps = vec![
            episode(Some("ann"), Some("s1"), 1, "one"),
            episode(Some("bob"), Some("s1"), 2, "two"),
            episode(Some("ann"), Some("s1"), 3, "three"),
            episode(Some("ann"), Some("s2"), 4, "four"),
            episode(Some("ann"), Some("s1"), 5, "five"),
            episode(None, None, 6, "six"),
        ];
        let gs = groups(&eps, 2);
        let shape: Vec<(Option<&str>, Option<&str>, Vec<&str>)> = gs
            .iter()
            .map(|g| (g.user_id, g.session_id, g.episodes.iter().map(|m| m.content.as_str()).collect()))
            .collect();
        assert_eq!(
            shape,
            vec![
                (Some("ann"), Some("s1"), vec!["one", "three"]),
                (Some("ann"), Some("s1"), vec!["five"]),
                (Some("bob"), Some("s1"), vec!["two"]),
                (Some("ann"), Some("s2"), vec!["four"]),
                (None, None, vec!["six"]),
            ]
        );
    }

    #[test]
    fn a_summary_names_its_sources_and_takes_their_privacy_and_longest_retention() {
        let mut eps = vec![
            episode(Some("ann"), Some("s1"), 1, "We decided to move the launch to Friday."),
            episode(Some("ann"), Some("s1"), 2, "The deploy failed with a timeout."),
        ];
        eps[1].private = true;
        eps[1].retention = Retention::LongTerm;
        let job = Uuid::now_v7();
        let gs = groups(&eps, 20);
        let d = summary_draft("a", &gs[0], 5, job).unwrap();
        assert!(d.private);
        assert_eq!(d.retention, Some(Retention::LongTerm));
        assert_eq!(d.user_id.as_deref(), Some("ann"));
        assert_eq!(d.metadata[METADATA_KEY]["method"], METHOD_EXTRACTIVE);
        assert_eq!(d.metadata[METADATA_KEY]["source_episode_ids"], json!([eps[0].id, eps[1].id]));
        // Every sentence of the summary is one of its episodes'.
        for s in extract::sentences(&d.content) {
            assert!(eps.iter().any(|e| e.content.contains(s.trim())), "{s}");
        }
        // One episode alone is not summarised.
        let one = groups(&eps[..1], 20);
        assert_eq!(summary_draft("a", &one[0], 5, job), None);
    }

    #[test]
    fn facts_are_the_users_with_objects_from_the_source() {
        let ep = episode(Some("ann"), None, 1, "I work as a nurse and I'm allergic to peanuts.");
        let drafts = fact_drafts("a", &ep, Uuid::now_v7());
        assert!(!drafts.is_empty(), "{drafts:?}");
        for d in &drafts {
            assert_eq!(d.subject.as_deref(), Some("ann"));
            assert_eq!(d.source_episode_id, Some(ep.id));
            assert!(ep.content.contains(d.object.as_deref().unwrap()), "{d:?}");
            assert_eq!(d.metadata[METADATA_KEY]["method"], METHOD_RULES);
        }
        let anonymous = episode(None, None, 1, "I'm allergic to peanuts.");
        let d = fact_drafts("a", &anonymous, Uuid::now_v7());
        assert_eq!(d[0].subject.as_deref(), Some("user"));
    }

    #[test]
    fn model_answers_are_checked_against_the_group() {
        let answer = json!({"facts": [
            {"episode": 1, "predicate": "Lives_In", "object": " Lisbon ", "confidence": 80},
            {"episode": 1, "predicate": "lives_in", "object": "Lisbon", "confidence": 80},
            {"episode": 2, "predicate": "x", "object": "y", "confidence": 50},
            {"episode": 0, "predicate": "lives in", "object": "y", "confidence": 50},
            {"episode": 0, "predicate": "x", "object": "", "confidence": 50},
            {"episode": 0, "predicate": "x", "object": "y", "confidence": 150},
            {"episode": 0, "predicate": "1x", "object": "y", "confidence": 0.5},
        ]});
        let (facts, rejected) = parse_facts(&answer, 2).unwrap();
        let lisbon = ModelFact { episode: 1, predicate: "lives_in".into(), object: "Lisbon".into(), confidence: 0.8 };
        assert_eq!((facts, rejected), (vec![lisbon], 5));
        assert!(parse_facts(&json!({"fact": []}), 2).is_err());
        assert_eq!(parse_summary(&json!({"summary": " Ann moved. "})).unwrap(), "Ann moved.");
        assert!(parse_summary(&json!({"summary": ""})).is_err());
        assert!(parse_summary(&json!({"text": "x"})).is_err());
    }

    #[test]
    fn a_group_reports_each_skills_successes_and_failures() {
        let mut eps = vec![
            episode(None, Some("s"), 1, "a"),
            episode(None, Some("s"), 2, "b"),
            episode(None, Some("s"), 3, "c"),
            episode(None, Some("s"), 4, "d"),
            episode(None, Some("s"), 5, "e"),
        ];
        let uses =
            [("book", Some(Outcome::Success)), ("book", Some(Outcome::Failure)), ("book", Some(Outcome::Partial))];
        for (e, (skill, outcome)) in eps.iter_mut().zip(uses) {
            e.metadata.insert(SKILL_KEY.into(), json!(skill));
            e.outcome = outcome;
        }
        // Not a string, and an outcome without a skill: nothing.
        eps[3].metadata.insert(SKILL_KEY.into(), json!(7));
        eps[3].outcome = Some(Outcome::Success);
        eps[4].outcome = Some(Outcome::Success);
        let gs = groups(&eps, 20);
        assert_eq!(
            skill_outcomes(&gs[0]),
            vec![SkillOutcomes { skill_name: "book".into(), successes: 1, failures: 1 }]
        );
    }

    #[test]
    fn shorten_only_ever_brings_an_expiry_closer() {
        let now = DateTime::from_timestamp(1_780_000_000, 0).unwrap();
        let p = SourcePolicy::parse("shorten", 3600).unwrap();
        let hour = chrono::Duration::hours(1);
        assert_eq!(p.shortened(None, now), Some(now + hour));
        assert_eq!(p.shortened(Some(now + hour * 5), now), Some(now + hour));
        assert_eq!(p.shortened(Some(now + chrono::Duration::minutes(5)), now), None);
        assert_eq!(SourcePolicy::Keep.shortened(None, now), None);
        assert_eq!(SourcePolicy::parse("drop", 1), None);
        assert_eq!(SourcePolicy::parse("delete", 1), Some(SourcePolicy::Delete));
        // Longer than time can hold: no cut.
        let forever = SourcePolicy::parse("shorten", u64::MAX).unwrap();
        assert_eq!(forever.shortened(None, now), None);
    }

    #[test]
    fn near_duplicates_are_those_at_or_over_the_threshold() {
        let (a, b, c) = (Uuid::from_u128(1), Uuid::from_u128(2), Uuid::from_u128(3));
        let others = vec![(a, vec![1.0, 0.0]), (b, vec![0.6, 0.8]), (c, vec![1.0, 0.0, 0.0])];
        // Unnormalised input reads the same; a vector of another length never matches.
        assert_eq!(near_duplicates(&[2.0, 0.0], &others, 0.9), vec![a]);
        assert_eq!(near_duplicates(&[1.0, 0.0], &others, 0.6), vec![a, b]);
        assert_eq!(near_duplicates(&[0.0, 0.0], &others, 0.5), Vec::<Uuid>::new());
    }

    #[test]
    fn job_states_round_trip() {
        for s in ["queued", "running", "completed", "failed"] {
            assert_eq!(JobState::parse(s).unwrap().as_str(), s);
        }
        assert_eq!(JobState::parse("done"), None);
    }
}
