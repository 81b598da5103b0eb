"""engram beside mem0 on the same rows and the same queries, in one run.

A measuring program, not a test: it prints tables and checks only that both
systems hold what was written. `scripts/bench-mem0.sh` starts a release
engram on a database of its own, makes mem0's virtualenv, and runs this with
that virtualenv's Python:

    python bench/mem0_side_by_side.py --data conversations-dev.json \
        --engram-url http://127.0.0.1:PORT --engram-bin engram \
        --engram-database-url postgres://... --redis-url redis://... \
        --mem0-database-url postgresql://... \
        --embeddings-url http://127.0.0.1:54330/v1 --embeddings-model NAME \
        [--agents-memories 3k,100k] [--queries N] [--top-k 10,50] [--conversations conv-26]

Rows. Every turn of the LoCoMo conversations chosen (default all five, 2,760
turns: the "3K memories per agent" case), all in ONE agent and one user of
each system. A turn's text is built as benches/locomo.rs builds it ("Speaker:
text", plus " [shares CAPTION]" when the turn has a `blip_caption`); engram
also gets the session's date as `occurred_at`, as there. Turn ids repeat
across conversations, so each memory's `metadata.dia_id` is the turn id
prefixed with its conversation ("conv-26/D1:3"). engram gets them through
its HTTP API in batches of 100 (it embeds them); mem0 through its own
`Memory.add(text, user_id=, agent_id=, metadata=, infer=False)`, one call per
turn (it embeds them). Both embed with the same OpenAI-compatible server and
model, so both store the same vectors; the program checks that it is so.

The 100K case. Padding rows are splices of two random turns: the first
turn's speaker and the start of its words, then the end of another turn's
words; no padding row carries a dia_id, so one ranked above the evidence is a
miss for either system. Their vectors are embedded by the same server when
that would take at most --embed-budget-min minutes at the rate measured on
the first 128 of them; otherwise they are derived as bench/RESULTS.md's 1M
benchmark derived its own (`benches/recall/load.rs`, synthetic_vector): the
two turns' real vectors mixed 1 : 0.5, plus uniform noise in ±0.035 per
dimension, normalised. The output says which. The padding is bulk-loaded into
both, with the same vectors: into engram with `engram import` (its own
import path, vectors included), into mem0 by running its own `add(...,
infer=False)` with the embedder answering from the precomputed vectors and
the vector store's insert captured, then COPYing the captured rows (id,
vector, payload exactly as mem0 built them) into its table; its indexes are
dropped first and rebuilt after with mem0's own create_col(). mem0's
history log (SQLite, never read by search) is not written for them.

Queries. Every question of categories 1-4 with at least one evidence turn
(category 5, adversarial, is left out, as in benches/locomo.rs), in file
order; `--queries N` takes N spread evenly over them. Each is asked once per
top_k (default 10, then 50) of each system, sequentially (concurrency 1),
after a warm-up of 20 queries (category-5 questions, which are not
measured). engram: agent_id, user_id, query, top_k, nothing else (its
defaults). mem0: `search(query, top_k=, filters={user_id, agent_id})`, its
defaults (threshold 0.1, no reranker). mem0 is as `pip install mem0ai` installs
it, without its `nlp` extra: spaCy's English model is not on PyPI, and
without it mem0 neither lemmatises nor drops stop words for its BM25 leg
(which then needs every word of the question in a memory, so it rarely
matches) and extracts no entities to boost; the report says how often the
BM25 leg matched.

What is measured, per system and top_k:
- recall@10 (and @k): the share of a question's evidence turns among the
  first 10 (k) results, averaged over questions, as benches/locomo.rs counts.
- end-to-end search latency: engram from the client (send to last body
  byte, HTTP on loopback); mem0 the whole in-process `Memory.search()` call,
  its query embedding included.
- latency without the embedding. engram: end-to-end minus the server's own
  `timings.embedding_ms` of that search (on Postgres both legs wait for the
  query vector, so the embedding is on the critical path and nothing else
  overlaps it; HTTP stays in). mem0: `Memory.search()` with its embedder
  answering from the query's vector, fetched just before with the very
  request mem0's embedder sends (its BM25 leg, scoring and formatting stay
  in; the program checks that mem0's own vector is the same); and, alone, its
  vector store's `search()` with that vector and the candidate count mem0
  asks it for (max(4 top_k, 60)). These come before mem0's end-to-end
  search of the same question, so that they, like engram's figure, are the
  first touch of the query's rows.

The same run also reports how long the writes took on each side, the mean
number of results, whether mem0's two searches of a question ranked alike
(they should), how often mem0's BM25 leg matched at all, and the plan of
mem0's vector statement (whether its HNSW index is used).
"""

from __future__ import annotations

import argparse
import atexit
import datetime as dt
import http.client
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid

# No telemetry from mem0: it reads this when it is imported.
os.environ["MEM0_TELEMETRY"] = "False"

import numpy as np  # noqa: E402  (mem0's dependencies bring NumPy)
import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

TUNING = ("conv-26", "conv-30", "conv-41")
BATCH = 100
WARMUP = 20
DIMENSIONS = 384
# mem0's own table (collection) name: its default.
MEM0_COLLECTION = "mem0"
AGENT = "locomo-all"
USER = "locomo-all"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- Loading (as benches/locomo.rs) ------------------------------------------------------


def session_date(s: str) -> dt.datetime:
    """"1:56 pm on 8 May, 2023" as UTC."""
    return dt.datetime.strptime(s.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=dt.timezone.utc)


def normalise_evidence(raw, known):
    out = []
    for s in raw or []:
        if not isinstance(s, str):
            continue
        for piece in s.replace(";", " ").split():
            ident = "D" + piece[2:] if piece.startswith("D:") else piece
            if ident in known and ident not in out:
                out.append(ident)
    return out


class Turn:
    __slots__ = ("dia_id", "speaker", "words", "content", "occurred_at")

    def __init__(self, dia_id, speaker, text, content, occurred_at):
        self.dia_id = dia_id
        self.speaker = speaker
        self.words = text.split()
        self.content = content
        self.occurred_at = occurred_at


def load(path, only):
    with open(path, encoding="utf-8") as f:
        samples = json.load(f)
    turns, questions, warmup, skipped = [], [], [], 0
    found = set()
    for sample in samples:
        sid = sample["sample_id"]
        if only and sid not in only:
            continue
        found.add(sid)
        conv = sample["conversation"]
        sessions = sorted(
            (int(k[len("session_"):]), v)
            for k, v in conv.items()
            if k.startswith("session_") and k[len("session_"):].isdigit() and isinstance(v, list)
        )
        known = set()
        for n, session in sessions:
            date = session_date(conv[f"session_{n}_date_time"])
            for t in session:
                content = f"{t['speaker']}: {t['text']}"
                if t.get("blip_caption") is not None:
                    content += f" [shares {t['blip_caption']}]"
                if t["dia_id"] in known:
                    raise SystemExit(f"{sid}: dia_id {t['dia_id']} appears twice")
                known.add(t["dia_id"])
                turns.append(Turn(f"{sid}/{t['dia_id']}", t["speaker"], t["text"], content, date))
        for qa in sample["qa"]:
            category = qa.get("category")
            text = (qa.get("question") or "").strip()
            if category == 5:
                if text:
                    warmup.append(text)
                continue
            if category not in (1, 2, 3, 4):
                continue
            evidence = normalise_evidence(qa.get("evidence"), known)
            if not evidence or not text:
                skipped += 1
                continue
            questions.append({"sample_id": sid, "category": category, "text": qa["question"],
                              "evidence": [f"{sid}/{e}" for e in evidence]})
    missing = [c for c in only if c not in found]
    if missing:
        raise SystemExit(f"--conversations: {', '.join(missing)} not in {path}")
    return turns, questions, warmup, skipped


def spread(items, n):
    """n items spread evenly over the list, in order (all when n is None or larger)."""
    if n is None or n >= len(items):
        return list(items)
    return [items[(i * len(items)) // n] for i in range(n)]


# --- Small helpers -----------------------------------------------------------------------


def percentile(values, p):
    """Nearest rank, as benches/locomo.rs."""
    if not values:
        return float("nan")
    s = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(s)))
    return s[min(rank, len(s)) - 1]


def pcts(values):
    return " / ".join(f"{percentile(values, p):.1f}" for p in (50, 95, 99))


def recall_at(evidence, ranked, k):
    top = {d for d in ranked[:k] if d}
    return sum(1 for e in evidence if e in top) / len(evidence)


def vec_text(v):
    # Nine significant digits round-trip a float32: both systems get the same float4s.
    return "[" + ",".join(f"{x:.9g}" for x in v) + "]"


def parse_vec(text):
    return np.array([float(x) for x in text.strip("[]").split(",")], dtype=np.float32)


def unit(v):
    v = np.asarray(v, dtype=np.float32)
    return v / max(float(np.linalg.norm(v)), np.finfo(np.float32).tiny)


class Embeddings:
    """The OpenAI-compatible server both systems embed with (for the padding only)."""

    def __init__(self, url, model):
        self.url = url.rstrip("/") + "/embeddings"
        self.model = model

    def raw(self, texts, **extra):
        body = json.dumps({"model": self.model, "input": texts, "encoding_format": "float", **extra}).encode()
        req = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            data = json.load(r)["data"]
        return [d["embedding"] for d in sorted(data, key=lambda d: d["index"])]

    def embed(self, texts):
        return [unit(v) for v in self.raw(texts)]

    def as_mem0(self, text):
        """The vector mem0's OpenAI embedder gets for a query: the same request it sends."""
        return self.raw([text.replace("\n", " ")], dimensions=DIMENSIONS)[0]


# --- engram ------------------------------------------------------------------------------


class Engram:
    def __init__(self, url):
        u = urllib.parse.urlsplit(url)
        # One kept-alive connection, as a client library would hold.
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)

    def post(self, path, body):
        payload = json.dumps(body).encode()
        for attempt in (0, 1):
            t0 = time.perf_counter()
            try:
                self.conn.request("POST", path, body=payload, headers={"Content-Type": "application/json"})
                r = self.conn.getresponse()
                data = r.read()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # The server closes a connection idle for longer than its keep-alive
                # timeout (the mem0 phases are long); such a request was never read.
                self.conn.close()
                if attempt:
                    raise
        elapsed = (time.perf_counter() - t0) * 1e3
        if r.status // 100 != 2:
            raise SystemExit(f"engram: POST {path} answered {r.status}: {data[:500]!r}")
        return json.loads(data), elapsed

    def write(self, turns):
        started = time.perf_counter()
        for i in range(0, len(turns), BATCH):
            chunk = turns[i:i + BATCH]
            memories = [{"agent_id": AGENT, "user_id": USER, "tier": "episodic", "content": t.content,
                         "occurred_at": t.occurred_at.isoformat(), "metadata": {"dia_id": t.dia_id}}
                        for t in chunk]
            answer, _ = self.post("/v1/memories", {"memories": memories})
            if len(answer.get("memories", [])) != len(chunk):
                raise SystemExit(f"engram: sent {len(chunk)} memories, it answered {len(answer.get('memories', []))}")
            if (i // BATCH) % 5 == 4 or i + BATCH >= len(turns):
                log(f"  engram: {min(i + BATCH, len(turns))}/{len(turns)} written "
                    f"({time.perf_counter() - started:.0f} s)")
        return time.perf_counter() - started

    def search(self, query, top_k):
        answer, ms = self.post("/v1/memories/search",
                               {"agent_id": AGENT, "user_id": USER, "query": query, "top_k": top_k})
        ranked = [(r.get("memory", {}).get("metadata") or {}).get("dia_id") for r in answer["results"]]
        return ranked, ms, answer.get("timings", {})


def engram_env(args):
    env = {k: v for k, v in os.environ.items() if k not in ("ENGRAM_CONFIG", "ENGRAM_API_KEYS")}
    env.update(DATABASE_URL=args.engram_database_url, REDIS_URL=args.redis_url,
               ENGRAM_REDIS__KEY_PREFIX=args.redis_key_prefix, RUST_LOG="warn")
    return env


def engram_export(args):
    """engram's own rows of the tenant, vectors included (`engram export --vectors`)."""
    out = subprocess.run([args.engram_bin, "export", "--tenant", args.tenant, "--vectors"], env=engram_env(args),
                         check=True, capture_output=True, text=True).stdout
    return [r for r in map(json.loads, out.splitlines()) if r.get("kind") == "memory"]


def engram_import(args, template, pads, vectors):
    """The padding rows through `engram import -`, vectors included, in engram's export format."""
    now = dt.datetime.now(dt.timezone.utc).isoformat()
    proc = subprocess.Popen([args.engram_bin, "import", "-"], env=engram_env(args), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    header = {"kind": "header", "format": "engram-export", "version": 1, "tenant": args.tenant,
              "exported_at": now, "vectors": True}
    proc.stdin.write(json.dumps(header) + "\n")
    keep = {k: v for k, v in template.items() if k not in ("content_hash", "consolidated_at", "vector")}
    for (text, occurred_at), v in zip(pads, vectors):
        rec = dict(keep)
        rec.update(id=str(uuid.uuid4()), content=text, metadata={}, occurred_at=occurred_at.isoformat(),
                   created_at=now, updated_at=now, access_count=0, last_accessed_at=None)
        line = json.dumps(rec)
        # The vector as text of its own: nine significant digits, as mem0's rows get.
        proc.stdin.write(line[:-1] + ', "vector": ' + vec_text(v) + "}\n")
    counts = {"working": 0, "episodic": len(pads), "semantic": 0, "procedural": 0}
    proc.stdin.write(json.dumps({"kind": "end", "counts": counts}) + "\n")
    proc.stdin.close()
    out = proc.stdout.read()
    if proc.wait() != 0:
        raise SystemExit(f"engram import failed:\n{out}")
    log("  engram import:\n" + "\n".join("    " + line for line in out.strip().splitlines()))


# --- mem0 --------------------------------------------------------------------------------


class QueryVectors:
    """Wraps mem0's embedder: times each call, keeps each query's vector, and
    answers from them when replaying (the search without the embedding), or
    from precomputed vectors of texts being bulk-loaded."""

    def __init__(self, embedder):
        self.inner = embedder.embed
        self.cache = {}
        self.replay = False
        self.preset = None
        self.last_ms = 0.0
        self.calls = 0

    def embed(self, text, memory_action=None):
        if self.preset is not None:
            return self.preset[text]
        if self.replay and memory_action == "search" and text in self.cache:
            self.last_ms = 0.0
            return self.cache[text]
        t0 = time.perf_counter()
        v = self.inner(text, memory_action)
        self.last_ms = (time.perf_counter() - t0) * 1e3
        self.calls += 1
        if memory_action == "search":
            self.cache[text] = v
        return v


def no_llm(*_args, **_kwargs):
    raise RuntimeError("mem0 called its LLM: every add here is infer=False and search uses none")


def make_mem0(args, home):
    from mem0 import Memory

    config = {
        "vector_store": {"provider": "pgvector", "config": {
            "connection_string": args.mem0_database_url, "collection_name": MEM0_COLLECTION,
            "embedding_model_dims": DIMENSIONS}},
        "embedder": {"provider": "openai", "config": {
            "model": args.embeddings_model, "openai_base_url": args.embeddings_url, "api_key": "unused",
            "embedding_dims": DIMENSIONS}},
        # mem0 builds an LLM client whether or not it is used; this one points at a closed
        # port on loopback, and generate_response is replaced below, so a call would fail
        # loudly rather than reach anything.
        "llm": {"provider": "openai", "config": {
            "model": "none", "api_key": "unused", "openai_base_url": "http://127.0.0.1:9/v1"}},
        "history_db_path": os.path.join(home, "history.db"),
    }
    memory = Memory.from_config(config)
    memory.llm.generate_response = no_llm
    vectors = QueryVectors(memory.embedding_model)
    memory.embedding_model.embed = vectors.embed
    return memory, vectors


def mem0_write(memory, turns):
    started = time.perf_counter()
    for i, t in enumerate(turns):
        memory.add(t.content, user_id=USER, agent_id=AGENT, metadata={"dia_id": t.dia_id}, infer=False)
        if (i + 1) % 500 == 0 or i + 1 == len(turns):
            log(f"  mem0: {i + 1}/{len(turns)} added ({time.perf_counter() - started:.0f} s)")
    return time.perf_counter() - started


def mem0_vectors(args):
    """mem0's stored vectors of the LoCoMo turns, by dia_id."""
    with psycopg.connect(args.mem0_database_url) as conn:
        rows = conn.execute(sql.SQL("SELECT payload->>'dia_id', vector::text FROM {} WHERE payload ? 'dia_id'")
                            .format(sql.Identifier(MEM0_COLLECTION))).fetchall()
    return {d: parse_vec(v) for d, v in rows}


def mem0_plan(args, vector, limit):
    """The scans of the statement mem0's pgvector search() runs (its text, one scope filter per id)."""
    query = sql.SQL("EXPLAIN SELECT id, vector <=> %s::vector AS distance, payload FROM {} "
                    "WHERE payload->>%s = %s AND payload->>%s = %s ORDER BY distance LIMIT %s"
                    ).format(sql.Identifier(MEM0_COLLECTION))
    with psycopg.connect(args.mem0_database_url) as conn:
        rows = conn.execute(query, (vec_text(vector), "user_id", USER, "agent_id", AGENT, limit)).fetchall()
    scans = [r[0].strip().lstrip("-> ").split("  (")[0] for r in rows if "Scan" in r[0]]
    return "; ".join(scans) or rows[0][0]


def count_rows(url, query):
    with psycopg.connect(url) as conn:
        return conn.execute(query).fetchone()[0]


def mem0_bulk(memory, vectors, args, pads, vecs):
    """The padding through mem0's own add(): rows captured, then COPYed in."""
    captured = []
    store = memory.vector_store
    insert, add_history = store.insert, memory.db.add_history
    store.insert = lambda vectors, payloads=None, ids=None: captured.extend(zip(ids, vectors, payloads))
    memory.db.add_history = lambda *a, **k: None
    vectors.preset = {text: v for (text, _), v in zip(pads, vecs)}
    try:
        for text, _ in pads:
            memory.add(text, user_id=USER, agent_id=AGENT, infer=False)
    finally:
        store.insert, memory.db.add_history, vectors.preset = insert, add_history, None
    if len(captured) != len(pads):
        raise SystemExit(f"mem0: {len(pads)} padding rows added, {len(captured)} captured")
    table = sql.Identifier(MEM0_COLLECTION)
    with psycopg.connect(args.mem0_database_url) as conn:
        # Index builds after the load, as a bulk load would do; mem0's create_col() below
        # recreates them with its own statements.
        for suffix in ("hnsw_idx", "text_lemmatized_idx", "diskann_idx"):
            conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(f"{MEM0_COLLECTION}_{suffix}")))
        with conn.cursor() as cur:
            with cur.copy(sql.SQL("COPY {} (id, vector, payload) FROM STDIN").format(table)) as copy:
                for ident, v, payload in captured:
                    copy.write_row((ident, vec_text(v), json.dumps(payload)))
        conn.commit()
    t0 = time.perf_counter()
    store.create_col()
    log(f"  mem0: indexes rebuilt by its create_col() in {time.perf_counter() - t0:.0f} s")


# --- Padding -----------------------------------------------------------------------------


def padding(turns, n, seed):
    """n distinct splices of two turns: (text, occurred_at) and the two turns' indexes."""
    rng = random.Random(seed)
    existing = {t.content for t in turns}
    seen, pads, sources = set(), [], []
    while len(pads) < n:
        a, b = rng.randrange(len(turns)), rng.randrange(len(turns))
        ta, tb = turns[a], turns[b]
        if a == b or not ta.words or not tb.words:
            continue
        words = ta.words[:rng.randint(1, len(ta.words))] + tb.words[rng.randrange(len(tb.words)):]
        text = f"{ta.speaker}: {' '.join(words)}"
        if text in seen or text in existing:
            continue
        seen.add(text)
        pads.append((text, ta.occurred_at))
        sources.append((a, b))
    return pads, sources


def synthetic_vector(i, base_a, base_b, seed):
    """RESULTS.md's 1M benchmark (benches/recall/load.rs): a + 0.5 b + U(±0.035), normalised."""
    rng = np.random.default_rng([seed, i])
    v = base_a + 0.5 * base_b + rng.uniform(-0.035, 0.035, DIMENSIONS).astype(np.float32)
    return unit(v)


def pad_vectors(args, pads, sources, base, offset):
    """Embedded when that fits the budget at the measured rate, else synthetic. Returns (vectors, how)."""
    emb = Embeddings(args.embeddings_url, args.embeddings_model)
    if args.pad_vectors != "synthetic":
        sample = [p[0] for p in pads[:128]]
        t0 = time.perf_counter()
        vectors = []
        for i in range(0, len(sample), 64):
            vectors += emb.embed(sample[i:i + 64])
        rate = len(sample) / (time.perf_counter() - t0)
        projected = len(pads) / rate / 60
        log(f"  padding: the embedder did {rate:.1f} texts/s: {len(pads)} texts would take {projected:.0f} min")
        if args.pad_vectors == "embed" or projected <= args.embed_budget_min:
            started = time.perf_counter()
            for i in range(len(sample), len(pads), 64):
                vectors += emb.embed([p[0] for p in pads[i:i + 64]])
                if (i // 64) % 50 == 0:
                    log(f"  padding: {len(vectors)}/{len(pads)} embedded ({time.perf_counter() - started:.0f} s)")
            return vectors, (f"embedded by the same server ({rate:.1f} texts/s measured on 128; "
                             f"{projected:.0f} min projected)")
        how = (f"synthetic: embedding {len(pads)} texts at the measured {rate:.1f} texts/s would take "
               f"{projected:.0f} min (budget {args.embed_budget_min:g})")
    else:
        how = "synthetic (--pad-vectors synthetic)"
    vectors = [synthetic_vector(offset + i, base[a], base[b], args.seed) for i, (a, b) in enumerate(sources)]
    return vectors, how + "; each is its two turns' real vectors mixed 1 : 0.5, plus uniform noise ±0.035, normalised"


# --- Searching ---------------------------------------------------------------------------


def run_searches(engram, memory, vectors, emb, questions, warmup, top_k):
    from mem0.utils.lemmatization import lemmatize_for_bm25

    filters = {"user_id": USER, "agent_id": AGENT}
    # Warm-up on both sides with questions that are not measured (category 5).
    for q in warmup:
        engram.search(q, top_k)
        vectors.cache[q] = emb.as_mem0(q)
        vectors.replay = True
        memory.search(q, top_k=top_k, filters=filters)
        vectors.replay = False
        memory.vector_store.search(query=q, vectors=vectors.cache[q], top_k=max(top_k * 4, 60), filters=filters)
        memory.search(q, top_k=top_k, filters=filters)
    res = {k: [] for k in ("e_ranked", "e_ms", "e_emb", "e_total", "m_ranked", "m_ms", "m_emb", "m_replay_ms",
                           "m_store_ms", "m_store_n", "m_mismatch", "m_bm25", "m_vec_diff")}
    started = time.perf_counter()
    for i, q in enumerate(questions):
        text = q["text"]
        ranked, ms, timings = engram.search(text, top_k)
        res["e_ranked"].append(ranked)
        res["e_ms"].append(ms)
        res["e_emb"].append(timings.get("embedding_ms", float("nan")))
        res["e_total"].append(timings.get("total_ms", float("nan")))

        # mem0 without the embedding first, so that its figure is the first touch of this
        # query's rows, as engram's is: the query's vector (the request mem0's embedder
        # sends, on a connection of its own), then search() with the embedder answering
        # from it, then its vector store alone. Not through mem0's own client: a second
        # request on its kept-alive connection within some 40 ms of the previous answer
        # waits about 40 ms more (TCP delayed acknowledgement between the OpenAI client
        # and this embedding server), which would inflate the end-to-end figure below.
        vectors.cache[text] = emb.as_mem0(text)
        vectors.replay = True
        t0 = time.perf_counter()
        bare = memory.search(text, top_k=top_k, filters=filters)
        res["m_replay_ms"].append((time.perf_counter() - t0) * 1e3)
        vectors.replay = False
        # The call mem0's search() makes to its vector store, alone, with the same vector.
        replayed = vectors.cache[text]
        t0 = time.perf_counter()
        hits = memory.vector_store.search(query=text, vectors=replayed, top_k=max(top_k * 4, 60),
                                          filters=filters)
        res["m_store_ms"].append((time.perf_counter() - t0) * 1e3)
        res["m_store_n"].append(len(hits))

        # Then the whole search(), its query embedding included.
        t0 = time.perf_counter()
        out = memory.search(text, top_k=top_k, filters=filters)
        res["m_ms"].append((time.perf_counter() - t0) * 1e3)
        res["m_emb"].append(vectors.last_ms)
        res["m_ranked"].append([(r.get("metadata") or {}).get("dia_id") for r in out["results"]])
        res["m_mismatch"].append([r["id"] for r in bare["results"]] != [r["id"] for r in out["results"]])
        res["m_vec_diff"].append(float(np.max(np.abs(np.asarray(replayed) - np.asarray(vectors.cache[text])))))
        # Whether mem0's BM25 leg found anything (outside the timings): without spaCy it
        # matches the whole question, every word of it, against the raw text.
        matched = memory.vector_store.keyword_search(query=lemmatize_for_bm25(text), top_k=1, filters=filters)
        res["m_bm25"].append(bool(matched))
        if (i + 1) % 100 == 0 or i + 1 == len(questions):
            log(f"  top_k {top_k}: {i + 1}/{len(questions)} questions ({time.perf_counter() - started:.0f} s)")
    return res


# --- Report ------------------------------------------------------------------------------


def report(n_memories, questions, passes, notes):
    print()
    print(f"### {n_memories:,} memories in one agent")
    print()
    for line in notes:
        print(f"- {line}")
    print()
    ks = [k for k, _ in passes]
    cols = "| system | memories | top_k | questions | R@10 |" + "".join(f" R@{k} |" for k in ks if k != 10)
    print(cols + " search p50 / p95 / p99 ms, end-to-end | without the embedding p50 / p95 / p99 ms |")
    print("|---|---:|---:|---:|---:|" + "---:|" * len([k for k in ks if k != 10]) + "---|---|")
    for k, r in passes:
        for system, ranked, e2e, bare in (
            ("engram", r["e_ranked"], r["e_ms"], [a - b for a, b in zip(r["e_ms"], r["e_emb"])]),
            ("mem0", r["m_ranked"], r["m_ms"], r["m_replay_ms"]),
        ):
            cells = []
            for kk in [10] + [x for x in ks if x != 10]:
                if kk > k:
                    cells.append("-")
                else:
                    cells.append(f"{sum(recall_at(q['evidence'], rk, kk) for q, rk in zip(questions, ranked)) / len(questions):.3f}")
            print(f"| {system} | {n_memories} | {k} | {len(questions)} | " + " | ".join(cells)
                  + f" | {pcts(e2e)} | {pcts(bare)} |")
    print()
    print("Parts, p50 / p95 / p99 ms:")
    print()
    print("| system | top_k | query embedding | server total − embedding (engram) / vector store search() alone (mem0) "
          "| results mean | mem0: its two searches ranked otherwise / query vectors differ | mem0: BM25 leg matched |")
    print("|---|---:|---|---|---:|---:|---:|")
    for k, r in passes:
        e_server = [a - b for a, b in zip(r["e_total"], r["e_emb"])]
        print(f"| engram | {k} | {pcts(r['e_emb'])} | {pcts(e_server)} | "
              f"{sum(map(len, r['e_ranked'])) / len(questions):.1f} | - | - |")
        print(f"| mem0 | {k} | {pcts(r['m_emb'])} | {pcts(r['m_store_ms'])} "
              f"(rows {sum(r['m_store_n']) / len(questions):.1f} of max({k}·4, 60) asked) | "
              f"{sum(map(len, r['m_ranked'])) / len(questions):.1f} | {sum(r['m_mismatch'])} / "
              f"{sum(d > 1e-6 for d in r['m_vec_diff'])} | "
              f"{sum(r['m_bm25'])} of {len(questions)} |")
    # Recall by subset, so that the tuning conversations can be told apart.
    subsets = [("tuning", lambda q: q["sample_id"] in TUNING), ("reporting", lambda q: q["sample_id"] not in TUNING)]
    k, r = passes[0]
    lines = []
    for name, pred in subsets:
        idx = [i for i, q in enumerate(questions) if pred(q)]
        if not idx:
            continue
        e = sum(recall_at(questions[i]["evidence"], r["e_ranked"][i], 10) for i in idx) / len(idx)
        m = sum(recall_at(questions[i]["evidence"], r["m_ranked"][i], 10) for i in idx) / len(idx)
        lines.append(f"{name} ({len(idx)} questions): engram {e:.3f}, mem0 {m:.3f}")
    print()
    print(f"R@10 by subset (top_k {k}): " + "; ".join(lines))


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown"


def parse_cases(s):
    cases = []
    for part in s.split(","):
        part = part.strip().lower()
        if part in ("3k", "turns"):
            cases.append(None)  # the turns as they are, no padding
        elif part.endswith("k") and part[:-1].isdigit():
            cases.append(int(part[:-1]) * 1000)
        elif part.isdigit():
            cases.append(int(part))
        else:
            raise argparse.ArgumentTypeError(f"{part!r} is not 3k, Nk or a number")
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--engram-url", required=True)
    ap.add_argument("--engram-bin", required=True, help="for `engram export` and `engram import`")
    ap.add_argument("--engram-database-url", required=True)
    ap.add_argument("--redis-url", required=True)
    ap.add_argument("--redis-key-prefix", required=True)
    ap.add_argument("--tenant", required=True, help="the server's default tenant")
    ap.add_argument("--mem0-database-url", required=True)
    ap.add_argument("--embeddings-url", required=True, help="OpenAI-compatible base URL up to /v1")
    ap.add_argument("--embeddings-model", required=True)
    ap.add_argument("--agents-memories", type=parse_cases, default=[None],
                    help="3k (the LoCoMo turns as they are, about 2.8K), and/or N or Nk: padded to N; "
                         "comma-separated, run in increasing order in one invocation (default 3k)")
    ap.add_argument("--queries", type=int, help="N questions spread evenly over all (default all)")
    ap.add_argument("--top-k", default="10,50", help="comma-separated; one pass each (default 10,50)")
    ap.add_argument("--conversations", default="", help="only these sample ids, comma-separated")
    ap.add_argument("--pad-vectors", choices=("auto", "embed", "synthetic"), default="auto")
    ap.add_argument("--embed-budget-min", type=float, default=15.0,
                    help="auto: embed the padding when that takes at most this many minutes")
    ap.add_argument("--seed", type=int, default=20261205)
    ap.add_argument("--command", default="", help="the command line, for the report")
    ap.add_argument("--engram-version", default="engram (version unknown)")
    args = ap.parse_args()
    top_ks = [int(k) for k in args.top_k.split(",") if k.strip()]
    only = [c for c in args.conversations.split(",") if c]

    turns, questions, warmup_pool, skipped = load(args.data, only)
    questions = spread(questions, args.queries)
    warmup = spread(warmup_pool, WARMUP) if len(warmup_pool) >= WARMUP else (warmup_pool + [q["text"] for q in questions])[:WARMUP]
    log(f"side by side: {len(turns)} turns, {len(questions)} questions ({skipped} skipped: no valid evidence), "
        f"warm-up {len(warmup)}")
    sizes = sorted(args.agents_memories, key=lambda c: -1 if c is None else c)
    for c in sizes:
        if c is not None and c < len(turns):
            raise SystemExit(f"--agents-memories {c}: fewer than the {len(turns)} turns")

    # mem0's directory (its config file and history database): a scratch one, removed at exit.
    home = tempfile.mkdtemp(prefix="mem0-home-")
    atexit.register(shutil.rmtree, home, True)
    os.environ["MEM0_DIR"] = home
    memory, vectors = make_mem0(args, home)
    engram = Engram(args.engram_url)
    emb = Embeddings(args.embeddings_url, args.embeddings_model)

    log(f"writing {len(turns)} turns to engram (HTTP, batches of {BATCH}; it embeds them)")
    e_write = engram.write(turns)
    log(f"writing {len(turns)} turns to mem0 (Memory.add(..., infer=False), one each; it embeds them)")
    m_write = mem0_write(memory, turns)

    # Both hold every turn, with the same vectors.
    exported = engram_export(args)
    e_vecs = {(r.get("metadata") or {}).get("dia_id"): np.array(r["vector"], dtype=np.float32)
              for r in exported if r.get("vector")}
    m_vecs = mem0_vectors(args)
    ids = [t.dia_id for t in turns]
    if any(d not in e_vecs for d in ids) or any(d not in m_vecs for d in ids):
        raise SystemExit(f"not every turn is stored with a vector: engram {len(e_vecs)}, mem0 {len(m_vecs)}, "
                         f"turns {len(ids)}")
    worst = min(float(np.dot(unit(e_vecs[d]), unit(m_vecs[d]))) for d in ids)
    log(f"both hold {len(ids)} turns; lowest cosine between a turn's two stored vectors: {worst:.6f}")
    if worst < 0.999:
        raise SystemExit("engram and mem0 stored different vectors for the same turn: not the same embedder?")
    template = next(r for r in exported if r.get("vector"))
    base = [unit(e_vecs[d]) for d in ids]

    versions = (f"{args.engram_version}; mem0ai {importlib.metadata.version('mem0ai')}, "
                f"psycopg {importlib.metadata.version('psycopg')}, Python {platform.python_version()}")
    with psycopg.connect(args.mem0_database_url) as conn:
        pg = conn.execute("SELECT current_setting('server_version'), "
                          "(SELECT extversion FROM pg_extension WHERE extname = 'vector')").fetchone()
    header = [
        f"Command: `{args.command}`" if args.command else None,
        f"Date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; CPU: {cpu_model()}, {os.cpu_count()} cores; "
        f"load average at the start {os.getloadavg()[0]:.2f}",
        f"Versions: {versions}; PostgreSQL {pg[0]}, pgvector {pg[1]} (one server for both)",
        "mem0 " + ("with spaCy" if importlib.util.find_spec("spacy") else
                   "without spaCy (its `nlp` extra): its BM25 leg gets the question unlemmatised, stop words and "
                   "all, and it boosts no entities"),
        f"Embedder (both, query and rows): {args.embeddings_model} at {args.embeddings_url}, {DIMENSIONS}-d",
        f"Writes of the {len(turns)} turns: engram {e_write:.0f} s over HTTP, mem0 {m_write:.0f} s by add() "
        f"(each embeds its own)",
    ]
    print()
    print("## engram and mem0 side by side (LoCoMo)")
    print()
    for line in filter(None, header):
        print(f"- {line}")

    current = len(turns)
    for case in sizes:
        n_conv = len({t.dia_id.split("/")[0] for t in turns})
        notes = [f"Rows: the {len(turns)} LoCoMo turns of {n_conv} conversation{'s' if n_conv > 1 else ''}, "
                 f"one agent and one user on each side"]
        if case is not None and case > current:
            log(f"padding to {case}: {case - current} rows")
            # Padding of an earlier, smaller case stays; the new rows are drawn after it.
            pads, sources = padding(turns, case - len(turns), args.seed)
            pads, sources = pads[current - len(turns):], sources[current - len(turns):]
            vecs, how = pad_vectors(args, pads, sources, base, current - len(turns))
            t0 = time.perf_counter()
            engram_import(args, template, pads, vecs)
            e_load = time.perf_counter() - t0
            t0 = time.perf_counter()
            mem0_bulk(memory, vectors, args, pads, vecs)
            m_load = time.perf_counter() - t0
            current = case
            notes.append(f"Padding: {case - len(turns)} splices of two turns (no dia_id: a miss when ranked), "
                         f"bulk-loaded: engram by `engram import` {e_load:.0f} s, mem0 by COPY of rows its own "
                         f"add() built, indexes rebuilt by its create_col(), {m_load:.0f} s")
            notes.append(f"Padding vectors: {how}")
        for url in (args.engram_database_url, args.mem0_database_url):
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE")
        e_rows = count_rows(args.engram_database_url, "SELECT count(*) FROM episodic_memory")
        m_rows = count_rows(args.mem0_database_url,
                            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(MEM0_COLLECTION)))
        if e_rows != current or m_rows != current:
            raise SystemExit(f"rows held: engram {e_rows}, mem0 {m_rows}, expected {current}")
        notes.append(f"Queries: {len(questions)} LoCoMo questions of categories 1-4, each once per top_k and "
                     f"system, concurrency 1, after a warm-up of {len(warmup)} (category-5 questions)")
        notes.append("Without the embedding: engram = end-to-end (HTTP) minus its response's timings.embedding_ms; "
                     "mem0 = Memory.search() with its embedder answering from the query's vector, fetched just "
                     "before with the request mem0 sends (its BM25 leg and scoring included), then the whole "
                     "search() again for the end-to-end figure")
        notes.append("engram counts the results of a search as accesses (the frequency in its score), so each "
                     "search sees the accesses of those before it, as in benches/locomo.rs")
        notes.append(f"mem0's vector statement (EXPLAIN, LIMIT {max(top_ks[0] * 4, 60)}): "
                     f"{mem0_plan(args, base[0], max(top_ks[0] * 4, 60))}")
        passes = []
        for k in top_ks:
            log(f"{current} memories: searching {len(questions)} questions, top_k {k}")
            passes.append((k, run_searches(engram, memory, vectors, emb, questions, warmup, k)))
        report(current, questions, passes, notes)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
