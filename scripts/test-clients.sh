#!/usr/bin/env bash
# The clients engram's users connect with, against a running server (the embedded backend,
# the bundled model, API keys of two tenants):
# - the official MCP Python SDK (pinned in tests/clients/requirements.txt) drives every MCP
#   tool over Streamable HTTP at /mcp and over stdio (`engram mcp`): tests/clients/mcp_client.py;
# - the served /openapi.json must validate as OpenAPI 3.1 (openapi-spec-validator);
# - a Python client generated from it by openapi-python-client runs the README walkthrough
#   (tests/clients/walkthrough.py), and so does a TypeScript client (openapi-typescript types,
#   openapi-fetch requests; tests/clients/ts), type-checked by tsc against the generated types.
# Python packages go into a virtualenv and npm packages into a directory under the services'
# cache, each keyed by the hash of its pinned list. scripts/test.sh runs this script.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf 'test-clients.sh: %s\n' "$*" >&2; }
if [[ -z ${ENGRAM_CACHE_DIR:-} ]]; then
  if [[ "$(id -u)" == 0 ]]; then ENGRAM_CACHE_DIR=/var/tmp/engram-cache; else ENGRAM_CACHE_DIR=$HOME/.cache/engram; fi
fi
export ENGRAM_MODEL_DIR=${ENGRAM_MODEL_DIR:-$ENGRAM_CACHE_DIR/models/all-MiniLM-L6-v2}
scripts/fetch-model.sh "$ENGRAM_MODEL_DIR"

# --- Pinned tools ---------------------------------------------------------------------------
requirements=tests/clients/requirements.txt
py_home=$ENGRAM_CACHE_DIR/clients-py-$(sha256sum "$requirements" | cut -c1-12)
if [[ ! -x $py_home/bin/openapi-python-client ]]; then
  log "installing the Python clients' tools into $py_home"
  rm -rf "$py_home"
  python3 -m venv "$py_home"
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$py_home/bin/python" -m pip install --quiet --no-input -r "$requirements"
fi
ts_src=tests/clients/ts
node_home=$ENGRAM_CACHE_DIR/clients-ts-$(cat "$ts_src/package.json" "$ts_src/package-lock.json" | sha256sum | cut -c1-12)
if [[ ! -d $node_home/node_modules ]]; then
  log "installing the TypeScript clients' tools into $node_home"
  rm -rf "$node_home" && mkdir -p "$node_home"
  cp "$ts_src/package.json" "$ts_src/package-lock.json" "$node_home/"
  (cd "$node_home" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
fi

# --- The server -------------------------------------------------------------------------------
. scripts/live-server.sh
make_work_dir clients
start_server embedded "$work" \
  ENGRAM_API_KEYS="acme:acme-rw:read_write,acme:acme-ro:read,acme:acme-admin:admin,globex:globex-rw:read_write"
log "serving at $SERVER_URL (log: $work/server.log)"
failed() {
  log "$1 failed; the server's log follows"
  tail -n 40 "$work/server.log" >&2
  exit 1
}

# --- MCP ----------------------------------------------------------------------------------------
log "MCP: every tool through the official Python SDK, over HTTP and stdio"
"$py_home/bin/python" tests/clients/mcp_client.py "$SERVER_URL" "$ENGRAM_BIN" || failed "the MCP client"

# --- Generated clients --------------------------------------------------------------------------
curl -sf "$SERVER_URL/openapi.json" -o "$work/openapi.json"
log "the served document against OpenAPI 3.1"
"$py_home/bin/openapi-spec-validator" "$work/openapi.json" || failed "openapi-spec-validator"

log "Python: generating a client with openapi-python-client and running the walkthrough"
# Its formatter (ruff) comes from the same virtualenv.
(cd "$work" && PATH="$py_home/bin:$PATH" "$py_home/bin/openapi-python-client" generate \
  --path openapi.json --meta none --output-path engram_client) ||
  failed "openapi-python-client"
PYTHONPATH=$work "$py_home/bin/python" tests/clients/walkthrough.py "$SERVER_URL" acme-rw ||
  failed "the Python walkthrough"

log "TypeScript: generating types with openapi-typescript, type-checking and running the walkthrough"
mkdir -p "$work/ts"
cp "$ts_src/package.json" "$ts_src/tsconfig.json" "$ts_src/walkthrough.ts" "$work/ts/"
ln -s "$node_home/node_modules" "$work/ts/node_modules"
(cd "$work/ts" && node_modules/.bin/openapi-typescript ../openapi.json -o engram.ts --silent &&
  node_modules/.bin/tsc -p . && node build/walkthrough.js "$SERVER_URL" acme-rw) ||
  failed "the TypeScript walkthrough"
log "all client checks passed"
