"""HTTP helpers for the programs that drive engram servers on loopback
(tests/scale/three_processes.py, bench/failover.py). Standard library only."""

import json
import socket
import urllib.error
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(method, url, body=None, key=None, timeout=30):
    """(status, parsed JSON body, or the text of another body); status 0 when
    the connection failed or timed out."""
    headers = {"content-type": "application/json"} if body is not None else {}
    if key:
        headers["idempotency-key"] = key
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            kind = r.headers.get("content-type", "")
            return r.status, json.loads(raw) if raw and "json" in kind else (raw.decode() or None)
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw) if raw else None
        except ValueError:
            return e.code, None
    except (urllib.error.URLError, ConnectionError, TimeoutError, socket.timeout):
        return 0, None
