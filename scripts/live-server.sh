# Sourced by the scripts that test a running server (schemathesis.sh, test-clients.sh):
#
#   start_server BACKEND WORK [VAR=value ...]
#     builds `engram`, serves BACKEND (embedded: a data directory in WORK; postgres: the test
#     Postgres with a database of its own, and Redis under a key prefix of its own) on a free
#     loopback port with the given settings, waits until it is ready and sets SERVER_URL.
#     The server's log is WORK/server.log.
#   stop_server
#     stops it and drops its database.
#   make_work_dir NAME
#     sets `work` to a new temporary directory; on exit the server is stopped and the
#     directory removed.
#
# Needs the variables `. scripts/services.sh start` exports (postgres).

server_pid=
server_database=

start_server() {
  local backend=$1 work=$2
  shift 2
  cargo build --locked --bin engram
  ENGRAM_BIN=${CARGO_TARGET_DIR:-$PWD/target}/debug/engram
  local port
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  local env_args=(ENGRAM_LOG__FILTER=warn ENGRAM_DATA_DIR="$work/data")
  if [[ $backend == postgres ]]; then
    : "${ENGRAM_TEST_DATABASE_URL:?run . scripts/services.sh start first}"
    server_database=engram_live_$$
    "$ENGRAM_PG_BIN/psql" -q "$ENGRAM_TEST_DATABASE_URL" -c "CREATE DATABASE $server_database"
    env_args+=(DATABASE_URL="${ENGRAM_TEST_DATABASE_URL%/*}/$server_database"
      REDIS_URL="${ENGRAM_TEST_REDIS_URL:-redis://127.0.0.1:6379}"
      ENGRAM_REDIS__KEY_PREFIX="engram-live-$$")
  fi
  env -u DATABASE_URL -u REDIS_URL -u ENGRAM_API_KEYS "${env_args[@]}" "$@" \
    "$ENGRAM_BIN" serve --listen "127.0.0.1:$port" >"$work/server.log" 2>&1 &
  server_pid=$!
  SERVER_URL=http://127.0.0.1:$port
  for _ in $(seq 1 120); do
    if python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
      "$SERVER_URL/readyz" 2>/dev/null; then
      return 0
    fi
    if ! kill -0 "$server_pid" 2>/dev/null; then
      cat "$work/server.log" >&2
      echo "live-server.sh: the server exited before it was ready" >&2
      return 1
    fi
    sleep 0.5
  done
  echo "live-server.sh: the server was not ready in 60 s" >&2
  return 1
}

stop_server() {
  if [[ -n $server_pid ]]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=
  fi
  if [[ -n $server_database ]]; then
    "$ENGRAM_PG_BIN/psql" -q "$ENGRAM_TEST_DATABASE_URL" -c "DROP DATABASE IF EXISTS $server_database WITH (FORCE)" || true
    server_database=
  fi
}

make_work_dir() {
  work=$(mktemp -d "${TMPDIR:-/tmp}/engram-$1.XXXXXX")
  trap 'stop_server; rm -rf "$work"' EXIT
}
