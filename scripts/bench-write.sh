#!/usr/bin/env bash
# Write-latency benchmark: a release `engram serve` on its own database and a free
# port, measured by the client program benches/write.rs. Arguments go to that program:
#   scripts/bench-write.sh                    every class at concurrency 1, 8 and 32
#   scripts/bench-write.sh --total 2000       a quicker run
# The table is printed at the end; copy it into bench/RESULTS.md with the machine.
#
# The server and the load generator run on the same machine: on a small one they
# compete for the cores, which the numbers include.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# `start` explicitly: a sourced file would otherwise see this script's arguments.
# shellcheck source=scripts/services.sh
. scripts/services.sh start

DB_NAME=engram_bench
PG_PORT=${ENGRAM_TEST_PG_PORT:-54329}
psql_engram() { "$ENGRAM_PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U engram "$@"; }

# A database of its own: benchmark rows never mix with test data. Kept between runs
# (each run writes under new agent ids), so later runs see a fuller table, as a real
# server would.
if [[ "$(psql_engram -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'")" != 1 ]]; then
  echo "bench: creating database $DB_NAME" >&2
  psql_engram -d postgres -c "CREATE DATABASE $DB_NAME"
fi

cargo build --release --bin engram
# The load generator too, before the server starts: no compiler shares the cores with
# the run. The load average printed around the run says whether anything else did.
cargo bench --bench write --no-run
BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/engram

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
RUN=$(python3 -c 'import uuid; print(uuid.uuid4().hex[:12])')
LOG=$(mktemp)
# A tenant and a Redis prefix of its own per run; vectors from the lexical-hash embedder.
SERVER_ENV=(
  -u ENGRAM_API_KEYS -u ENGRAM_CONFIG
  DATABASE_URL="postgres://engram@127.0.0.1:$PG_PORT/$DB_NAME"
  REDIS_URL="$ENGRAM_TEST_REDIS_URL"
  ENGRAM_LISTEN="127.0.0.1:$PORT"
  ENGRAM_AUTH__DEFAULT_TENANT="bench-$RUN"
  ENGRAM_REDIS__KEY_PREFIX="engram-bench-$RUN"
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

echo "bench: starting engram serve on 127.0.0.1:$PORT (run $RUN)" >&2
env "${SERVER_ENV[@]}" "$BIN" serve >"$LOG" 2>&1 &
SERVER_PID=$!

for ((i = 0; i < 300; i++)); do
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
  echo "bench: engram serve was not ready in 30 s" >&2
  exit 1
}

echo "bench: load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
rc=0
cargo bench --bench write -- --url "http://127.0.0.1:$PORT" "$@" || rc=$?
echo "bench: load average after the run: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

# Anything the server logged at warn or above during the run (startup notices included).
if [[ -s $LOG ]]; then
  echo "bench: server log:" >&2
  tail -n 40 "$LOG" >&2
fi
exit "$rc"
