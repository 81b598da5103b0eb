#!/usr/bin/env bash
# A Redis Cluster of three masters on loopback (nothing saved to disk), for the tests of
# working memory and the skill cache on a cluster (scripts/test.sh), and with a replica
# per master for the failover benchmark (scripts/bench-failover.sh).
#
#   scripts/redis-cluster.sh start   start it (or reuse it) and print its URL
#   scripts/redis-cluster.sh stop
#
# ENGRAM_TEST_CLUSTER_REPLICAS (default 0) replicas per master; ENGRAM_TEST_CLUSTER_NODE_TIMEOUT
# (milliseconds, default Redis's 15000) how long a node may be silent before the others
# count it failed and promote its replica.
# Ports ${ENGRAM_TEST_CLUSTER_PORT:-21381} and the next ones, one per node; each node also
# listens 10000 higher for the cluster bus. Both lie below the kernel's range of ephemeral ports
# (32768-60999 by default), from which any outgoing connection on the machine may take its
# local port: a node whose bus port was taken that way failed to start. Its files live under
# ENGRAM_CACHE_DIR (default /var/tmp/engram-cache for root, ~/.cache/engram otherwise).
set -euo pipefail

log() { printf 'redis-cluster.sh: %s\n' "$*" >&2; }
if [[ -z ${ENGRAM_CACHE_DIR:-} ]]; then
  if [[ "$(id -u)" == 0 ]]; then ENGRAM_CACHE_DIR=/var/tmp/engram-cache; else ENGRAM_CACHE_DIR=$HOME/.cache/engram; fi
fi
base=${ENGRAM_TEST_CLUSTER_PORT:-21381}
replicas=${ENGRAM_TEST_CLUSTER_REPLICAS:-0}
node_timeout=${ENGRAM_TEST_CLUSTER_NODE_TIMEOUT:-15000}
[[ $replicas =~ ^[0-9]$ ]] || { log "ENGRAM_TEST_CLUSTER_REPLICAS must be 0-9" && exit 2; }
[[ $node_timeout =~ ^[0-9]+$ ]] || { log "ENGRAM_TEST_CLUSTER_NODE_TIMEOUT must be milliseconds" && exit 2; }
ports=()
for ((i = 0; i < 3 * (1 + replicas); i++)); do ports+=("$((base + i))"); done
dir=$ENGRAM_CACHE_DIR/redis-cluster-$base
url="redis-cluster://$(printf '127.0.0.1:%s,' "${ports[@]}")"
url=${url%,}

case ${1:-start} in
start)
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null ||
    { log "redis-server and redis-cli are needed (apt-get install redis-server)" && exit 1; }
  # Reused only when it has the nodes asked for, all of them answering.
  known=$(redis-cli -p "${ports[0]}" cluster nodes 2>/dev/null | grep -vc fail || true)
  if [[ "$(redis-cli -p "${ports[0]}" cluster info 2>/dev/null | tr -d '\r' | grep cluster_state)" == cluster_state:ok ]] &&
    ((known == ${#ports[@]})); then
    echo "$url"
    exit 0
  fi
  # A fresh cluster each start: old node files would name slots of another one.
  for p in "${ports[@]}"; do redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true; done
  rm -rf "$dir" && mkdir -p "$dir"
  for p in "${ports[@]}"; do
    mkdir -p "$dir/$p"
    (cd "$dir/$p" && redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes \
      --cluster-config-file nodes.conf --cluster-node-timeout "$node_timeout" \
      --save "" --appendonly no --daemonize yes --logfile redis.log)
  done
  for _ in $(seq 1 50); do
    up=0
    for p in "${ports[@]}"; do redis-cli -p "$p" ping >/dev/null 2>&1 && up=$((up + 1)); done
    ((up == ${#ports[@]})) && break
    sleep 0.1
  done
  if ((up < ${#ports[@]})); then
    for p in "${ports[@]}"; do
      redis-cli -p "$p" ping >/dev/null 2>&1 || { log "node $p did not start:" && tail -n 5 "$dir/$p/redis.log" >&2; }
    done
    exit 1
  fi
  redis-cli --cluster create "${ports[@]/#/127.0.0.1:}" --cluster-replicas "$replicas" --cluster-yes >"$dir/create.log" 2>&1 ||
    { cat "$dir/create.log" >&2 && exit 1; }
  for _ in $(seq 1 100); do
    state=$(redis-cli -p "${ports[0]}" cluster info | tr -d '\r' | grep cluster_state)
    # A replica counts once it follows its master: before that it could not take over.
    linked=0
    for p in "${ports[@]}"; do
      redis-cli -p "$p" info replication | tr -d '\r' | grep -q '^master_link_status:up' && linked=$((linked + 1))
    done
    if [[ $state == cluster_state:ok ]] && ((linked == 3 * replicas)); then
      log "cluster up on ports ${ports[*]}" && echo "$url" && exit 0
    fi
    sleep 0.1
  done
  log "the cluster did not reach cluster_state:ok" && exit 1
  ;;
stop)
  for p in "${ports[@]}"; do redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true; done
  ;;
*) echo "usage: $0 start|stop" >&2 && exit 2 ;;
esac
