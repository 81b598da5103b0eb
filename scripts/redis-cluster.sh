#!/usr/bin/env bash
# A three-node Redis Cluster on loopback (no replicas, nothing saved to disk), for the
# tests of working memory and the skill cache on a cluster (scripts/test.sh).
#
#   scripts/redis-cluster.sh start   start it (or reuse it) and print its URL
#   scripts/redis-cluster.sh stop
#
# Ports ${ENGRAM_TEST_CLUSTER_PORT:-21381} and the next two; each node also listens 10000
# higher for the cluster bus. Both lie below the kernel's range of ephemeral ports
# (32768-60999 by default), from which any outgoing connection on the machine may take its
# local port: a node whose bus port was taken that way failed to start. Its files live under
# ENGRAM_CACHE_DIR (default /var/tmp/engram-cache for root, ~/.cache/engram otherwise).
set -euo pipefail

log() { printf 'redis-cluster.sh: %s\n' "$*" >&2; }
if [[ -z ${ENGRAM_CACHE_DIR:-} ]]; then
  if [[ "$(id -u)" == 0 ]]; then ENGRAM_CACHE_DIR=/var/tmp/engram-cache; else ENGRAM_CACHE_DIR=$HOME/.cache/engram; fi
fi
base=${ENGRAM_TEST_CLUSTER_PORT:-21381}
ports=("$base" "$((base + 1))" "$((base + 2))")
dir=$ENGRAM_CACHE_DIR/redis-cluster
url="redis-cluster://127.0.0.1:${ports[0]},127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}"

case ${1:-start} in
start)
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null ||
    { log "redis-server and redis-cli are needed (apt-get install redis-server)" && exit 1; }
  if [[ "$(redis-cli -p "${ports[0]}" cluster info 2>/dev/null | tr -d '\r' | grep cluster_state)" == cluster_state:ok ]]; then
    echo "$url"
    exit 0
  fi
  # A fresh cluster each start: old node files would name slots of another one.
  for p in "${ports[@]}"; do redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true; done
  rm -rf "$dir" && mkdir -p "$dir"
  for p in "${ports[@]}"; do
    mkdir -p "$dir/$p"
    (cd "$dir/$p" && redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes \
      --cluster-config-file nodes.conf --save "" --appendonly no --daemonize yes --logfile redis.log)
  done
  for _ in $(seq 1 50); do
    up=0
    for p in "${ports[@]}"; do redis-cli -p "$p" ping >/dev/null 2>&1 && up=$((up + 1)); done
    ((up == 3)) && break
    sleep 0.1
  done
  if ((up < 3)); then
    for p in "${ports[@]}"; do
      redis-cli -p "$p" ping >/dev/null 2>&1 || { log "node $p did not start:" && tail -n 5 "$dir/$p/redis.log" >&2; }
    done
    exit 1
  fi
  redis-cli --cluster create "${ports[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes >"$dir/create.log" 2>&1 ||
    { cat "$dir/create.log" >&2 && exit 1; }
  for _ in $(seq 1 100); do
    state=$(redis-cli -p "${ports[0]}" cluster info | tr -d '\r' | grep cluster_state)
    [[ $state == cluster_state:ok ]] && log "cluster up on ports ${ports[*]}" && echo "$url" && exit 0
    sleep 0.1
  done
  log "the cluster did not reach cluster_state:ok" && exit 1
  ;;
stop)
  for p in "${ports[@]}"; do redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true; done
  ;;
*) echo "usage: $0 start|stop" >&2 && exit 2 ;;
esac
