"""What a client sees while a part of a scaled-out engram dies (scripts/bench-failover.sh).

    python failover.py redis   ENGRAM_BIN DATABASE_URL CLUSTER_URL WORK_DIR
    python failover.py replica ENGRAM_BIN PRIMARY_URL REPLICA_URL PG_BIN REPLICA_DATA WORK_DIR

redis: one engram on Postgres and a Redis Cluster of three masters, each with a replica.
  Clients write working memories to 48 sessions (spread over the cluster's slots) and list
  them; after 4 s one master gets kill -9. Printed: the answers per second around the kill,
  when the cluster promoted the replica, the first and last failed request after the kill,
  and how many acknowledged working memories were missing afterwards (Redis replicates
  asynchronously; the outbox writes again what engram kept out of Redis).
replica: one engram with DATABASE_READ_URL on a hot standby. Clients search while another
  writes; the replication lag is sampled on the primary. Then the standby is killed
  (kill -9), started again, and later frozen (SIGSTOP) and thawed: printed are the failed
  searches (none are expected: a read that fails on the replica is done on the primary),
  the slowest searches, and how long after the standby answered again reads were served
  there.
Both embed with the lexical-hash provider: the subject is the failover, not the model.
Standard library only. Exits non-zero when a run could not be carried out.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "scale"))
from loopback import free_port, request  # noqa: E402


class Server:
    """`engram serve` with the given environment (no API keys: one tenant)."""

    def __init__(self, binary, work, name, env):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(work, f"{name}.log"), "w")
        base = {k: v for k, v in os.environ.items() if not k.startswith(("ENGRAM_", "DATABASE_", "REDIS_"))}
        base.update(ENGRAM_LOG__FILTER="warn", ENGRAM_EMBEDDING__PROVIDER="lexical-hash", **env)
        self.proc = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{self.port}"], env=base,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while request("GET", f"{self.url}/readyz", timeout=2)[0] != 200:
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"engram did not start; see {self.log.name}")
            time.sleep(0.2)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


class Load:
    """Threads that each call `op(n)` in a loop; every call is recorded as
    (seconds since start, name, status, milliseconds)."""

    def __init__(self):
        self.records, self.lock, self.stopping, self.threads = [], threading.Lock(), False, []
        self.start = time.monotonic()

    def now(self):
        return time.monotonic() - self.start

    def run(self, name, op, threads=1):
        def loop(worker):
            n = 0
            while not self.stopping:
                began = self.now()
                status = op(worker, n)
                with self.lock:
                    self.records.append((began, name, status, (self.now() - began) * 1000))
                n += 1
                # A failed request is sent again after 100 ms: soon enough to see
                # when service comes back, without flooding the rate limit
                # (Retry-After, 5 s by default, would hide that moment).
                if status not in (200, 201):
                    time.sleep(0.1)

        for worker in range(threads):
            t = threading.Thread(target=loop, args=(worker,), daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self):
        self.stopping = True
        for t in self.threads:
            t.join()


def pct(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def timeline(records, origin, names, step=1.0, until=None):
    """Answers per `step` seconds around `origin`: counts by status, p95 and slowest ms."""
    print(f"| seconds from the kill | {' | '.join(names)} | p95 ms | slowest ms |")
    print("|---:|" + "---|" * len(names) + "---:|---:|")
    first, last = min(r[0] for r in records), max(r[0] for r in records)
    t = origin + step * int((first - origin) // step)
    while t <= min(last, until if until is not None else last):
        window = [r for r in records if t <= r[0] < t + step]
        cells = []
        for name in names:
            statuses = {}
            for r in window:
                if r[1] == name:
                    statuses[r[2]] = statuses.get(r[2], 0) + 1
            cells.append(", ".join(f"{c} × {s or 'no answer'}" for s, c in sorted(statuses.items())) or "-")
        ms = [r[3] for r in window]
        print(f"| {t - origin:+.0f} to {t - origin + step:+.0f} | {' | '.join(cells)} | "
              f"{pct(ms, 95):.0f} | {max(ms, default=0):.0f} |")
        t += step


def redis_cli(port, *args):
    out = subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True, timeout=5)
    return out.stdout.replace("\r", "")


def redis_failover(binary, database_url, cluster_url, work):
    ports = [int(p.rsplit(":", 1)[1]) for p in cluster_url.split("://", 1)[1].split(",")]
    masters = [n for n in (line.split() for line in redis_cli(ports[0], "cluster", "nodes").splitlines())
               if "master" in n[2].split(",")]
    if len(masters) != 3 or len(ports) != 6:
        raise RuntimeError(f"expected 3 masters with a replica each, found {len(masters)} masters, {len(ports)} nodes")
    prefix = f"engram-failover-{os.getpid()}"
    server = Server(binary, work, "redis", {
        "DATABASE_URL": database_url, "REDIS_URL": cluster_url, "ENGRAM_REDIS__KEY_PREFIX": prefix,
        # The outbox writes the working memories a failed Redis call kept out; at its
        # default interval (10 s) the check afterwards would only wait longer.
        "ENGRAM_REDIS__OUTBOX_INTERVAL_SECS": "1",
    })
    agent, sessions = f"failover-{uuid.uuid4().hex[:8]}", [f"s{n}" for n in range(48)]
    acknowledged, ack_lock = {}, threading.Lock()

    def write(worker, n):
        session = sessions[(worker * 7 + n) % len(sessions)]
        content = f"note {worker}-{n} for {session}"
        status, body = request("POST", f"{server.url}/v1/memories", {"memories": [
            {"agent_id": agent, "session_id": session, "tier": "working", "content": content}]},
            key=str(uuid.uuid4()))
        if status == 201:
            with ack_lock:
                acknowledged[body["memories"][0]["id"]] = session
        return status

    def read(worker, n):
        session = sessions[(worker * 11 + n) % len(sessions)]
        return request("GET", f"{server.url}/v1/memories?agent_id={agent}&session_id={session}&tier=working")[0]

    # The victim: the first master, with its replica's port.
    victim_id, victim_port = masters[0][0], int(masters[0][1].split("@")[0].rsplit(":", 1)[1])
    survivor = next(p for p in ports if p != victim_port)
    pid = int(re.search(r"process_id:(\d+)", redis_cli(victim_port, "info", "server")).group(1))
    load = Load()
    load.run("write", write, threads=3)
    load.run("list", read, threads=1)
    time.sleep(4)
    killed = load.now()
    os.kill(pid, signal.SIGKILL)
    failed_at = promoted_at = None
    while load.now() - killed < 20:
        # `cluster nodes` lines: id, address, flags (e.g. "master,fail"), ...
        nodes = [line.split() for line in redis_cli(survivor, "cluster", "nodes").splitlines()]
        flags = {n[0]: n[2].split(",") for n in nodes if len(n) > 2}
        if failed_at is None and "fail" in flags.get(victim_id, []):
            failed_at = load.now() - killed
        serving = [i for i, f in flags.items() if "master" in f and "fail" not in f and "fail?" not in f]
        if (promoted_at is None and failed_at is not None and len(serving) == 3
                and "cluster_state:ok" in redis_cli(survivor, "cluster", "info")):
            promoted_at = load.now() - killed
        time.sleep(0.05)
    load.stop()
    # Afterwards: every acknowledged working memory should be listed in its session, once
    # the outbox has had its turns.
    missing = set(acknowledged)
    deadline = time.time() + 20
    while missing and time.time() < deadline:
        time.sleep(2)
        listed = set()
        for session in sessions:
            cursor = None
            while True:
                status, page = request("GET", f"{server.url}/v1/memories?agent_id={agent}&session_id={session}"
                                              f"&tier=working&limit=200" + (f"&cursor={cursor}" if cursor else ""))
                if status != 200:
                    break
                listed |= {m["id"] for m in page["memories"]}
                cursor = page.get("next_cursor")
                if not cursor:
                    break
        missing -= listed
    server.stop()

    print(f"\n### Redis Cluster: one of three masters killed (node timeout from the cluster's config)\n")
    timeline(load.records, killed, ["write", "list"])
    after = [r for r in load.records if r[0] >= killed]
    bad = [r for r in after if r[2] not in (200, 201)]
    print()
    print(f"- requests before the kill: {sum(r[0] < killed for r in load.records)}, all answered "
          f"{sorted({r[2] for r in load.records if r[0] < killed})}")
    print(f"- the cluster flagged the master failed after {failed_at:.2f} s and had all slots served "
          f"again (replica promoted) after {promoted_at:.2f} s" if promoted_at is not None else
          f"- the cluster did not recover within 20 s (flagged failed: {failed_at})")
    if bad:
        print(f"- failed requests after the kill: {len(bad)} of {len(after)} "
              f"({', '.join(f'{s}: {sum(r[2] == s for r in bad)}' for s in sorted({r[2] for r in bad}))}); "
              f"first sent {bad[0][0] - killed:.2f} s after the kill, last sent {bad[-1][0] - killed:.2f} s after")
    else:
        print(f"- failed requests after the kill: 0 of {len(after)}")
    print(f"- slowest answer after the kill: {max(r[3] for r in after):.0f} ms")
    print(f"- acknowledged working memories: {len(acknowledged)}; missing afterwards: {len(missing)}")


def psql(pg_bin, url, sql):
    out = subprocess.run([os.path.join(pg_bin, "psql"), "-X", "-qAt", url, "-c", sql],
                         capture_output=True, text=True, timeout=10)
    return out.stdout.strip()


def replica_counts(server):
    status, text = request("GET", f"{server.url}/metrics", timeout=5)
    counts = {}
    for outcome, value in re.findall(r'engram_replica_reads_total\{outcome="(\w+)"\} (\d+)', text or ""):
        counts[outcome] = int(value)
    return counts


def standby_pids(data):
    with open(os.path.join(data, "postmaster.pid")) as f:
        postmaster = int(f.readline())
    children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True).stdout.split()
    return postmaster, [int(c) for c in children]


def replica_failover(binary, primary_url, replica_url, pg_bin, replica_data, work):
    database = f"engram_failover_{os.getpid()}"
    psql(pg_bin, primary_url, f"CREATE DATABASE {database}")
    primary_db, replica_db = primary_url.rsplit("/", 1)[0] + f"/{database}", replica_url.rsplit("/", 1)[0] + f"/{database}"
    server = None
    try:
        subprocess.run([binary, "migrate"], check=True, capture_output=True,
                       env={**os.environ, "DATABASE_URL": primary_db, "ENGRAM_EMBEDDING__PROVIDER": "lexical-hash"})
        server = Server(binary, work, "replica", {"DATABASE_URL": primary_db, "DATABASE_READ_URL": replica_db})
        agent = f"failover-{uuid.uuid4().hex[:8]}"
        words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november".split()
        for batch in range(20):
            status, _ = request("POST", f"{server.url}/v1/memories", {"memories": [
                {"agent_id": agent, "tier": "episodic",
                 "content": f"{words[(batch + i) % 14]} {words[(batch * 3 + i) % 14]} entry {batch}-{i}"}
                for i in range(50)]})
            if status != 201:
                raise RuntimeError(f"seeding answered {status}")
        time.sleep(2)

        def search(worker, n):
            return request("POST", f"{server.url}/v1/memories/search",
                           {"agent_id": agent, "query": f"{words[n % 14]} {words[(n * 5 + worker) % 14]}", "top_k": 5})[0]

        def write(worker, n):
            return request("POST", f"{server.url}/v1/memories", {"memories": [
                {"agent_id": agent, "tier": "episodic", "content": f"{words[n % 14]} later entry {n}-{i}"}
                for i in range(10)]})[0]

        load = Load()
        lag, counts = [], []
        watching = True

        def watch():
            while watching:
                row = psql(pg_bin, primary_url, "SELECT COALESCE(EXTRACT(EPOCH FROM replay_lag) * 1000, 0), "
                                                "pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn) FROM pg_stat_replication")
                if row:
                    ms, behind = row.split("|")
                    lag.append((load.now(), float(ms), int(float(behind))))
                counts.append((load.now(), replica_counts(server)))
                time.sleep(0.1)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        load.run("search", search, threads=2)
        load.run("write", write, threads=1)
        time.sleep(8)
        # 1. The standby dies.
        postmaster, _ = standby_pids(replica_data)
        killed = load.now()
        os.kill(postmaster, signal.SIGKILL)
        time.sleep(8)
        # 2. It comes back (services.sh starts whatever of the test services is not running).
        began = load.now()
        subprocess.run(["bash", "scripts/services.sh", "start"], check=True, capture_output=True)
        back = load.now()
        served_before = counts[-1][1].get("served", 0)
        while load.now() - back < 20 and counts[-1][1].get("served", 0) == served_before:
            time.sleep(0.1)
        served_again = load.now() - back
        time.sleep(3)
        # 3. The standby hangs: every one of its processes stopped, then continued.
        postmaster, children = standby_pids(replica_data)
        frozen = load.now()
        for pid in [postmaster, *children]:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(12)
        for pid in [postmaster, *children]:
            os.kill(pid, signal.SIGCONT)
        thawed = load.now()
        time.sleep(6)
        load.stop()
        watching = False
        watcher.join()
        ended = load.now()
    finally:
        if server is not None:
            server.stop()
        psql(pg_bin, primary_url, f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")

    def aside(c):
        # Reads the replica failed, and reads sent to the primary while it was left alone.
        return c.get("failed", 0) + c.get("resting", 0)

    def phase(name, start, end):
        rows = [r for r in load.records if start <= r[0] < end]
        searches = [r for r in rows if r[1] == "search"]
        writes = [r for r in rows if r[1] == "write"]
        failed = [r for r in rows if r[2] not in (200, 201)]
        before = next((c for t, c in counts if t >= start), {})
        after = next((c for t, c in reversed(counts) if t < end), {})
        served = after.get("served", 0) - before.get("served", 0)
        print(f"| {name} | {end - start:.0f} | {len(searches)} | {pct([r[3] for r in searches], 50):.0f} | "
              f"{pct([r[3] for r in searches], 95):.0f} | {max((r[3] for r in searches), default=0):.0f} | "
              f"{sum(r[3] > 1000 for r in searches)} | {len(writes)} | {len(failed)} | {served} | "
              f"{after.get('behind', 0) - before.get('behind', 0)} | {aside(after) - aside(before)} |")

    print("\n### Read replica: searches while the standby is killed, restarted, frozen and thawed\n")
    print("| phase | s | searches | p50 ms | p95 ms | slowest ms | over 1 s | writes (10 each) | failed requests "
          "| reads served by the replica | sent to the primary: behind | sent there: replica failed or left alone |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    phase("standby up, under write load", 0, killed)
    phase("standby killed", killed, began)
    phase("standby starting (services.sh)", began, back)
    phase("standby up again", back, frozen)
    phase("standby frozen (SIGSTOP)", frozen, thawed)
    phase("standby thawed", thawed, ended)
    slow = [(r[0], r[3]) for r in load.records if r[1] == "search" and r[3] > 1000]
    print("\n- searches over 1 s (start, from the start of the load; ms): "
          + (", ".join(f"{t:.1f} s: {ms:.0f}" for t, ms in slow) or "none")
          + f"; the standby was killed at {killed:.1f} s, answered again at {back:.1f} s, "
          f"was frozen at {frozen:.1f} s and thawed at {thawed:.1f} s")
    up = [x for x in lag if x[0] < killed]
    print(f"\n- replication lag while up (sampled every 0.1 s on the primary, {len(up)} samples): replay_lag "
          f"p50 {pct([x[1] for x in up], 50):.1f} ms, p95 {pct([x[1] for x in up], 95):.1f} ms, "
          f"max {max((x[1] for x in up), default=0):.1f} ms; WAL not yet replayed p50 "
          f"{pct([x[2] for x in up], 50):.0f} B, max {max((x[2] for x in up), default=0):.0f} B")
    print(f"- the standby took {back - began:.1f} s to start again; reads were served there again "
          f"{served_again:.1f} s after it answered")


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "redis":
        redis_failover(*sys.argv[2:6])
    elif len(sys.argv) == 8 and sys.argv[1] == "replica":
        replica_failover(*sys.argv[2:8])
    else:
        sys.exit(__doc__)
