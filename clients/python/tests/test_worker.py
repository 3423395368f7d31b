"""keel-worker against the real keel binary on PostgreSQL."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List

import httpx
import pytest

from conftest import INTERNAL_KEY, Keel, Running
from keel_worker import Blocked, DatasetMismatch, Job, KeelError, RetryableError, Worker

RunWorker = Callable[[Worker], Running]


def outcomes(view: Dict[str, Any]) -> List[str]:
    return [attempt["outcome"] for attempt in view["history"]]


def test_a_returned_value_is_the_succeeded_result(keel: Keel, run_worker: RunWorker) -> None:
    job_id = keel.create_job(epochs=3)
    seen: List[Job] = []

    def handler(job: Job) -> Any:
        seen.append(job)
        return {"adapter": "acme/bot", "epochs": job.payload["input"]["epochs"]}

    running = run_worker(keel.worker(handler))
    view = keel.wait_for(job_id, ["succeeded"])
    running.stop()
    assert view["result"] == {"adapter": "acme/bot", "epochs": 3}
    assert view["workerId"] == "py-worker"
    assert outcomes(view) == ["succeeded"]
    (job,) = seen
    assert (job.job_id, job.org_id, job.project_id, job.action, job.attempt) == (
        job_id, keel.org_id, keel.project_id, "tracer", 1)
    assert not job.stop_requested.is_set()
    assert running.worker.reported == {"succeeded": 1}


def test_an_exception_fails_the_job_with_its_message(keel: Keel, run_worker: RunWorker) -> None:
    raising = keel.create_job(kind="raise")
    unserializable = keel.create_job(kind="object")

    def handler(job: Job) -> Any:
        if job.payload["input"]["kind"] == "raise":
            raise ValueError("the dataset has no rows")
        return {"when": object()}

    running = run_worker(keel.worker(handler, concurrency=2))
    failed = keel.wait_for(raising, ["failed"])
    odd = keel.wait_for(unserializable, ["failed"])
    running.stop()
    assert failed["error"] == "ValueError: the dataset has no rows"
    assert outcomes(failed) == ["failed"]
    assert "not JSON" in odd["error"]


def test_retryable_error_schedules_another_attempt(keel: Keel, run_worker: RunWorker) -> None:
    job_id = keel.create_job()
    attempts: List[int] = []

    def handler(job: Job) -> Any:
        attempts.append(job.attempt)
        if job.attempt == 1:
            raise RetryableError("the GPU node went away")
        return {"attempt": job.attempt}

    running = run_worker(keel.worker(handler))
    view = keel.wait_for(job_id, ["succeeded"], timeout=30)
    running.stop()
    assert attempts == [1, 2]
    assert view["result"] == {"attempt": 2}
    assert outcomes(view) == ["retried", "succeeded"]
    assert view["history"][0]["error"] == "RetryableError: the GPU node went away"


def test_blocked_ends_the_job_blocked_with_its_reason(keel: Keel, run_worker: RunWorker) -> None:
    raised = keel.create_job(how="raise")
    returned = keel.create_job(how="return")

    def handler(job: Job) -> Any:
        if job.payload["input"]["how"] == "raise":
            raise Blocked("no GPU quota left")
        return Blocked("dataset missing")

    running = run_worker(keel.worker(handler, concurrency=2))
    assert keel.wait_for(raised, ["blocked"])["error"] == "no GPU quota left"
    assert keel.wait_for(returned, ["blocked"])["error"] == "dataset missing"
    running.stop()


def test_a_stop_request_reaches_the_handler_and_ends_user_stopped(keel: Keel, run_worker: RunWorker) -> None:
    job_id = keel.create_job()
    started = threading.Event()
    noticed: List[bool] = []

    def handler(job: Job) -> Any:
        started.set()
        noticed.append(job.stop_requested.wait(30))
        return {"partial": True}

    running = run_worker(keel.worker(handler, heartbeat_secs=0.2))
    assert started.wait(20)
    keel.ok(keel.api.post(f"/api/training/jobs/{job_id}/stop", json={"reason": "wrong dataset"}))
    view = keel.wait_for(job_id, ["user_stopped"])
    running.stop()
    assert noticed == [True]
    assert outcomes(view) == ["user_stopped"]
    assert running.worker.reported == {"user-stopped": 1}


def test_jobs_run_at_most_concurrency_at_once(keel: Keel, run_worker: RunWorker) -> None:
    jobs = [keel.create_job(n=n) for n in range(6)]
    lock = threading.Lock()
    now = [0]
    peak = [0]

    def handler(job: Job) -> Any:
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        time.sleep(0.5)
        with lock:
            now[0] -= 1
        return None

    running = run_worker(keel.worker(handler, concurrency=3))
    for job_id in jobs:
        keel.wait_for(job_id, ["succeeded"])
    running.stop()
    assert peak[0] == 3


def test_a_restarted_worker_hands_back_what_it_held(keel: Keel, run_worker: RunWorker) -> None:
    job_id = keel.create_job()
    claimed = keel.ok(keel.internal.post("/api/training/internal/jobs/claim",
                                         json={"worker_id": "py-crashed", "action": "tracer", "limit": 1}))
    assert [j["job_id"] for j in claimed["jobs"]] == [job_id]
    attempts: List[int] = []

    def handler(job: Job) -> Any:
        attempts.append(job.attempt)
        return {"ok": True}

    running = run_worker(keel.worker(handler, worker_id="py-crashed"))
    view = keel.wait_for(job_id, ["succeeded"])
    running.stop()
    assert attempts == [2]
    assert outcomes(view) == ["interrupted", "succeeded"]


def test_keel_restarting_under_the_worker(keel: Keel, run_worker: RunWorker) -> None:
    first = keel.create_job()
    started = threading.Event()
    release = threading.Event()

    def handler(job: Job) -> Any:
        started.set()
        release.wait(30)
        return {"job": job.job_id}

    running = run_worker(keel.worker(handler, heartbeat_secs=0.3, wait_secs=1))
    assert started.wait(20)
    keel.kill()
    # The job ends while keel is down: its report waits for keel, and is sent once.
    release.set()
    time.sleep(2)
    keel.start()
    view = keel.wait_for(first, ["succeeded"], timeout=30)
    assert view["result"] == {"job": first}
    assert outcomes(view) == ["succeeded"]
    # Claims resume against the new process.
    second = keel.create_job()
    assert keel.wait_for(second, ["succeeded"], timeout=30)["result"] == {"job": second}
    running.stop()
    assert running.worker.reported == {"succeeded": 2}


class Faulty(BaseHTTPRequestHandler):
    """Forwards to keel; the first claim is answered 503, and the first succeeded report is
    forwarded but its answer is lost (the connection closes without one)."""

    protocol_version = "HTTP/1.1"
    upstream = ""
    seen: Dict[str, int] = {}
    lock = threading.Lock()

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        path = self.path.rsplit("/", 1)[-1]
        with self.lock:
            self.seen[path] = self.seen.get(path, 0) + 1
            count = self.seen[path]
        if path == "claim" and count == 1:
            self._answer(503, b'{"detail": "warming up"}')
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type", "prefer")}
        answer = httpx.request(self.command, self.upstream + self.path, content=body, headers=headers, timeout=60)
        if path == "succeeded" and count == 1:
            self.close_connection = True
            return
        self._answer(answer.status_code, answer.content)

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = _forward
    do_GET = _forward

    def log_message(self, *args: Any) -> None:
        pass


def test_transient_failures_are_retried_and_a_report_is_sent_once(keel: Keel) -> None:
    Faulty.upstream = keel.url
    Faulty.seen = {}
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), Faulty)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        job_id = keel.create_job()
        worker = Worker(f"http://127.0.0.1:{proxy.server_address[1]}", INTERNAL_KEY, "py-faulty", ["tracer"],
                        lambda job: {"done": True}, wait_secs=1)
        running = Running(worker)
        view = keel.wait_for(job_id, ["succeeded"])
        running.stop()
    finally:
        proxy.shutdown()
    assert Faulty.seen["claim"] >= 2
    # The lost answer made the worker send its report again; keel took it once.
    assert Faulty.seen["succeeded"] == 2
    assert outcomes(view) == ["succeeded"]
    assert worker.reported == {"succeeded": 1}


def test_a_wrong_internal_key_is_an_error_not_a_loop(keel: Keel) -> None:
    worker = Worker(keel.url, "not-the-key", "py-w", ["tracer"], lambda job: None, wait_secs=1)
    with pytest.raises(KeelError) as raised:
        worker.run()
    assert raised.value.status == 401


def test_worker_arguments_are_checked() -> None:
    with pytest.raises(ValueError):
        Worker("http://x", "k", "w", [], lambda job: None)
    with pytest.raises(ValueError):
        Worker("http://x", "k", "w", ["tracer"], lambda job: None, concurrency=0)


# -- the command runner, as its own process (SIGTERM goes to the runner only) -------------

# The job's command: sleeps `sleep` seconds; `exit` 3 always fails (with a message on
# stderr), `exit` 75 asks for a retry on the first attempt only; else prints its result.
SLEEPER = """
import json, os, sys, time
p = json.load(sys.stdin)['input']
attempt = int(os.environ['KEEL_ATTEMPT'])
open(os.path.join(os.environ['MARKS'], os.environ['KEEL_JOB_ID']), 'w').close()
time.sleep(p.get('sleep', 0))
if p.get('exit') == 3 or (p.get('exit') == 75 and attempt == 1):
    sys.stderr.write('cuda: out of memory\\n')
    sys.exit(p['exit'])
print(json.dumps({'attempt': attempt, 'job': os.environ['KEEL_JOB_ID'], 'input': p}))
"""


def runner(keel: Keel, worker_id: str, grace: float, extra: List[str] = []) -> "subprocess.Popen[bytes]":
    """The command runner; each job's command leaves a mark in keel.marks when it starts."""
    return subprocess.Popen(
        [sys.executable, "-m", "keel_worker", "--action", "tracer", "--url", keel.url,
         "--internal-key", INTERNAL_KEY, "--worker-id", worker_id, "--wait-secs", "1",
         "--heartbeat-secs", "0.5", "--grace-secs", str(grace), *extra, "--", sys.executable, "-c", SLEEPER],
        env=dict(os.environ, MARKS=str(keel.marks)),
    )


def wait_running(keel: Keel, job_id: str) -> None:
    """Until the job's command runs (a signal before that may cut the claim short, and the
    job is handed back: right, but not what these tests are about)."""
    deadline = time.monotonic() + 20
    while not (keel.marks / job_id).exists():
        assert time.monotonic() < deadline, f"job {job_id} did not start"
        time.sleep(0.05)


def test_the_command_runner_reports_stdout_exit_75_and_failures(keel: Keel) -> None:
    plain = keel.create_job(value=7)
    retried = keel.create_job(exit=75)
    failed = keel.create_job(exit=3)
    process = runner(keel, "py-cmd", grace=10, extra=["--concurrency", "3"])
    try:
        ok = keel.wait_for(plain, ["succeeded"])
        again = keel.wait_for(retried, ["succeeded"], timeout=30)
        bad = keel.wait_for(failed, ["failed"])
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    assert ok["result"] == {"attempt": 1, "job": plain, "input": {"value": 7}}
    assert again["result"]["attempt"] == 2
    assert outcomes(again) == ["retried", "succeeded"]
    assert "exited with 3" in bad["error"] and "cuda: out of memory" in bad["error"]


def test_sigterm_lets_a_running_job_finish_within_the_grace(keel: Keel) -> None:
    job_id = keel.create_job(sleep=2)
    process = runner(keel, "py-term", grace=30)
    wait_running(keel, job_id)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    view = keel.job(job_id)
    assert view["status"] == "succeeded", view
    # No claim after the signal: a job queued now stays queued.
    later = keel.create_job()
    time.sleep(1)
    assert keel.job(later)["status"] == "queued"


def test_sigterm_hands_back_a_job_that_outlives_the_grace(keel: Keel) -> None:
    job_id = keel.create_job(sleep=60)
    process = runner(keel, "py-slow", grace=1)
    wait_running(keel, job_id)
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    assert time.monotonic() - signalled < 15
    view = keel.job(job_id)
    assert view["status"] == "queued", view
    assert outcomes(view) == ["interrupted"]
    assert view["workerId"] is None


def test_sigterm_cuts_an_idle_long_poll_short(keel: Keel) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "keel_worker", "--action", "tracer", "--url", keel.url,
         "--internal-key", INTERNAL_KEY, "--worker-id", "py-idle", "--wait-secs", "25", "--", "true"],
    )
    time.sleep(2)
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    assert time.monotonic() - signalled < 10
    # A job queued after the worker left is still there for the next one.
    job_id = keel.create_job()
    time.sleep(0.5)
    assert keel.job(job_id)["status"] == "queued"


class _Hurried(BaseHTTPRequestHandler):
    """A keel that will not hold a long poll: claims answered at once, empty, or 503 with
    Retry-After (a draining instance); hand-backs answered. Counts the claims it saw."""

    claims: List[float] = []
    draining = False

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass

    def do_POST(self) -> None:  # noqa: N802 - the base's name
        length = int(self.headers.get("content-length", "0"))
        self.rfile.read(length)
        if self.path.endswith("/jobs/claim"):
            _Hurried.claims.append(time.monotonic())
            if _Hurried.draining:
                self.send_response(503)
                self.send_header("retry-after", "1")
                body = b'{"detail": "service unavailable: shutting down", "code": "unavailable"}'
            else:
                self.send_response(200)
                body = b'{"jobs": []}'
        else:
            self.send_response(200)
            body = b'{"requeued": 0}'
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _claims_in(secs: float, draining: bool) -> List[float]:
    _Hurried.claims = []
    _Hurried.draining = draining
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hurried)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        worker = Worker(f"http://127.0.0.1:{server.server_address[1]}", INTERNAL_KEY, "py-hurried", ["tracer"],
                        lambda job: None, wait_secs=5, concurrency=10)
        running = Running(worker)
        time.sleep(secs)
        running.stop()
    finally:
        server.shutdown()
    return list(_Hurried.claims)


def test_an_instance_that_answers_long_polls_at_once_is_not_flooded() -> None:
    claims = _claims_in(3.0, draining=False)
    # Backing off from 0.2 s, doubling: a handful in 3 s, not thousands.
    assert 2 <= len(claims) <= 8, len(claims)


def test_a_draining_instance_is_asked_again_only_after_its_retry_after() -> None:
    claims = _claims_in(3.5, draining=True)
    assert 2 <= len(claims) <= 4, len(claims)
    gaps = [b - a for a, b in zip(claims, claims[1:])]
    assert all(gap >= 0.95 for gap in gaps), gaps


def test_a_worker_claims_ahead_and_keeps_what_it_holds_alive(keel: Keel, run_worker: RunWorker) -> None:
    jobs = [keel.create_job(n=n) for n in range(6)]
    release = threading.Event()
    ran: List[str] = []
    lock = threading.Lock()

    def handler(job: Job) -> Any:
        with lock:
            ran.append(job.job_id)
        release.wait(30)
        return None

    running = run_worker(keel.worker(handler, concurrency=2, prefetch=2, heartbeat_secs=0.2))
    # Two run, two more are claimed ahead (held by the worker, waiting for a slot).
    deadline = time.monotonic() + 20
    while True:
        views = {job_id: keel.job(job_id) for job_id in jobs}
        held = [job_id for job_id, view in views.items() if view["status"] == "running"]
        if len(held) == 4 and len(ran) == 2:
            break
        assert time.monotonic() < deadline, (held, ran)
        time.sleep(0.05)
    waiting = [job_id for job_id in held if job_id not in ran]
    assert len(waiting) == 2
    # The jobs waiting for a slot are heartbeaten with the running ones.
    before = views[waiting[0]]["heartbeatAt"]
    time.sleep(0.6)
    assert keel.job(waiting[0])["heartbeatAt"] != before
    assert sorted(ran) == sorted(set(held) - set(waiting))
    # Stopped by its user while it waited: it never runs, and ends user_stopped.
    keel.ok(keel.api.post(f"/api/training/jobs/{waiting[1]}/stop", json={"reason": "not needed"}))
    time.sleep(0.6)
    release.set()
    for job_id in jobs:
        keel.wait_for(job_id, ["succeeded", "user_stopped"])
    running.stop()
    assert waiting[1] not in ran
    assert keel.job(waiting[1])["status"] == "user_stopped"
    assert len(ran) == 5
    assert running.worker.reported == {"succeeded": 5, "user-stopped": 1}


def test_the_adaptive_prefetch_stays_at_its_floor_until_jobs_are_seen_to_be_short() -> None:
    worker = Worker("http://127.0.0.1:9", INTERNAL_KEY, "w", ["tracer"], lambda job: None, concurrency=10)
    # Nothing seen yet: half the slots.
    assert worker.prefetch == 5
    # Jobs as long as a claim: the jobs ten slots end in two round trips.
    worker._job_secs, worker._claim_secs = 0.005, 0.005
    assert worker.prefetch == 20
    # No-op jobs: bounded at four a slot.
    worker._job_secs = 0.00001
    assert worker.prefetch == 40
    # Long jobs: the floor.
    worker._job_secs = 30.0
    assert worker.prefetch == 5
    one = Worker("http://127.0.0.1:9", INTERNAL_KEY, "w", ["tracer"], lambda job: None)
    one._job_secs, one._claim_secs = 30.0, 0.005
    assert one.prefetch == 0
    fixed = Worker("http://127.0.0.1:9", INTERNAL_KEY, "w", ["tracer"], lambda job: None, concurrency=10, prefetch=2)
    fixed._job_secs, fixed._claim_secs = 0.00001, 0.005
    assert fixed.prefetch == 2


def _held_by_keel(keel: Keel, jobs: List[str]) -> int:
    return sum(1 for job_id in jobs if keel.job(job_id)["status"] == "running")


def test_a_worker_holds_more_ahead_for_short_jobs_and_only_its_floor_for_long_ones(
    keel: Keel, run_worker: RunWorker,
) -> None:
    # Long jobs (0.3 s against a claim of milliseconds): two slots and a floor of one.
    slow = [keel.create_job(action="draft", n=n) for n in range(8)]
    running = run_worker(keel.worker(lambda job: time.sleep(0.3), actions=["draft"], concurrency=2))
    most = 0
    deadline = time.monotonic() + 30
    while not all(keel.job(job_id)["status"] == "succeeded" for job_id in slow):
        most = max(most, _held_by_keel(keel, slow))
        assert time.monotonic() < deadline
        time.sleep(0.02)
    running.stop()
    # keel counts a job running until its report lands: a slot's report on its way is held
    # beside the three (two slots ending together, two reports).
    assert 2 <= most <= 5, most
    # Short jobs: once twenty have run at once, the rest block; the worker then holds more
    # than its slots and floor (at most four a slot ahead).
    quick = [keel.create_job(action="optimize", n=n) for n in range(60)]
    release = threading.Event()
    ran = []
    lock = threading.Lock()

    def handler(job: Job) -> Any:
        with lock:
            ran.append(job.job_id)
            short = len(ran) <= 20
        if not short:
            release.wait(30)
        return None

    running = run_worker(keel.worker(handler, worker_id="py-quick", actions=["optimize"], concurrency=2))
    most = 0
    deadline = time.monotonic() + 20
    while most < 6:
        most = max(most, _held_by_keel(keel, quick))
        assert time.monotonic() < deadline, most
        time.sleep(0.02)
    # Once the short jobs' reports have landed: the slots and at most eight ahead.
    time.sleep(0.5)
    assert 6 <= _held_by_keel(keel, quick) <= 2 + 8
    release.set()
    for job_id in quick:
        keel.wait_for(job_id, ["succeeded"])
    running.stop()
    assert running.worker.reported == {"succeeded": 60}


class Counting(BaseHTTPRequestHandler):
    """Forwards to keel and counts the calls by their last path segment."""

    protocol_version = "HTTP/1.1"
    upstream = ""
    seen: Dict[str, int] = {}
    lock = threading.Lock()

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        path = self.path.rsplit("/", 1)[-1]
        with self.lock:
            self.seen[path] = self.seen.get(path, 0) + 1
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type", "prefer")}
        answer = httpx.request(self.command, self.upstream + self.path, content=body, headers=headers, timeout=60)
        self.send_response(answer.status_code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    do_POST = _forward
    do_GET = _forward

    def log_message(self, *args: Any) -> None:
        pass


def test_jobs_that_end_together_are_reported_in_one_request(keel: Keel) -> None:
    Counting.upstream = keel.url
    Counting.seen = {}
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    jobs = [keel.create_job(n=n) for n in range(8)]
    gate = threading.Barrier(8)

    def handler(job: Job) -> Any:
        # All eight end at the same moment.
        gate.wait(30)
        return {"n": job.payload}

    try:
        worker = Worker(f"http://127.0.0.1:{proxy.server_address[1]}", INTERNAL_KEY, "py-batch", ["tracer"],
                        handler, concurrency=8, wait_secs=1, heartbeat_secs=0.3)
        running = Running(worker)
        for job_id in jobs:
            keel.wait_for(job_id, ["succeeded"])
        running.stop()
    finally:
        proxy.shutdown()
    assert worker.reported == {"succeeded": 8}
    # Eight reports in fewer requests than eight: the ones that ended together went as one.
    singles = Counting.seen.get("succeeded", 0)
    batches = Counting.seen.get("reports", 0)
    assert batches >= 1 and singles + batches < 8, Counting.seen
    # Heartbeats cover every held job in one request.
    assert "heartbeat" not in Counting.seen, Counting.seen


def test_a_job_reads_its_pinned_dataset_streamed_and_verified(keel: Keel, run_worker: RunWorker) -> None:
    questions = [f"question {i}" for i in range(60)]
    keel.record(questions)
    dataset = keel.ok(keel.api.post("/api/datasets", json={
        "projectId": keel.project_id, "name": "support", "filter": {}, "split": {"validation": 0.25, "seed": 5}}))
    pinned = dataset["versions"][0]
    body = {"action": "tracer", "projectId": keel.project_id, "input": {},
            "dataset": {"datasetId": dataset["datasetId"]}}
    job_id = str(keel.ok(keel.api.post("/api/training/jobs", json=body))["jobId"])
    read: Dict[str, List[Dict[str, Any]]] = {}

    def handler(job: Job) -> Any:
        assert job.dataset_pinned is not None
        read["train"] = list(job.dataset())
        read["validation"] = list(job.dataset(split="validation"))
        read["records"] = list(job.dataset(split="all", format="records"))
        return {"pinned": job.dataset_pinned}

    running = run_worker(keel.worker(handler))
    view = keel.wait_for(job_id, ["succeeded", "failed"])
    running.stop()
    assert view["status"] == "succeeded", view
    assert view["result"]["pinned"]["version"] == 1
    assert view["result"]["pinned"]["sha256"] == pinned["sha256"]
    assert len(read["train"]) == pinned["counts"]["train"] > 0
    assert len(read["validation"]) == pinned["counts"]["validation"] > 0
    assert len(read["records"]) == len(questions)
    asked = {line["messages"][0]["content"] for line in read["train"] + read["validation"]}
    assert asked == set(questions)
    for line in read["train"]:
        assert line["messages"][-1] == {"role": "assistant", "content": f"answer to {line['messages'][0]['content']}"}


class _Dataset(BaseHTTPRequestHandler):
    """keel's dataset route, as a broken connection and a changed file see it: the first read
    breaks off after `cut` bytes; `tamper` changes one byte of what is served."""

    lines = b"".join(b'{"messages": [{"role": "user", "content": "q%d"}]}\n' % i for i in range(50))
    cut = 0
    tamper = False
    offsets: List[int] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        offset = int(self.path.split("offset=")[1].split("&")[0])
        type(self).offsets.append(offset)
        served = bytearray(self.lines)
        if self.tamper:
            served[4] ^= 1  # "messages" becomes "mersages"
        body = b"".join(line + b"\n" for line in bytes(served).split(b"\n")[offset:-1])
        self.send_response(200)
        self.send_header("x-dataset-lines", "50")
        self.send_header("x-dataset-sha256", hashlib.sha256(self.lines).hexdigest())
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if type(self).cut:
            self.wfile.write(body[: type(self).cut])
            type(self).cut = 0
            self.close_connection = True
            return
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_broken_dataset_read_goes_on_after_its_lines_and_a_changed_one_is_refused() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Dataset)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    worker = Worker(f"http://127.0.0.1:{server.server_address[1]}", INTERNAL_KEY, "w", ["tracer"], lambda job: None)
    claimed = {"job_id": "j", "org_id": "o", "project_id": "p", "action": "tracer", "attempt": 1,
               "dataset": {"datasetId": "d", "version": 1, "counts": {"train": 50, "validation": 0},
                           "sha256": {"train": hashlib.sha256(_Dataset.lines).hexdigest(), "validation": ""}}}
    job = Job(worker, claimed)
    try:
        _Dataset.cut = len(_Dataset.lines) // 2 + 5
        lines = list(job.dataset())
        assert [line["messages"][0]["content"] for line in lines] == [f"q{i}" for i in range(50)]
        assert _Dataset.offsets[0] == 0 and _Dataset.offsets[1] > 20, _Dataset.offsets
        _Dataset.tamper = True
        with pytest.raises(DatasetMismatch):
            list(job.dataset())
    finally:
        server.shutdown()
