#!/usr/bin/env bash
# Recall-latency benchmark: a release `engram serve` on a database of its own
# (engram_bench_recall, 200K memories loaded on the first run and reused after) and
# a free port, measured by the client program benches/recall.
#   scripts/bench-recall.sh SCIFACT_ZIP                  search and context at concurrency 1, 8, 32
#   scripts/bench-recall.sh SCIFACT_ZIP --queries 1000   further arguments go to the program
# SCIFACT_ZIP is the BEIR SciFact zip (corpus_train.csv, claims_*.csv); it is read, never
# copied. The tables are printed at the end; copy them into bench/RESULTS.md with the machine.
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

# `start` explicitly: a sourced file would otherwise see this script's arguments.
# shellcheck source=scripts/services.sh
. scripts/services.sh start

DB_NAME=engram_bench_recall
TENANT=bench-recall
REDIS_PREFIX=engram-bench-recall
PG_PORT=${ENGRAM_TEST_PG_PORT:-54329}
DATABASE_URL="postgres://engram@127.0.0.1:$PG_PORT/$DB_NAME"
psql_engram() { "$ENGRAM_PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U engram "$@"; }

# A database of its own, kept between runs: loading 200K memories and building their
# HNSW indexes takes minutes; the program reuses them while the row counts match.
if [[ "$(psql_engram -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'")" != 1 ]]; then
  echo "bench: creating database $DB_NAME" >&2
  psql_engram -d postgres -c "CREATE DATABASE $DB_NAME"
fi

cargo build --release --bin engram
BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/engram

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
LOG=$(mktemp)
# One tenant and one Redis prefix for every run (the data set is reused); vectors from
# the lexical-hash embedder, which the bulk load also uses.
SERVER_ENV=(
  -u ENGRAM_API_KEYS -u ENGRAM_CONFIG
  DATABASE_URL="$DATABASE_URL"
  REDIS_URL="$ENGRAM_TEST_REDIS_URL"
  ENGRAM_LISTEN="127.0.0.1:$PORT"
  ENGRAM_AUTH__DEFAULT_TENANT="$TENANT"
  ENGRAM_REDIS__KEY_PREFIX="$REDIS_PREFIX"
  ENGRAM_EMBEDDING__PROVIDER=lexical-hash
  RUST_LOG=warn
)

# A run without vectors would measure something else: make sure the settings took.
if ! env "${SERVER_ENV[@]}" "$BIN" config | grep -qx 'provider = "lexical-hash"'; then
  echo "bench: engram does not pick up ENGRAM_EMBEDDING__PROVIDER; its effective configuration:" >&2
  env "${SERVER_ENV[@]}" "$BIN" config >&2
  exit 1
fi

SERVER_PID=
# shellcheck disable=SC2317 # called by the EXIT trap
stop_server() {
  if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID"
    wait "$SERVER_PID" || true
  fi
  rm -f "$LOG"
}
trap stop_server EXIT

# The server migrates the new database and creates the per-model HNSW indexes at start.
echo "bench: starting engram serve on 127.0.0.1:$PORT" >&2
env "${SERVER_ENV[@]}" "$BIN" serve >"$LOG" 2>&1 &
SERVER_PID=$!

for ((i = 0; i < 600; i++)); do
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    cat "$LOG" >&2
    echo "bench: engram serve exited before it was ready" >&2
    exit 1
  fi
  if curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null; then
    break
  fi
  sleep 0.1
done
curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null || {
  cat "$LOG" >&2
  echo "bench: engram serve was not ready in 60 s" >&2
  exit 1
}

rc=0
cargo bench --bench recall -- --zip "$ZIP" --url "http://127.0.0.1:$PORT" --database-url "$DATABASE_URL" \
  --redis-url "$ENGRAM_TEST_REDIS_URL" --redis-key-prefix "$REDIS_PREFIX" --tenant "$TENANT" "$@" || rc=$?

# Anything the server logged at warn or above during the run (startup notices included).
if [[ -s $LOG ]]; then
  echo "bench: server log:" >&2
  tail -n 40 "$LOG" >&2
fi
exit "$rc"
