"""Three engram processes on one Postgres and Redis behind HAProxy (scripts/test-scale.sh).

    python three_processes.py ENGRAM_BIN DATABASE_URL REDIS_URL WORK_DIR

1. The idempotency race across processes: the same key and body sent to all three at once
   write once; every answer that succeeds names the same memories.
2. The retention sweep, every second on each process: every expired memory is deleted once,
   by one process, and is gone from the database.
3. Consolidation asked of all three processes at once for the same agents: each episode is
   consolidated once, one summary per session.
4. kill -9 of one process under write load through the balancer: clients retry failed
   requests with the same Idempotency-Key; afterwards every acknowledged write reads back,
   and no retry wrote twice.
Standard library only. Exits non-zero on the first failed check; prints the figures.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

from loopback import free_port, request

BIN, DATABASE_URL, REDIS_URL, WORK = sys.argv[1:5]
PREFIX = f"engram-scale-{os.getpid()}"


def check(condition, what, detail=None):
    if not condition:
        raise AssertionError(f"{what}: {detail!r}" if detail is not None else what)
    print(f"ok  {what}", flush=True)


def wait_ready(url, proc=None, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if request("GET", f"{url}/readyz", timeout=2)[0] == 200:
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url} exited with {proc.returncode}")
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready in {seconds} s")


class Server:
    def __init__(self, name):
        self.name, self.port = name, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(WORK, f"{name}.log"), "w")
        env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_") or k == "ENGRAM_MODEL_DIR"}
        env.update(DATABASE_URL=DATABASE_URL, REDIS_URL=REDIS_URL, ENGRAM_REDIS__KEY_PREFIX=PREFIX,
                   ENGRAM_LOG__FILTER="warn", ENGRAM_EMBEDDING__PROVIDER="lexical-hash",
                   ENGRAM_CONSOLIDATION__MIN_AGE_SECS="0",
                   # Sweeps every second, and transient memories live 2 s (sweep_once).
                   ENGRAM_RETENTION__SWEEP_INTERVAL_SECS="1", ENGRAM_RETENTION__TRANSIENT="2s")
        self.proc = subprocess.Popen([BIN, "serve", "--listen", f"127.0.0.1:{self.port}"], env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def haproxy(servers):
    port = free_port()
    lines = [
        "global", "  maxconn 512",
        "defaults", "  mode http", "  timeout connect 1s", "  timeout client 30s", "  timeout server 30s",
        "  retries 2", "  option redispatch",
        "frontend engram", f"  bind 127.0.0.1:{port}", "  default_backend engrams",
        "backend engrams", "  balance roundrobin", "  option httpchk GET /healthz",
    ]
    lines += [f"  server {s.name} 127.0.0.1:{s.port} check inter 200 fall 1 rise 2" for s in servers]
    config = os.path.join(WORK, "haproxy.cfg")
    with open(config, "w") as f:
        f.write("\n".join(lines) + "\n")
    log = open(os.path.join(WORK, "haproxy.log"), "w")
    proc = subprocess.Popen(["haproxy", "-f", config, "-db"], stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def listed(base, agent):
    ids, cursor = [], None
    while True:
        url = f"{base}/v1/memories?agent_id={agent}&limit=200" + (f"&cursor={cursor}" if cursor else "")
        status, page = request("GET", url)
        if status != 200:
            raise AssertionError(f"listing {agent}: {status} {page}")
        ids += [m["id"] for m in page["memories"]]
        cursor = page.get("next_cursor")
        if not cursor:
            return ids


def idempotency_race(servers):
    agent = f"race-{uuid.uuid4().hex[:8]}"
    keys = 20
    outcomes = {}
    for n in range(keys):
        key = f"race-{uuid.uuid4()}"
        body = {"memories": [{"agent_id": agent, "tier": "episodic", "content": f"race write {n}"}]}
        answers = [None] * len(servers)

        def send(i):
            answers[i] = request("POST", f"{servers[i].url}/v1/memories", body, key)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(servers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        outcomes[key] = answers
    statuses = sorted({s for answers in outcomes.values() for s, _ in answers})
    for key, answers in outcomes.items():
        ok = [b for s, b in answers if s in (200, 201)]
        # The others may only be told the key is still in progress (409).
        others = [s for s, _ in answers if s not in (200, 201)]
        ids = {tuple(m["id"] for m in b["memories"]) for b in ok}
        if not ok or len(ids) != 1 or any(s != 409 for s in others):
            raise AssertionError(f"key {key}: {answers}")
    check(True, f"same key and body at three processes at once, {keys} times: one set of ids per key "
                f"(statuses seen {statuses})")
    check(len(listed(servers[0].url, agent)) == keys, f"{keys} keys wrote {keys} memories")


def kill_under_load(servers, balancer):
    """Writers keep writing through the balancer from 1 s before the kill to 3 s after it."""
    agent = f"load-{uuid.uuid4().hex[:8]}"
    writers = 8
    acknowledged = {}  # key -> (id, content)
    errors, lock, stop = [], threading.Lock(), threading.Event()
    last_error_at = [0.0]

    def writer(w):
        n = 0
        while not stop.is_set():
            key, content = f"load-{uuid.uuid4()}", f"writer {w} write {n}"
            n += 1
            body = {"agent_id": agent, "tier": "episodic", "content": content}
            for attempt in range(40):
                status, answer = request("POST", f"{balancer}/v1/memories", body, key)
                if status in (200, 201):
                    with lock:
                        acknowledged[key] = (answer["memories"][0]["id"], content)
                    break
                with lock:
                    errors.append(status)
                    last_error_at[0] = time.time()
                time.sleep(0.05 * (attempt + 1))
            else:
                raise AssertionError(f"{key} never acknowledged")

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    started = time.time()
    for t in threads:
        t.start()
    time.sleep(1.0)
    before = len(acknowledged)
    killed_at = time.time()
    servers[1].kill()
    time.sleep(3.0)
    stop.set()
    for t in threads:
        t.join()
    took = time.time() - started
    total = len(acknowledged)
    check(total > before > 0, f"{total} writes acknowledged through the balancer ({before} before the kill)")
    # Every acknowledged write reads back, from the processes still up.
    missing = []
    for key, (mid, content) in acknowledged.items():
        status, memory = request("GET", f"{balancer}/v1/memories/{mid}")
        if status != 200 or memory["content"] != content:
            missing.append((key, status))
    check(not missing, "every acknowledged write reads back after the kill", missing[:5])
    ids = listed(balancer, agent)
    check(len(ids) == total and len(set(ids)) == total, "no retry wrote twice (one memory per key)", len(ids))
    window = (last_error_at[0] - killed_at) if errors else 0.0
    print(f"figures: {total} writes by {writers} writers in {took:.1f} s ({total / took:.0f}/s), "
          f"{len(errors)} failed attempts retried (statuses {sorted(set(errors))}), "
          f"last failure {window:.2f} s after the kill", flush=True)


def expired_deleted(server):
    """What the process's sweeps have deleted as expired, in every tier."""
    status, text = request("GET", f"{server.url}/metrics")
    if status != 200:
        raise AssertionError(f"metrics of {server.name}: {status}")
    return sum(int(float(v)) for labels, v in re.findall(r'^engram_retention_deleted_total\{([^}]*)\} (\S+)$',
                                                      text, re.M) if 'reason="expired"' in labels)


def sweep_once(servers, balancer):
    agent = f"sweep-{uuid.uuid4().hex[:8]}"
    total = 300
    before = sum(expired_deleted(s) for s in servers)
    for start in range(0, total, 100):
        memories = [{"agent_id": agent, "tier": "episodic", "retention": "transient", "content": f"passing note {n}"}
                    for n in range(start, start + 100)]
        status, body = request("POST", f"{balancer}/v1/memories", {"memories": memories})
        if status != 201:
            raise AssertionError(f"transient memories: {status} {body}")
    deleted, per_process = 0, []
    deadline = time.time() + 20
    while time.time() < deadline:
        per_process = [expired_deleted(s) for s in servers]
        deleted = sum(per_process) - before
        if deleted >= total:
            break
        time.sleep(0.5)
    # Sweeps go on meanwhile; none may count a memory a second time.
    time.sleep(2)
    deleted = sum(expired_deleted(s) for s in servers) - before
    check(deleted == total, f"{total} expired memories deleted once by the three processes' sweeps "
                            f"(expired deletions counted per process: {per_process})", deleted)
    rows = subprocess.run([os.path.join(os.environ["ENGRAM_PG_BIN"], "psql"), "-X", "-qAt", DATABASE_URL, "-c",
                           f"SELECT count(*) FROM episodic_memory WHERE agent_id = '{agent}'"],
                          capture_output=True, text=True, check=True).stdout.strip()
    check(rows == "0", "and gone from the database", rows)


def consolidation_once(servers, balancer):
    agents = [f"cons-{uuid.uuid4().hex[:8]}" for _ in range(6)]
    per_agent = 4
    for a in agents:
        memories = [{"agent_id": a, "user_id": "ann", "session_id": "s1", "tier": "episodic",
                     "content": f"Episode {n}: we decided to ship release {n} on Friday."} for n in range(per_agent)]
        status, _ = request("POST", f"{balancer}/v1/memories", {"memories": memories})
        check(status == 201, f"episodes of {a} written", status)
    jobs = []  # (agent, job id)
    lock = threading.Lock()

    def ask(server, agent):
        status, job = request("POST", f"{server.url}/v1/consolidation", {"agent_id": agent})
        if status != 202:
            raise AssertionError(f"consolidation of {agent} at {server.name}: {status} {job}")
        with lock:
            jobs.append((agent, job["id"]))

    threads = [threading.Thread(target=ask, args=(s, a)) for a in agents for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    episodes = {a: 0 for a in agents}
    for agent, job_id in jobs:
        for _ in range(300):
            status, job = request("GET", f"{balancer}/v1/consolidation/{job_id}")
            if status == 200 and job["state"] in ("completed", "failed"):
                break
            time.sleep(0.1)
        if job["state"] != "completed":
            raise AssertionError(f"job {job_id} of {agent}: {job}")
        episodes[agent] += job["report"]["episodes"]
    check(all(n == per_agent for n in episodes.values()),
          f"{len(jobs)} jobs on three processes consolidated each of {len(agents) * per_agent} episodes once",
          episodes)
    for a in agents:
        status, page = request("GET", f"{balancer}/v1/memories?agent_id={a}&tier=episodic&limit=200")
        summaries = [m for m in page["memories"] if "consolidation" in (m.get("metadata") or {})]
        if len(summaries) != 1:
            raise AssertionError(f"{a}: {len(summaries)} summaries")
    check(True, "one summary per agent's session")


def main():
    servers = [Server(f"engram{i}") for i in range(1, 4)]
    proc = None
    try:
        for s in servers:
            wait_ready(s.url, s.proc)
        proc, balancer = haproxy(servers)
        wait_ready(balancer, proc)
        idempotency_race(servers)
        sweep_once(servers, balancer)
        consolidation_once(servers, balancer)
        kill_under_load(servers, balancer)
        print("three_processes.py: all checks passed", flush=True)
    finally:
        for s in servers:
            if s.proc.poll() is None:
                s.proc.terminate()
                s.proc.wait()
        if proc is not None:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
