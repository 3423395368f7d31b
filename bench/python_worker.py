"""keel-bench's Python workers: `library` runs keel_worker.Worker (concurrency 1, a no-op
handler), `library10` the same at concurrency 10; `naive` and `naive1` are the simplest loop
(claim 100, or 1, then one succeeded report per job, no heartbeat). All stop on SIGTERM.

With `--go` the process prints `ready` once imported and set up, then waits for a line on
stdin before it works (so a benchmark times the work, not the interpreter's start).

Usage: python_worker.py library|library10|naive|naive1 BASE_URL INTERNAL_KEY WORKER_ID [--go]
"""

import os
import signal
import sys
import time

import httpx


def naive(url: str, key: str, worker_id: str, limit: int = 100) -> None:
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    ready()
    while not stopping:
        claim = {"worker_id": worker_id, "action": "tracer", "limit": limit}
        jobs = client.post("/api/training/internal/jobs/claim", json=claim).json()["jobs"]
        if not jobs:
            time.sleep(0.005)
            continue
        for job in jobs:
            client.post("/api/training/internal/jobs/succeeded", json={"job_id": job["job_id"], "worker_id": worker_id})


def library(url: str, key: str, worker_id: str, concurrency: int = 1) -> None:
    from keel_worker import Worker

    # KEEL_BENCH_PREFETCH: a fixed prefetch (default: the library's own, adaptive).
    prefetch = int(os.environ["KEEL_BENCH_PREFETCH"]) if "KEEL_BENCH_PREFETCH" in os.environ else None
    worker = Worker(url, key, worker_id, ["tracer"], lambda job: None, concurrency=concurrency, wait_secs=1,
                    prefetch=prefetch)
    ready()
    worker.run()


def ready() -> None:
    if "--go" in sys.argv:
        print("ready", flush=True)
        sys.stdin.readline()


if __name__ == "__main__":
    mode, url, key, worker_id = sys.argv[1:5]
    if mode == "naive1":
        naive(url, key, worker_id, limit=1)
    elif mode == "library10":
        library(url, key, worker_id, concurrency=10)
    else:
        {"naive": naive, "library": library}[mode](url, key, worker_id)
