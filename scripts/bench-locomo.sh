#!/usr/bin/env bash
# Conversational-recall benchmark (LoCoMo): a release `engram serve` on a database of its
# own (engram_bench_locomo) and a free port, measured by the client program benches/locomo.rs.
#   scripts/bench-locomo.sh DATA                                  lexical-hash vectors
#   scripts/bench-locomo.sh DATA ENGRAM_EMBEDDING__PROVIDER=local ENGRAM_MODEL_DIR=DIR
#   scripts/bench-locomo.sh DATA --conversations conv-26,conv-30 --diagnose 10
# DATA is a LoCoMo JSON file (e.g. conversations-dev.json; CC BY-NC 4.0): it is read,
# never copied. Arguments of the form NAME=VALUE are given to the server's environment
# (the embedding provider comes from ENGRAM_EMBEDDING__PROVIDER, in the environment or
# there; default lexical-hash); the others go to the program. The tables are printed at
# the end; copy them into bench/RESULTS.md with the provider and the machine.
#
# Each run writes the conversations again under new agent ids. The memories of earlier runs
# are deleted first: left in place they would grow the HNSW index that every search walks
# (filtered to one agent), and with another provider they would be re-embedded in the
# background during the run. One run at a time.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ $# -lt 1 || ! -f $1 ]]; then
  echo "usage: $0 DATA [NAME=VALUE server environment...] [benchmark arguments...]" >&2
  exit 2
fi
DATA=$(realpath "$1")
shift
EXTRA_ENV=()
BENCH_ARGS=()
for arg in "$@"; do
  if [[ $arg =~ ^[A-Z_][A-Z0-9_]*= ]]; then
    EXTRA_ENV+=("$arg")
  else
    BENCH_ARGS+=("$arg")
  fi
done
PROVIDER=${ENGRAM_EMBEDDING__PROVIDER:-lexical-hash}
for e in "${EXTRA_ENV[@]}"; do
  [[ $e == ENGRAM_EMBEDDING__PROVIDER=* ]] && PROVIDER=${e#*=}
done

# `start` explicitly: a sourced file would otherwise see this script's arguments.
# shellcheck source=scripts/services.sh
. scripts/services.sh start

DB_NAME=engram_bench_locomo
TENANT=bench-locomo
REDIS_PREFIX=engram-bench-locomo
PG_PORT=${ENGRAM_TEST_PG_PORT:-54329}
psql_engram() { "$ENGRAM_PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U engram "$@"; }

if [[ "$(psql_engram -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'")" != 1 ]]; then
  echo "bench: creating database $DB_NAME" >&2
  psql_engram -d postgres -c "CREATE DATABASE $DB_NAME"
fi

# The table exists once a server has migrated the database.
if [[ "$(psql_engram -d "$DB_NAME" -tAc "SELECT to_regclass('episodic_memory') IS NOT NULL")" == t ]]; then
  echo "bench: deleting the memories of earlier runs" >&2
  psql_engram -d "$DB_NAME" -c "DELETE FROM episodic_memory WHERE tenant_id = '$TENANT'" -c 'VACUUM ANALYZE episodic_memory'
fi

cargo build --release --bin engram
# The client too, before the server starts: no compiler shares the cores with the run.
cargo bench --bench locomo --no-run
BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/engram

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
LOG=$(mktemp)
# One tenant and Redis prefix for every run; runs differ by their agent ids.
SERVER_ENV=(
  -u ENGRAM_API_KEYS -u ENGRAM_CONFIG
  DATABASE_URL="postgres://engram@127.0.0.1:$PG_PORT/$DB_NAME"
  REDIS_URL="$ENGRAM_TEST_REDIS_URL"
  ENGRAM_LISTEN="127.0.0.1:$PORT"
  ENGRAM_AUTH__DEFAULT_TENANT="$TENANT"
  ENGRAM_REDIS__KEY_PREFIX="$REDIS_PREFIX"
  ENGRAM_EMBEDDING__PROVIDER="$PROVIDER"
  RUST_LOG=warn
  "${EXTRA_ENV[@]}"
)

# Recall measured with another embedder than the one named would be misreported.
if ! env "${SERVER_ENV[@]}" "$BIN" config | grep -qx "provider = \"$PROVIDER\""; then
  echo "bench: engram does not run with embedding provider $PROVIDER; its effective configuration:" >&2
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

echo "bench: starting engram serve on 127.0.0.1:$PORT (embedding provider $PROVIDER)" >&2
env "${SERVER_ENV[@]}" "$BIN" serve >"$LOG" 2>&1 &
SERVER_PID=$!

# A local model is loaded (and its files hashed) before the server answers: allow 2 minutes.
for ((i = 0; i < 1200; i++)); do
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
  echo "bench: engram serve was not ready in 120 s" >&2
  exit 1
}

echo "bench: embedding provider $PROVIDER; load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
rc=0
cargo bench --bench locomo -- --data "$DATA" --url "http://127.0.0.1:$PORT" "${BENCH_ARGS[@]}" || rc=$?
echo "bench: load average after the run: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

# Anything the server logged at warn or above during the run (startup notices included).
if [[ -s $LOG ]]; then
  echo "bench: server log:" >&2
  tail -n 40 "$LOG" >&2
fi
exit "$rc"
