#!/usr/bin/env bash
# Erasure benchmark: how long erasing one user with 10K memories takes, and
# search latency on the other users' memories (same agent) while it runs,
# against idle in the same run. The memories (110K episodic: 10K of the user
# `subject`, 100K of 50 other users, vectors of the bundled model) are written
# as an `engram import` file by benches/sweep.rs and imported before the
# server starts.
#
#   scripts/bench-erasure.sh                 Postgres and Redis
#   scripts/bench-erasure.sh --data-dir DIR  embedded
# The table is printed at the end; copy it into bench/RESULTS.md with the machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/bench-lib.sh

data_dir=
if [[ ${1:-} == --data-dir ]]; then
  data_dir=$2
fi
live=110000 subject=10000
bench_build sweep
model_dir=${ENGRAM_MODEL_DIR:-$ENGRAM_CACHE_DIR/models/all-MiniLM-L6-v2}
scripts/fetch-model.sh "$model_dir"
file=$(mktemp --suffix=.jsonl)
trap 'rm -f "$file"; bench_stop' EXIT
cargo bench --locked --bench sweep -- generate --out "$file" --live $live --expiring 0 \
  --subject-rows $subject --model-dir "$model_dir"
bench_env=(ENGRAM_AUTH__DEFAULT_TENANT=bench-sweep ENGRAM_RETENTION__SWEEP_INTERVAL_SECS=0)

if [[ -n $data_dir ]]; then
  rm -rf "$data_dir"
  env -u DATABASE_URL ENGRAM_MODEL_DIR="$model_dir" "$BENCH_BIN" --data-dir "$data_dir" import "$file"
  bench_serve local DATABASE_URL= ENGRAM_DATA_DIR="$data_dir" "${bench_env[@]}"
else
  DB_NAME=engram_bench_erasure
  psql_engram -d postgres -c "DROP DATABASE IF EXISTS $DB_NAME WITH (FORCE)"
  bench_database "$DB_NAME"
  db_url="postgres://engram@127.0.0.1:$BENCH_PG_PORT/$DB_NAME"
  DATABASE_URL=$db_url REDIS_URL=$ENGRAM_TEST_REDIS_URL ENGRAM_MODEL_DIR="$model_dir" "$BENCH_BIN" import "$file"
  psql_engram -d "$DB_NAME" -c "VACUUM ANALYZE episodic_memory"
  bench_serve local DATABASE_URL="$db_url" REDIS_URL="$ENGRAM_TEST_REDIS_URL" \
    ENGRAM_REDIS__KEY_PREFIX="engram-bench-erasure" "${bench_env[@]}"
fi
cargo bench --locked --bench sweep -- erase --url "$BENCH_URL"
