"""The library's tests run against the real `keel` binary on PostgreSQL, each test on a fresh
database: KEEL_BINARY (default: the workspace's target/debug/keel) and
KEEL_TEST_POSTGRES_URL (default: postgres://postgres@127.0.0.1:5432/postgres)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import httpx
import pytest

from keel_worker import Worker

ROOT = Path(__file__).resolve().parents[3]
BINARY = Path(os.environ.get("KEEL_BINARY", ROOT / "target" / "debug" / "keel"))
ADMIN_URL = os.environ.get("KEEL_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")
INTERNAL_KEY = "pyworker-internal-key"


class _Provider(BaseHTTPRequestHandler):
    """An OpenAI-compatible provider for the recording proxy: each chat completion answers
    "answer to <the last message>"."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
        asked = body["messages"][-1]["content"]
        reply = json.dumps({
            "id": "chatcmpl-py", "object": "chat.completion", "created": 1764000000, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": f"answer to {asked}"}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9},
        }).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


def _provider_url() -> str:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Provider)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/v1"


PROVIDER_URL = _provider_url()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def psql(sql: str) -> None:
    subprocess.run(["psql", ADMIN_URL, "-q", "-c", sql], check=True, capture_output=True)


class Keel:
    """One keel process on its own database; `restart()` kills it (SIGKILL) and starts it
    again on the same port and database."""

    def __init__(self, workdir: Path) -> None:
        self.database = f"keel_pyworker_{uuid.uuid4().hex[:12]}"
        psql(f'CREATE DATABASE "{self.database}"')
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "keel.log"
        self.marks = workdir / "marks"
        self.marks.mkdir()
        self.env = dict(
            os.environ,
            KEEL_DATABASE_URL=ADMIN_URL.rsplit("/", 1)[0] + "/" + self.database,
            KEEL_LISTEN=f"127.0.0.1:{self.port}",
            KEEL_INTERNAL_KEYS=INTERNAL_KEY,
            KEEL_SESSION_SECRET="pyworker-session-secret",
            KEEL__BILLING__STARTER_CREDIT_CENTS="1000000",
            KEEL__QUEUE__RETRY_BACKOFF_BASE_SECS="1",
            KEEL__PROVIDERS__OPENAI_URL=PROVIDER_URL,
            RUST_LOG="warn",
        )
        self.process: Optional[subprocess.Popen[bytes]] = None
        self.start()
        boot = json.loads(subprocess.run(
            [str(BINARY), "admin", "bootstrap", "--org", "Py", "--owner", "py-owner"],
            env=self.env, check=True, capture_output=True, text=True).stdout)
        self.org_id: str = boot["orgId"]
        self.api = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {boot['apiKey']}"}, timeout=30)
        self.internal = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {INTERNAL_KEY}"},
                                     timeout=60)
        self.project_id: str = self.ok(self.api.post("/api/projects", json={"name": "Workers"}))["id"]
        self.ok(self.api.post("/api/billing/starter-credit", json={"orgId": self.org_id}))
        self.api_key: str = boot["apiKey"]

    def record(self, questions: List[str]) -> None:
        """Chat completions through keel's recording proxy, one per question, waited for until
        each is a trace of the project."""
        headers = {"X-Service-Provider": "openai", "X-Service-Provider-Key": "sk-py-provider",
                   "X-Service-Project-Id": self.project_id}
        for question in questions:
            body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": question}]}
            self.ok(self.api.post("/v1/chat/completions", json=body, headers=headers))
        deadline = time.monotonic() + 30
        while True:
            page = self.ok(self.api.get("/api/traces", params={"projectId": self.project_id, "limit": 200}))
            if len(page["traces"]) >= len(questions) or time.monotonic() > deadline:
                return
            time.sleep(0.1)

    def start(self) -> None:
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen([str(BINARY), "serve"], env=self.env, stdout=log, stderr=log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"keel exited: {self.log_path.read_text()[-3000:]}")
            time.sleep(0.05)
        raise RuntimeError("keel did not become healthy")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self, down_secs: float = 0) -> None:
        self.kill()
        time.sleep(down_secs)
        self.start()

    def close(self) -> None:
        self.api.close()
        self.internal.close()
        # Its graceful stop is not under test here (keel's own suite covers it).
        self.kill()
        psql(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')

    @staticmethod
    def ok(answer: httpx.Response) -> Any:
        assert answer.status_code < 300, f"{answer.request.method} {answer.request.url}: {answer.status_code} {answer.text}"
        return answer.json()

    def create_job(self, action: str = "tracer", **input: Any) -> str:
        body = {"action": action, "projectId": self.project_id, "input": input}
        return str(self.ok(self.api.post("/api/training/jobs", json=body))["jobId"])

    def job(self, job_id: str) -> Dict[str, Any]:
        view: Dict[str, Any] = self.ok(self.api.get(f"/api/training/jobs/{job_id}"))
        return view

    def wait_for(self, job_id: str, statuses: List[str], timeout: float = 30) -> Dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            view = self.job(job_id)
            if view["status"] in statuses:
                return view
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} is {view['status']}, not one of {statuses}: {view}")
            time.sleep(0.05)

    def worker(self, handler: Callable[..., Any], worker_id: str = "py-worker", actions: Optional[List[str]] = None,
               **options: Any) -> Worker:
        options.setdefault("wait_secs", 2)
        return Worker(self.url, INTERNAL_KEY, worker_id, actions or ["tracer"], handler, **options)


@pytest.fixture
def keel(tmp_path: Path) -> Iterator[Keel]:
    server = Keel(tmp_path)
    try:
        yield server
    finally:
        server.close()


class Running:
    """A worker's run() on a thread of its own."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as error:  # noqa: BLE001 - surfaced by stop()
            self.error = error

    def stop(self, timeout: float = 30) -> None:
        self.worker.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "run() did not return after stop()"
        if self.error is not None:
            raise self.error


@pytest.fixture
def run_worker() -> Iterator[Callable[[Worker], Running]]:
    started: List[Running] = []

    def start(worker: Worker) -> Running:
        running = Running(worker)
        started.append(running)
        return running

    yield start
    for running in started:
        if running.thread.is_alive():
            running.worker.stop()
            running.worker.stop()
            running.thread.join(30)
