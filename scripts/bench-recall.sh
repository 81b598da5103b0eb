#!/usr/bin/env bash
# Recall-latency benchmark: a release `engram serve` with its default embedder (the
# local all-MiniLM-L6-v2) on a database of its own (engram_bench_recall: 200K memories,
# loaded on the first run and reused after) and a free port, measured by the client
# program benches/recall.
#   scripts/bench-recall.sh SCIFACT_ZIP                  search and context at concurrency 1, 8, 32
#   scripts/bench-recall.sh SCIFACT_ZIP --queries 1000   further arguments go to the program
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

. scripts/bench-lib.sh

# A database of its own, kept between runs: loading 200K memories and building their
# HNSW indexes takes minutes; the program reuses them while the row counts match.
DB_NAME=engram_bench_recall
TENANT=bench-recall
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
# The program embeds the data set and the queries with the same model files.
export ENGRAM_MODEL_DIR=${ENGRAM_MODEL_DIR:-$ENGRAM_CACHE_DIR/models/all-MiniLM-L6-v2}
export CANDLE_NUM_THREADS=${CANDLE_NUM_THREADS:-2} RAYON_NUM_THREADS=${RAYON_NUM_THREADS:-2}
bench_client recall --zip "$ZIP" --url "$BENCH_URL" --database-url "$DATABASE_URL" \
  --redis-url "$ENGRAM_TEST_REDIS_URL" --redis-key-prefix "$REDIS_PREFIX" --tenant "$TENANT" "$@"
