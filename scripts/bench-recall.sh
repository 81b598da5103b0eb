#!/usr/bin/env bash
# Recall-latency benchmark: a release `engram serve` with its default embedder (the
# local all-MiniLM-L6-v2) on a database of its own (engram_bench_recall: 200K memories,
# loaded on the first run and reused after) and a free port, measured by the client
# program benches/recall.
#   scripts/bench-recall.sh SCIFACT_ZIP                  search and context at concurrency 1, 8, 32
#   scripts/bench-recall.sh SCIFACT_ZIP --queries 1000   further arguments go to the program
#   scripts/bench-recall.sh SCIFACT_ZIP --tiny-agents 9989 --embed-at-most 10000 --mixed 3000
#       1M memories over 10K agents, vectors synthetic beyond 10K embedded texts (about 20
#       minutes to load, most of it building the HNSW indexes), and a mixed load of writes,
#       searches and contexts; give Postgres the memory first (scripts/services.sh stop, then
#       ENGRAM_TEST_PG_SHARED_BUFFERS=8GB scripts/services.sh start). The database is
#       emptied and reloaded whenever its rows do not match the shape asked for.
#   scripts/bench-recall.sh SCIFACT_ZIP --data-dir DIR   the embedded backend (no Postgres
#       or Redis for the server): agent A and the small agent (110K memories) are written
#       once as an `engram import` file with their vectors, imported into DIR, and reused
#       after; only the HTTP runs are measured.
# SCIFACT_ZIP is the BEIR SciFact zip (corpus_train.csv, claims_*.csv); it is read, never
# copied. The first load embeds about 160K distinct texts with the model on every core
# (about an hour on 2 cores; the vectors are cached in the database). The tables are
# printed at the end; copy them into bench/RESULTS.md with the machine.
#
# The server, Postgres and the load generator run on the same machine: on a small one
# they compete for the cores, which the numbers include.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ $# -lt 1 || ! -f $1 ]]; then
  echo "usage: $0 SCIFACT_ZIP [benchmark arguments...]" >&2
  exit 2
fi
ZIP=$(realpath "$1")
shift
DATA_DIR=
if [[ ${1:-} == --data-dir ]]; then
  [[ $# -ge 2 ]] || { echo "--data-dir needs a directory" >&2; exit 2; }
  DATA_DIR=$(realpath -m "$2")
  shift 2
fi

. scripts/bench-lib.sh

TENANT=bench-recall
# The program embeds the data set and the queries with the same model files.
export ENGRAM_MODEL_DIR=${ENGRAM_MODEL_DIR:-$ENGRAM_CACHE_DIR/models/all-MiniLM-L6-v2}
export CANDLE_NUM_THREADS=${CANDLE_NUM_THREADS:-2} RAYON_NUM_THREADS=${RAYON_NUM_THREADS:-2}

if [[ -n $DATA_DIR ]]; then
  bench_build recall
  scripts/fetch-model.sh "$ENGRAM_MODEL_DIR"
  if [[ ! -f $DATA_DIR/engram.db ]]; then
    EXPORT="$DATA_DIR.jsonl"
    if [[ ! -s $EXPORT ]]; then
      echo "bench: writing the data set with its vectors to $EXPORT (embeds 110K texts once)" >&2
      cargo bench --locked --bench recall -- --zip "$ZIP" --url http://unused --tenant "$TENANT" \
        --export-data "$EXPORT.part"
      mv "$EXPORT.part" "$EXPORT"
    fi
    echo "bench: importing $EXPORT into $DATA_DIR" >&2
    start=$SECONDS
    env -u DATABASE_URL ENGRAM_DATABASE__URL= ENGRAM_DATA_DIR="$DATA_DIR" RUST_LOG=warn "$BENCH_BIN" import "$EXPORT"
    echo "bench: imported in $((SECONDS - start)) s" >&2
  fi
  bench_serve local DATABASE_URL= ENGRAM_DATA_DIR="$DATA_DIR" ENGRAM_AUTH__DEFAULT_TENANT="$TENANT"
  echo "bench: the server started on the data directory in $BENCH_START_SECS s" >&2
  bench_client recall --zip "$ZIP" --url "$BENCH_URL" --tenant "$TENANT" --embedded "$@"
fi

# A database of its own, kept between runs: loading 200K memories and building their
# HNSW indexes takes minutes; the program reuses them while the row counts match.
DB_NAME=engram_bench_recall
REDIS_PREFIX=engram-bench-recall
DATABASE_URL="postgres://engram@127.0.0.1:$BENCH_PG_PORT/$DB_NAME"
bench_database "$DB_NAME"
bench_build recall

# The server migrates a new database and creates the per-model HNSW indexes at start.
bench_serve local \
  DATABASE_URL="$DATABASE_URL" \
  REDIS_URL="$ENGRAM_TEST_REDIS_URL" \
  ENGRAM_AUTH__DEFAULT_TENANT="$TENANT" \
  ENGRAM_REDIS__KEY_PREFIX="$REDIS_PREFIX"
bench_client recall --zip "$ZIP" --url "$BENCH_URL" --database-url "$DATABASE_URL" \
  --redis-url "$ENGRAM_TEST_REDIS_URL" --redis-key-prefix "$REDIS_PREFIX" --tenant "$TENANT" "$@"
