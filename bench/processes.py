"""Latency and throughput of engram on loopback with one process or several
(scripts/bench-processes.sh).

    python processes.py search  ENGRAM_BIN DATABASE_URL REDIS_URL WORK_DIR LOCOMO_JSON
    python processes.py working ENGRAM_BIN DATABASE_URL REDIS_URL WORK_DIR

search: the LoCoMo turns are written (one agent per conversation, one episodic memory per
  turn, with the server's default embedder), then every question of categories 1-4 is asked
  as a search (top_k 10) and as a context (8,000 tokens, as in bench-recall) at concurrency 1 and 8: first
  of one process addressed directly, then of three processes on the same Postgres and Redis
  behind HAProxy (round-robin), then of the one process again (the machine's drift).
working: one process (lexical-hash embedder: working memory is the subject, not the model)
  on REDIS_URL, a single Redis or a cluster. 48 sessions of one agent are filled with 50
  entries each; then single working-memory writes and session listings (GET
  /v1/memories?tier=working&session_id=...) at concurrency 1 and 8.
Each row is a fixed number of requests over keep-alive connections, one per client thread;
p50/p95/p99 are client side (send to last body byte). The client runs on the same cores as
the servers. Standard library only. Exits non-zero when a run could not be carried out.
"""

import http.client
import json
import os
import subprocess
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "scale"))
from loopback import free_port, request  # noqa: E402

WARMUP = 20


class Server:
    def __init__(self, binary, work, name, env):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(work, f"{name}.log"), "w")
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("ENGRAM_", "DATABASE_", "REDIS_")) or k == "ENGRAM_MODEL_DIR"}
        # The rate limit is for clients sharing a server, not for a load generator.
        base.update(ENGRAM_LOG__FILTER="warn", ENGRAM_LIMITS__REQUESTS_PER_SECOND="0", **env)
        self.proc = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{self.port}"], env=base,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while request("GET", f"{self.url}/readyz", timeout=2)[0] != 200:
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"engram did not start; see {self.log.name}")
            time.sleep(0.2)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def haproxy(servers, work):
    port = free_port()
    lines = [
        "global", "  maxconn 512",
        "defaults", "  mode http", "  timeout connect 1s", "  timeout client 60s", "  timeout server 60s",
        "  option http-keep-alive",
        "frontend engram", f"  bind 127.0.0.1:{port}", "  default_backend engrams",
        "backend engrams", "  balance roundrobin", "  option httpchk GET /healthz",
    ]
    lines += [f"  server e{i} 127.0.0.1:{s.port} check inter 1000" for i, s in enumerate(servers)]
    config = os.path.join(work, "haproxy.cfg")
    with open(config, "w") as f:
        f.write("\n".join(lines) + "\n")
    proc = subprocess.Popen(["haproxy", "-f", config, "-db"], stdout=open(os.path.join(work, "haproxy.log"), "w"),
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 20
    while request("GET", f"{url}/readyz", timeout=2)[0] != 200:
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError("haproxy did not start")
        time.sleep(0.2)
    return proc, url


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def run(url, calls, concurrency):
    """Sends `calls` ((method, path, body) each) over `concurrency` keep-alive
    connections; returns (latencies ms, wall seconds). A non-2xx answer stops the run."""
    host, port = url.split("://", 1)[1].split(":")
    latencies, errors, lock, cursor = [], [], threading.Lock(), [0]

    def client():
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        while True:
            with lock:
                if cursor[0] >= len(calls) or errors:
                    break
                method, path, body = calls[cursor[0]]
                cursor[0] += 1
            data = json.dumps(body).encode() if body is not None else None
            headers = {"content-type": "application/json"} if data else {}
            began = time.perf_counter()
            conn.request(method, path, body=data, headers=headers)
            answer = conn.getresponse()
            raw = answer.read()
            ms = (time.perf_counter() - began) * 1000
            with lock:
                if answer.status >= 300:
                    errors.append(f"{method} {path}: {answer.status} {raw[:200]!r}")
                latencies.append(ms)
        conn.close()

    began = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(errors[0])
    return latencies, time.perf_counter() - began


def measure(label, url, name, calls, concurrency):
    run(url, calls[:WARMUP], concurrency)
    latencies, wall = run(url, calls, concurrency)
    print(f"| {label} | {name} | {concurrency} | {len(latencies)} | {pct(latencies, 50):.1f} | "
          f"{pct(latencies, 95):.1f} | {pct(latencies, 99):.1f} | {len(latencies) / wall:.0f} |", flush=True)


HEADER = ("| setup | call | concurrency | requests | p50 ms | p95 ms | p99 ms | req/s |\n"
          "|---|---|---:|---:|---:|---:|---:|---:|")


def write_locomo(url, path, tag):
    """One agent per conversation, one episodic memory per turn (50 per request);
    returns the search and context calls of its questions (categories 1-4)."""
    searches, contexts = [], []
    for conv in json.load(open(path)):
        agent = f"{tag}-{conv['sample_id']}"
        talk = conv["conversation"]
        turns = []
        n = 1
        while f"session_{n}" in talk:
            for turn in talk[f"session_{n}"]:
                turns.append({"agent_id": agent, "tier": "episodic", "session_id": f"session-{n}",
                              "content": f"{turn['speaker']}: {turn['text']}"})
            n += 1
        for i in range(0, len(turns), 50):
            status, body = request("POST", f"{url}/v1/memories", {"memories": turns[i:i + 50]}, timeout=120)
            if status != 201:
                raise RuntimeError(f"writing {agent}: {status} {body}")
        for qa in conv["qa"]:
            if qa.get("category") in (1, 2, 3, 4):
                searches.append(("POST", "/v1/memories/search",
                                 {"agent_id": agent, "query": qa["question"], "top_k": 10}))
                contexts.append(("POST", "/v1/context",
                                 {"agent_id": agent, "query": qa["question"], "max_context_tokens": 8000}))
    return searches, contexts


def search_bench(binary, database_url, redis_url, work, locomo):
    env = {"DATABASE_URL": database_url, "REDIS_URL": redis_url,
           "ENGRAM_REDIS__KEY_PREFIX": f"engram-processes-{os.getpid()}"}
    first = Server(binary, work, "p0", env)
    others, balancer = [], None
    try:
        began = time.time()
        searches, contexts = write_locomo(first.url, locomo, f"processes-{uuid.uuid4().hex[:6]}")
        print(f"wrote the LoCoMo turns in {time.time() - began:.0f} s; {len(searches)} questions\n")
        print(HEADER)

        def all_rows(label, url):
            for concurrency in (1, 8):
                measure(label, url, "search", searches, concurrency)
                measure(label, url, "context", contexts, concurrency)

        all_rows("1 process", first.url)
        others = [Server(binary, work, f"p{i}", env) for i in (1, 2)]
        balancer, url = haproxy([first] + others, work)
        all_rows("3 processes + HAProxy", url)
        balancer.terminate()
        balancer.wait()
        balancer = None
        for s in others:
            s.stop()
        others = []
        all_rows("1 process, again", first.url)
    finally:
        if balancer is not None:
            balancer.terminate()
        for s in [first] + others:
            s.stop()


def working_bench(binary, database_url, redis_url, work):
    server = Server(binary, work, "working", {
        "DATABASE_URL": database_url, "REDIS_URL": redis_url, "ENGRAM_EMBEDDING__PROVIDER": "lexical-hash",
        "ENGRAM_REDIS__KEY_PREFIX": f"engram-processes-{os.getpid()}"})
    try:
        agent, sessions = f"working-{uuid.uuid4().hex[:8]}", [f"s{n}" for n in range(48)]
        for session in sessions:
            status, body = request("POST", f"{server.url}/v1/memories", {"memories": [
                {"agent_id": agent, "session_id": session, "tier": "working", "content": f"turn {i} of {session}"}
                for i in range(50)]})
            if status != 201:
                raise RuntimeError(f"filling {session}: {status} {body}")
        writes = [("POST", "/v1/memories", {"memories": [
            {"agent_id": agent, "session_id": sessions[n % 48], "tier": "working", "content": f"later note {n}"}]})
            for n in range(2000)]
        lists = [("GET", f"/v1/memories?agent_id={agent}&session_id={sessions[n % 48]}&tier=working&limit=50",
                  None) for n in range(2000)]
        print(HEADER)
        for concurrency in (1, 8):
            measure("working", server.url, "write", writes, concurrency)
            measure("working", server.url, "list a session", lists, concurrency)
    finally:
        server.stop()


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "search" and len(sys.argv) == 7:
        search_bench(*sys.argv[2:7])
    elif mode == "working" and len(sys.argv) == 6:
        working_bench(*sys.argv[2:6])
    else:
        sys.exit(__doc__)
