#!/usr/bin/env bash
# Retention sweep benchmark: how fast the sweep deletes expired memories, and
# search latency while it does (against idle, in the same run). The memories are
# written as an `engram import` file by benches/sweep.rs (vectors of the bundled
# model), imported, then made expired directly in the database before the server
# starts; the server sweeps 60 s after it starts.
#
#   scripts/bench-sweep.sh                 Postgres: 20K live + 200K expired memories
#   scripts/bench-sweep.sh --data-dir DIR  embedded: 100K live + 100K expired, and the
#                                          start time before and after the sweep
# The tables are printed at the end; copy them into bench/RESULTS.md with the machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/bench-lib.sh

data_dir=
if [[ ${1:-} == --data-dir ]]; then
  data_dir=$2
fi
bench_build sweep
model_dir=${ENGRAM_MODEL_DIR:-$ENGRAM_CACHE_DIR/models/all-MiniLM-L6-v2}
scripts/fetch-model.sh "$model_dir"
file=$(mktemp --suffix=.jsonl)
trap 'rm -f "$file"; bench_stop' EXIT
sweep_env=(ENGRAM_AUTH__DEFAULT_TENANT=bench-sweep ENGRAM_RETENTION__SWEEP_INTERVAL_SECS=60)

if [[ -n $data_dir ]]; then
  live=100000 expired=100000
  cargo bench --locked --bench sweep -- generate --out "$file" --live $live --expiring $expired --model-dir "$model_dir"
  rm -rf "$data_dir"
  t=$SECONDS
  env -u DATABASE_URL ENGRAM_MODEL_DIR="$model_dir" "$BENCH_BIN" --data-dir "$data_dir" import "$file"
  echo "bench: imported $((live + expired)) memories in $((SECONDS - t)) s" >&2
  python3 - "$data_dir/engram.db" <<'PY'
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1])
n = db.execute("update memories set expires_at = ? where agent_id = 'agent-expiring'",
               (int(time.time() * 1e6) - 1_000_000,)).rowcount
db.commit()
print(f"bench: {n} memories made expired", file=sys.stderr)
PY
  bench_serve local DATABASE_URL= ENGRAM_DATA_DIR="$data_dir" "${sweep_env[@]}"
  before=$BENCH_START_SECS
  cargo bench --locked --bench sweep -- measure --url "$BENCH_URL" --expiring $expired
  bench_stop
  bench_serve local DATABASE_URL= ENGRAM_DATA_DIR="$data_dir" "${sweep_env[@]}"
  echo "| embedded start to ready | ${before} s with $live live + $expired expired | ${BENCH_START_SECS} s after the sweep ($live live) |"
else
  live=20000 expired=200000
  DB_NAME=engram_bench_sweep
  psql_engram -d postgres -c "DROP DATABASE IF EXISTS $DB_NAME WITH (FORCE)"
  bench_database "$DB_NAME"
  db_url="postgres://engram@127.0.0.1:$BENCH_PG_PORT/$DB_NAME"
  cargo bench --locked --bench sweep -- generate --out "$file" --live $live --expiring $expired --model-dir "$model_dir"
  t=$SECONDS
  DATABASE_URL=$db_url REDIS_URL=$ENGRAM_TEST_REDIS_URL ENGRAM_MODEL_DIR="$model_dir" "$BENCH_BIN" import "$file"
  echo "bench: imported $((live + expired)) memories in $((SECONDS - t)) s" >&2
  psql_engram -d "$DB_NAME" -c "UPDATE episodic_memory SET expires_at = now() - interval '1 second' \
    WHERE tenant_id = 'bench-sweep' AND agent_id = 'agent-expiring'"
  psql_engram -d "$DB_NAME" -c "VACUUM ANALYZE episodic_memory"
  bench_serve local DATABASE_URL="$db_url" REDIS_URL="$ENGRAM_TEST_REDIS_URL" \
    ENGRAM_REDIS__KEY_PREFIX="engram-bench-sweep" "${sweep_env[@]}"
  cargo bench --locked --bench sweep -- measure --url "$BENCH_URL" --expiring $expired
fi
