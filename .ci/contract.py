#!/usr/bin/env python3
"""keel's machine contract, checked as a client would: the binary on PostgreSQL with a fake
upstream, schemathesis (all checks, stateful links) with each kind of credential, then a
Python client generated from /openapi.json driving a project, the billing view and a job, and
the official OpenAI SDK recording 5,000 calls that export as 5,000 fine-tuning lines.

Usage: contract.py BINARY POSTGRES_URL VENV_BIN
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "target" / "contract"
INTERNAL_KEY = "contract-internal-key"
SESSION_SECRET = "contract-session-secret"
COMPLETION = (ROOT / "tests" / "fixtures" / "chat" / "completion_plain.json").read_bytes()
EMBEDDING = json.dumps({
    "object": "list", "model": "text-embedding-3-small",
    "data": [{"object": "embedding", "index": 0, "embedding": [0.0023, -0.0093, 0.0158]}],
    "usage": {"prompt_tokens": 1, "total_tokens": 1},
}).encode()
# Examples per operation and phase; three runs of this size take about a minute each.
MAX_EXAMPLES = os.environ.get("KEEL_CONTRACT_EXAMPLES", "8")


class Upstream(BaseHTTPRequestHandler):
    """A provider and a serving layer: a chat completion for any POST, an undeploy count for
    any DELETE."""

    protocol_version = "HTTP/1.1"

    def _answer(self, status, body):
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        if b'"cut-stream"' in body:
            # A stream cut after three chunks, its body delimited by the connection's close:
            # keel must make the SDK raise.
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            for token in ("tok0 ", "tok1 ", "tok2 "):
                chunk = {"id": "chatcmpl-cut", "object": "chat.completion.chunk", "created": 1763683210,
                         "model": "cut-stream",
                         "choices": [{"index": 0, "delta": {"content": token}, "finish_reason": None}]}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
            self.close_connection = True
            return
        if self.path.endswith("/embeddings"):
            self._answer(200, EMBEDDING)
        else:
            self._answer(200, COMPLETION)

    def do_DELETE(self):
        self._answer(200, b'{"undeployed": 1}')

    def do_GET(self):
        self._answer(200, b'{"object": "list", "data": []}')

    def log_message(self, *args):
        pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fresh_database(admin_url, name):
    for sql in (f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"'):
        subprocess.run(["psql", admin_url, "-q", "-c", sql], check=True)
    return admin_url.rsplit("/", 1)[0] + "/" + name


def wait_healthy(base):
    for _ in range(300):
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    sys.exit("keel did not become healthy")


def schemathesis(venv, base, name, headers):
    print(f"== schemathesis: {name}", flush=True)
    command = [
        str(venv / "st"), "--config-file", str(ROOT / ".ci" / "schemathesis.toml"), "run",
        base + "/openapi.json", "--checks", "all", "--max-examples", MAX_EXAMPLES,
        # One worker: CPython 3.11.7's ast.parse is not thread-safe (gh-106905), and Hypothesis
        # parses its filters' source while describing them.
        "--workers", "1", "--seed", "20261124", "--no-color",
        "--report", "junit", "--report-junit-path", str(WORK / f"schemathesis-{name}.xml"),
    ]
    for header in headers:
        command += ["-H", header]
    started = time.monotonic()
    # Schemathesis keeps its cache in the working directory: under target/, not the repository.
    result = subprocess.run(command, capture_output=True, text=True, cwd=WORK)
    (WORK / f"schemathesis-{name}.txt").write_text(result.stdout + result.stderr)
    summary = [line for line in result.stdout.splitlines() if " in " in line and "=" in line]
    print(f"   {summary[-1].strip('= ') if summary else 'no summary'} ({time.monotonic() - started:.0f} s)")
    if result.returncode != 0:
        print(result.stdout[-20000:])
        return False
    return True


def generated_client(venv, base, boot):
    print("== generated client", flush=True)
    spec = WORK / "openapi.json"
    with urllib.request.urlopen(base + "/openapi.json") as r:
        spec.write_bytes(r.read())
    out = WORK / "keel_client"
    subprocess.run(
        [str(venv / "openapi-python-client"), "generate", "--path", str(spec), "--output-path", str(out),
         "--overwrite", "--meta", "none", "--config", str(ROOT / ".ci" / "openapi-python-client.yaml")],
        check=True,
    )
    env = dict(os.environ, PYTHONPATH=str(WORK), KEEL_URL=base, KEEL_API_KEY=boot["apiKey"],
               KEEL_ORG_ID=boot["orgId"], KEEL_INTERNAL_KEY=INTERNAL_KEY)
    subprocess.run([str(venv / "python"), str(ROOT / ".ci" / "client_walkthrough.py")], check=True, env=env)
    return True


def sdk_walkthrough(venv, base, boot, binary):
    print("== the official OpenAI SDK through keel", flush=True)
    env = dict(os.environ, KEEL_URL=base, KEEL_API_KEY=boot["apiKey"], KEEL_BINARY=str(binary),
               KEEL_WORK=str(WORK))
    subprocess.run([str(venv / "python"), str(ROOT / ".ci" / "sdk_walkthrough.py")], check=True, env=env)
    return True


def main():
    binary, admin_url, venv = Path(sys.argv[1]).resolve(), sys.argv[2], Path(sys.argv[3]).resolve()
    WORK.mkdir(parents=True, exist_ok=True)
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    fake = f"http://127.0.0.1:{upstream.server_address[1]}/v1"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(
        os.environ,
        KEEL_DATABASE_URL=fresh_database(admin_url, "keel_contract"),
        KEEL_LISTEN=f"127.0.0.1:{port}",
        KEEL_INTERNAL_KEYS=INTERNAL_KEY,
        KEEL_SESSION_SECRET=SESSION_SECRET,
        KEEL_SERVING_URL=fake,
        KEEL__PROVIDERS__OPENAI_URL=fake,
        KEEL__PROVIDERS__ANTHROPIC_URL=fake,
        KEEL__PROVIDERS__OPENROUTER_URL=fake,
        KEEL__PROVIDERS__GOOGLE_URL=fake,
        # The fuzzing creates webhook endpoints at any https URL it likes: nothing is sent
        # from this instance (nothing here calls the internet).
        KEEL__WEBHOOKS__DISPATCHER="false",
        # Likewise OTLP export destinations (`https://0` is schema-valid; whether an address
        # is private is no pattern's to say): allowed here, and no exporter pushes to them.
        KEEL__WEBHOOKS__ALLOW_PRIVATE_DESTINATIONS="true",
        KEEL__OTLP_PUSH__EXPORTER="false",
        RUST_LOG="warn",
    )
    log = open(WORK / "keel.log", "w")
    keel = subprocess.Popen([str(binary), "serve"], env=env, stdout=log, stderr=log)
    ok = True
    try:
        wait_healthy(base)
        boot = json.loads(subprocess.run(
            [str(binary), "admin", "bootstrap", "--org", "Contract", "--owner", "contract-owner"],
            env=env, check=True, capture_output=True, text=True).stdout)
        runs = [
            ("internal-key", [f"Authorization: Bearer {INTERNAL_KEY}"]),
            ("api-key", [f"Authorization: Bearer {boot['apiKey']}"]),
            ("session", [f"Authorization: Bearer {boot['sessionToken']}", f"X-Org-Id: {boot['orgId']}"]),
        ]
        for name, headers in runs:
            ok = schemathesis(venv, base, name, headers) and ok
        # The fuzzing paused queues with the internal key (a legitimate call): the walkthroughs
        # start from a running queue.
        for action in ("tracer", "draft", "optimize", "training"):
            resume = urllib.request.Request(f"{base}/api/internal/queue/{action}/resume", data=b"{}", method="POST",
                                            headers={"Authorization": f"Bearer {INTERNAL_KEY}",
                                                     "Content-Type": "application/json"})
            urllib.request.urlopen(resume).read()
        ok = generated_client(venv, base, boot) and ok
        ok = sdk_walkthrough(venv, base, boot, binary) and ok
    finally:
        keel.terminate()
        keel.wait(timeout=30)
        upstream.shutdown()
    if keel.returncode not in (0, -15):
        print(f"keel exited with {keel.returncode}; see {WORK / 'keel.log'}")
        ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
