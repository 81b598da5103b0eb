#!/usr/bin/env bash
# Fuzzes the served OpenAPI document with schemathesis: starts `engram serve` on a free
# port (embedded backend in a temporary data directory, or the test Postgres and Redis
# with a database of its own), and checks every response against the document: no
# server error, only documented status codes, content types, headers and schemas.
#
#   scripts/schemathesis.sh embedded|postgres [extra schemathesis arguments]
#
# Needs the variables `. scripts/services.sh start` exports (postgres) and the cache
# directory it uses. schemathesis is installed once, pinned, into a virtualenv there.
# ENGRAM_SCHEMATHESIS_MAX_TIME bounds the fuzzing (seconds, default 90); the build and
# the server's start come on top.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

backend=${1:?usage: scripts/schemathesis.sh embedded|postgres [schemathesis arguments]}
shift
case $backend in
embedded | postgres) ;;
*) echo "schemathesis.sh: backend must be embedded or postgres, not $backend" >&2 && exit 2 ;;
esac

log() { printf 'schemathesis.sh: %s\n' "$*" >&2; }

# --- Pinned schemathesis, in a virtualenv under the services' cache ---------------------
# The version is pinned; its dependencies are whatever pip resolves for it (a fuzzer's
# dependency drift changes what is generated, never what the server is judged by).
SCHEMATHESIS_VERSION=4.32.5
if [[ -n "${ENGRAM_CACHE_DIR:-}" ]]; then
  CACHE=$ENGRAM_CACHE_DIR
elif [[ "$(id -u)" == 0 ]]; then
  CACHE=/var/tmp/engram-cache
else
  CACHE=$HOME/.cache/engram
fi
mkdir -p "$CACHE"
ST_HOME=$CACHE/schemathesis-$SCHEMATHESIS_VERSION
if ! "$ST_HOME/bin/schemathesis" --version 2>/dev/null | grep -q "$SCHEMATHESIS_VERSION"; then
  python3 -c 'import ensurepip, venv' 2>/dev/null ||
    { log "python3 with venv and ensurepip is needed (apt-get install python3-venv)" && exit 1; }
  log "installing schemathesis $SCHEMATHESIS_VERSION into $ST_HOME"
  rm -rf "$ST_HOME"
  python3 -m venv "$ST_HOME"
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$ST_HOME/bin/python" -m pip install --quiet --no-input \
    "schemathesis==$SCHEMATHESIS_VERSION"
fi

# --- The server -------------------------------------------------------------------------
. scripts/live-server.sh
make_work_dir schemathesis
# lexical-hash: vectors without a model, so both search legs run and nothing is downloaded.
start_server "$backend" "$work" ENGRAM_EMBEDDING__PROVIDER=lexical-hash
log "serving the $backend backend at $SERVER_URL (log: $work/server.log)"

# --- The run ----------------------------------------------------------------------------
# The checks that hold the server to its document. Not positive_data_acceptance: the
# document cannot state every rule (a tier's own fields, a day of clock skew), so a
# schema-valid body may rightly be 422.
# Run from the temporary directory: schemathesis and hypothesis leave caches in the
# current one.
status=0
(cd "$work" && "$ST_HOME/bin/schemathesis" run "$SERVER_URL/openapi.json" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance \
  --max-time "${ENGRAM_SCHEMATHESIS_MAX_TIME:-90}" --max-examples 50 --workers 2 \
  --generation-database none --no-color --report-dir "$work/report" "$@") || status=$?
if ((status != 0)); then
  # Each error with its causes, not the tail: one error's backtrace fills any tail.
  log "schemathesis found problems on the $backend backend; the server's errors follow"
  grep -v -E '^ *([0-9]+: |at )' "$work/server.log" | grep -A8 'ERROR' | head -n 120 >&2 || true
fi
exit "$status"
