-- engram schema for the embedded SQLite backend, first version.
--
-- This directory is applied by the SQLite migrator only. The Postgres
-- migrator (`sqlx::migrate!("./migrations")`) reads files directly inside
-- migrations/ and skips subdirectories, so it never sees these.
--
-- Decisions that hold for every table:
--   * tenant_id comes first in every unique key and index, and every query
--     filters on it: two tenants never see or touch each other's rows.
--   * Timestamps are integers: microseconds since the Unix epoch, UTC. That
--     is the precision Postgres keeps, integers compare and sort exactly
--     (text timestamps with a variable number of fraction digits do not),
--     and keyset pagination on (created_at, id) stays an index range scan.
--   * Ids are 16-byte blobs (sqlx's encoding of a uuid): compared bytewise,
--     which is how Postgres orders uuids, so keyset order is the same.
--   * JSON (metadata, policy, tool_sequence) is text checked with json_valid.
--   * Booleans are integers 0/1, as SQLite has no boolean type.
--   * `expires_at` is created_at plus the retention's duration (NULL =
--     permanent). Rows past expires_at are treated as gone by every read,
--     before any sweep deletes them.

-- One table for the three persistent tiers, with a tier column, instead of
-- Postgres's three tables: SQLite has no partitions to gain from a split,
-- reads by id and listings over several tiers become one indexed query
-- instead of a UNION, and one full-text index covers every tier. Fields of
-- one tier only are NULL on the others; the CHECKs below keep each tier's
-- required fields present.
create table memories (
    -- The rowid (an alias of it, so no extra index): the key of the
    -- full-text index, which can only point at integer rowids.
    seq               integer primary key,
    id                blob    not null check (length(id) = 16),
    tenant_id         text    not null,
    tier              text    not null check (tier in ('episodic', 'semantic', 'procedural')),
    agent_id          text    not null,
    user_id           text,
    session_id        text,
    content           text    not null,
    content_hash      text    not null,
    importance        real    not null check (importance >= 0 and importance <= 1),
    retention         text    not null
                      check (retention in ('transient', 'session', 'short_term', 'medium_term', 'long_term', 'permanent')),
    private           integer not null default 0 check (private in (0, 1)),
    metadata          text    not null default '{}' check (json_valid(metadata) and json_type(metadata) = 'object'),
    occurred_at       integer not null,
    created_at        integer not null,
    updated_at        integer not null,
    expires_at        integer,
    access_count      integer not null default 0,
    last_accessed_at  integer,
    -- Little-endian f32s, as given (not normalised): the vector index
    -- normalises its own copy, and reads return what was written.
    embedding         blob,
    embedding_model   text,

    -- Episodic.
    event_type        text    check (event_type in ('conversation', 'action', 'observation', 'outcome')),
    outcome           text    check (outcome in ('success', 'failure', 'partial', 'unknown')),

    -- Semantic.
    namespace         text,
    subject           text,
    predicate         text,
    object            text,
    confidence        real    check (confidence >= 0 and confidence <= 1),
    source_episode_id blob,
    supersedes        blob,
    valid_from        integer,
    valid_until       integer,

    -- Procedural.
    skill_name        text,
    trigger_pattern   text,
    policy            text    check (policy is null or json_valid(policy)),
    tool_sequence     text    check (tool_sequence is null or json_valid(tool_sequence)),
    success_count     integer,
    failure_count     integer,
    -- Generated, as in Postgres, so that no writer can let it drift from the
    -- counters. The division runs in double precision like Postgres's
    -- real / integer; readers round it to f32 as Postgres rounds into real.
    success_rate      real generated always as (
                          case when tier = 'procedural' then
                              case when success_count + failure_count = 0 then 0.0
                                   else cast(success_count as real) / (success_count + failure_count) end
                          end
                      ) virtual,
    reward_count      integer,
    avg_reward        real,
    version           integer,

    -- A vector always says which model made it.
    check ((embedding is null) = (embedding_model is null)),
    check (embedding is null or length(embedding) % 4 = 0),
    check (tier <> 'episodic' or event_type is not null),
    check (tier <> 'semantic' or (namespace is not null and confidence is not null and valid_from is not null)),
    check (tier <> 'procedural' or (skill_name is not null and success_count is not null
        and failure_count is not null and reward_count is not null and avg_reward is not null and version is not null))
);

-- Lookup by id (get, update, delete, history). Unique per tenant: uuids do
-- not collide, and the key never lets one tenant's id reach another's row.
create unique index memories_tenant_id on memories (tenant_id, id);
-- Listing and "recent memories of this agent": keyset order (created_at, id).
create index memories_tenant_agent_created on memories (tenant_id, agent_id, created_at desc, id desc);
-- Listing a whole tenant.
create index memories_tenant_created on memories (tenant_id, created_at desc, id desc);
-- Session continuity: the last memories of one session.
create index memories_tenant_agent_session on memories (tenant_id, agent_id, session_id, created_at desc)
    where session_id is not null;
-- Per-user scope (listing by user, erasure).
create index memories_tenant_user on memories (tenant_id, user_id) where user_id is not null;

-- Write-time dedup among valid facts only: re-asserting a superseded fact
-- creates a new row that supersedes its successor (as in Postgres).
create unique index memories_semantic_dedup on memories (tenant_id, agent_id, namespace, content_hash)
    where tier = 'semantic' and valid_until is null;
-- Contradiction lookup: the valid facts about a (subject, predicate).
create index memories_semantic_subject_predicate on memories (tenant_id, agent_id, namespace, subject, predicate)
    where tier = 'semantic' and valid_until is null;
-- Walking a supersede chain forwards.
create index memories_semantic_supersedes on memories (tenant_id, supersedes) where supersedes is not null;
-- One skill per (tenant, agent, skill_name): the key of the procedural upsert.
create unique index memories_procedural_skill on memories (tenant_id, agent_id, skill_name)
    where tier = 'procedural';

-- The full-text leg. Contentless (the text already lives in `memories`, no
-- second copy) with contentless_delete so rows can be deleted and replaced
-- by rowid. `porter unicode61`: Unicode word splitting and case folding, then
-- English stemming, the nearest FTS5 has to Postgres's 'english' config
-- (stop words are dropped from queries by the Rust side instead).
--
-- `scope` holds one token per row: hex(tenant_id, agent_id, tier joined by
-- U+001F), the same for every row a search may return. A search matches
-- `scope : "<its token>" AND body : (<words>)`, so the index itself narrows
-- to the tenant's agent and tier and a common word in other tenants' or
-- tiers' rows costs nothing. The searches give the column weight 0 in bm25.
-- (The join to `memories` re-checks tenant, agent and tier, so even a
-- collision of tokens could never leak a row.)
create virtual table memory_fts using fts5(
    body,
    scope,
    content = '',
    contentless_delete = 1,
    tokenize = 'porter unicode61'
);

-- Kept in sync by triggers, so the index changes in the same transaction as
-- the row whatever statement changed it. The indexed text is what Postgres's
-- search_tsv is generated from: the content, and for a skill its name and
-- trigger pattern too. Tenant, agent and tier never change after insert.
create trigger memories_fts_insert after insert on memories begin
    insert into memory_fts (rowid, body, scope) values (
        new.seq,
        case when new.tier = 'procedural'
             then new.skill_name || ' ' || new.content || ' ' || coalesce(new.trigger_pattern, '')
             else new.content end,
        hex(new.tenant_id || char(31) || new.agent_id || char(31) || new.tier)
    );
end;

create trigger memories_fts_delete after delete on memories begin
    delete from memory_fts where rowid = old.seq;
end;

create trigger memories_fts_update after update of content, skill_name, trigger_pattern on memories begin
    delete from memory_fts where rowid = old.seq;
    insert into memory_fts (rowid, body, scope) values (
        new.seq,
        case when new.tier = 'procedural'
             then new.skill_name || ' ' || new.content || ' ' || coalesce(new.trigger_pattern, '')
             else new.content end,
        hex(new.tenant_id || char(31) || new.agent_id || char(31) || new.tier)
    );
end;

-- Idempotency keys: the first response to a (tenant, key), remembered with
-- the hash of its request body. Written in the same transaction as the
-- memories, so a replay can never disagree with what was stored. Status 0
-- marks a key claimed by a write still in its transaction.
create table idempotency_keys (
    tenant_id    text    not null,
    key          text    not null,
    request_hash text    not null,
    status       integer not null,
    response     text    not null check (json_valid(response)),
    created_at   integer not null,
    updated_at   integer not null,
    primary key (tenant_id, key)
) without rowid;
create index idempotency_tenant_created on idempotency_keys (tenant_id, created_at);

-- Working memory: per (tenant, agent, session) entries with a deadline, in a
-- table rather than in process memory so that an acknowledged write survives
-- a crash. `seq` is the append order; `entry` is the memory as JSON (what the
-- Redis backend stores); `expires_at` is a wall-clock deadline in
-- microseconds (NULL = none), checked by every read.
create table working_memory (
    seq        integer primary key,
    tenant_id  text    not null,
    id         blob    not null check (length(id) = 16),
    agent_id   text    not null,
    -- '' when the entry has no session, as in the Redis key.
    session_id text    not null,
    entry      text    not null check (json_valid(entry)),
    expires_at integer,
    created_at integer not null,
    updated_at integer not null
);
create unique index working_tenant_id on working_memory (tenant_id, id);
-- A session's entries in append order.
create index working_tenant_session on working_memory (tenant_id, agent_id, session_id, seq);
