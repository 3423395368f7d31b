"""keel-bench queue's Python workers: `library` runs keel_worker.Worker (concurrency 1, a
no-op handler); `naive` and `naive1` are the simplest loop (claim 100, or 1, then one
succeeded report per job, no heartbeat). All stop on SIGTERM.

Usage: python_worker.py library|naive|naive1 BASE_URL INTERNAL_KEY WORKER_ID
"""

import signal
import sys
import time

import httpx


def naive(url: str, key: str, worker_id: str, limit: int = 100) -> None:
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    while not stopping:
        claim = {"worker_id": worker_id, "action": "tracer", "limit": limit}
        jobs = client.post("/api/training/internal/jobs/claim", json=claim).json()["jobs"]
        if not jobs:
            time.sleep(0.005)
            continue
        for job in jobs:
            client.post("/api/training/internal/jobs/succeeded", json={"job_id": job["job_id"], "worker_id": worker_id})


def library(url: str, key: str, worker_id: str) -> None:
    from keel_worker import Worker

    Worker(url, key, worker_id, ["tracer"], lambda job: None, concurrency=1, wait_secs=1).run()


if __name__ == "__main__":
    mode, url, key, worker_id = sys.argv[1:5]
    if mode == "naive1":
        naive(url, key, worker_id, limit=1)
    else:
        {"naive": naive, "library": library}[mode](url, key, worker_id)
