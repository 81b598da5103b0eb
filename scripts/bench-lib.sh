# Shared steps of the benchmark scripts (sourced, not run): services, a database of
# the benchmark's own, a release server on a free port, and its log at the end.
#
#   . scripts/bench-lib.sh
#   bench_database engram_bench_x          # create it unless it exists
#   bench_build x                          # release server + the client bench `x`
#   bench_serve PROVIDER NAME=VALUE...     # start `engram serve`; sets BENCH_URL
#   bench_client x ARGS...                 # cargo bench --bench x -- ARGS...; exits with its status
#
# The server gets no API keys and no config file, the given environment, and the
# embedding provider named (checked in its effective configuration: recall measured
# with another embedder than the one reported would be misreported). With the `local`
# provider the model is fetched first into the same cache as the tests' copy.

# `start` explicitly: a sourced file would otherwise see the calling script's arguments.
# shellcheck source=scripts/services.sh
. scripts/services.sh start

# ENGRAM_BENCH_PG_PORT=54334 runs on the replica pair's primary (services.sh), e.g. with
# DATABASE_READ_URL=postgres://engram@127.0.0.1:54335/DB given to the server for its replica.
BENCH_PG_PORT=${ENGRAM_BENCH_PG_PORT:-${ENGRAM_TEST_PG_PORT:-54329}}
# ENGRAM_BENCH_BIN runs another build (say, the parent commit's) against the same client.
BENCH_BIN=${ENGRAM_BENCH_BIN:-${CARGO_TARGET_DIR:-$PWD/target}/release/engram}
BENCH_LOG=$(mktemp)
BENCH_SERVER_PID=
BENCH_URL=
# Seconds from `engram serve` to its first ready answer (set by bench_serve).
BENCH_START_SECS=

psql_engram() { "$ENGRAM_PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$BENCH_PG_PORT" -U engram "$@"; }

bench_database() {
  if [[ "$(psql_engram -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$1'")" != 1 ]]; then
    echo "bench: creating database $1" >&2
    psql_engram -d postgres -c "CREATE DATABASE $1"
  fi
}

# The client too, before the server starts: no compiler shares the cores with the run.
bench_build() {
  cargo build --release --locked --bin engram
  cargo bench --locked --bench "$1" --no-run
}

# shellcheck disable=SC2317 # called by the EXIT trap
bench_stop() {
  if [[ -n $BENCH_SERVER_PID ]] && kill -0 "$BENCH_SERVER_PID" 2>/dev/null; then
    kill -TERM "$BENCH_SERVER_PID"
    wait "$BENCH_SERVER_PID" || true
  fi
  rm -f "$BENCH_LOG"
}
trap bench_stop EXIT

bench_serve() {
  local provider=$1 port i
  shift
  # The model's thread counts are the server's own (embedding.local.threads),
  # not the ones a script exported for its own embedding.
  local env=(-u ENGRAM_API_KEYS -u ENGRAM_CONFIG -u CANDLE_NUM_THREADS -u RAYON_NUM_THREADS RUST_LOG=warn)
  if [[ $provider == local ]]; then
    local model_dir=${ENGRAM_MODEL_DIR:-$ENGRAM_CACHE_DIR/models/all-MiniLM-L6-v2}
    scripts/fetch-model.sh "$model_dir"
    env+=(ENGRAM_MODEL_DIR="$model_dir")
  fi
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  env+=(ENGRAM_LISTEN="127.0.0.1:$port" ENGRAM_EMBEDDING__PROVIDER="$provider" "$@")
  if ! env "${env[@]}" "$BENCH_BIN" config | grep -qx "provider = \"$provider\""; then
    echo "bench: engram does not run with embedding provider $provider; its effective configuration:" >&2
    env "${env[@]}" "$BENCH_BIN" config >&2
    exit 1
  fi
  echo "bench: starting engram serve on 127.0.0.1:$port (embedding provider $provider)" >&2
  local started=$SECONDS
  env "${env[@]}" "$BENCH_BIN" serve >"$BENCH_LOG" 2>&1 &
  BENCH_SERVER_PID=$!
  # A local model is loaded (and its files hashed) before the server answers: allow 2 minutes.
  for ((i = 0; i < 1200; i++)); do
    if ! kill -0 "$BENCH_SERVER_PID" 2>/dev/null; then
      cat "$BENCH_LOG" >&2
      echo "bench: engram serve exited before it was ready" >&2
      exit 1
    fi
    if curl -sf "http://127.0.0.1:$port/readyz" >/dev/null; then
      BENCH_URL="http://127.0.0.1:$port"
      BENCH_START_SECS=$((SECONDS - started))
      return 0
    fi
    sleep 0.1
  done
  cat "$BENCH_LOG" >&2
  echo "bench: engram serve was not ready in 120 s" >&2
  exit 1
}

bench_client() {
  local bench=$1 rc=0
  shift
  echo "bench: load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  cargo bench --locked --bench "$bench" -- "$@" || rc=$?
  echo "bench: load average after the run: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  # Anything the server logged at warn or above during the run (startup notices included).
  if [[ -s $BENCH_LOG ]]; then
    echo "bench: server log:" >&2
    tail -n 40 "$BENCH_LOG" >&2
  fi
  exit "$rc"
}
