"""API keys' limits, scopes, model lists and expiry (issue 43) through the official OpenAI SDK:
on SQLite, then on PostgreSQL with two instances sharing one key's limits. The SDK raises
`RateLimitError` (429, with `Retry-After`), `PermissionDeniedError` (403) and
`AuthenticationError` (401) on the proxy (chat completions) and on the relay (embeddings).

Usage: keys_check.py KEEL_BINARY POSTGRES_ADMIN_URL
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable, Dict, List

import httpx
import openai
from openai import OpenAI

from harness import bootstrap, create_database, drop_database, serve, start_keel, stop_keel

BINARY, ADMIN_URL = sys.argv[1], sys.argv[2]
INTERNAL_KEY = "keys-check-internal-key"
SESSION_SECRET = "keys-check-session-secret-0123456789"
COMPLETION = {
    "id": "chatcmpl-keys", "object": "chat.completion", "created": 1763683200, "model": "gpt-4o-mini",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris."}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 24, "completion_tokens": 8, "total_tokens": 32},
}


class Provider(BaseHTTPRequestHandler):
    """A provider: chat completions (JSON, or a slow stream), embeddings, models."""

    protocol_version = "HTTP/1.1"

    def reply(self, status: int, body: Dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        self.reply(200, {"object": "list", "data": [{"id": "gpt-4o-mini", "object": "model", "created": 1,
                                                     "owned_by": "system"}]})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"{}")
        if self.path.endswith("/embeddings"):
            self.reply(200, {"object": "list", "model": body.get("model"),
                             "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
                             "usage": {"prompt_tokens": 2, "total_tokens": 2}})
        elif body.get("stream"):
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            try:
                for n in range(40):
                    chunk = {"id": "c1", "object": "chat.completion.chunk", "model": body.get("model"),
                             "choices": [{"index": 0, "delta": {"content": f"t{n} "}}]}
                    frame = f"data: {json.dumps(chunk)}\n\n".encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
                    self.wfile.flush()
                    time.sleep(0.05)
                done = b"data: [DONE]\n\n"
                self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
            except (BrokenPipeError, ConnectionResetError):
                pass
        else:
            self.reply(200, dict(COMPLETION, model=body.get("model")))

    def log_message(self, *args: Any) -> None:
        pass


def raises(kind: type, call: Callable[[], Any]) -> Any:
    try:
        call()
    except kind as err:
        return err
    raise AssertionError(f"{kind.__name__} expected")


class Session:
    def __init__(self, base: str, env: Dict[str, str]) -> None:
        tag = uuid.uuid4().hex[:8]
        boot = bootstrap(BINARY, env, f"Keys {tag}", f"owner-{tag}")
        self.org_id = boot["orgId"]
        self.owner = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {boot['sessionToken']}",
                                                          "X-Org-Id": boot["orgId"]}, timeout=30)
        api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {boot['apiKey']}"}, timeout=30)
        answer = api.post("/api/projects", json={"name": "keys check"})
        assert answer.status_code == 201, answer.text
        self.project = answer.json()["id"]

    def key(self, **settings: Any) -> str:
        answer = self.owner.post("/api/api-keys", json=settings)
        assert answer.status_code == 201, answer.text
        return str(answer.json()["key"])

    def client(self, base: str, key: str) -> OpenAI:
        return OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, default_headers={
            "X-Service-Provider": "openai",
            "X-Service-Provider-Key": "sk-keys-check-provider",
            "X-Service-Project-Id": self.project,
        })


def chat(client: OpenAI, model: str = "gpt-4o-mini") -> Any:
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Capital of France?"}])


def embed(client: OpenAI, model: str = "text-embedding-3-small") -> Any:
    return client.embeddings.create(model=model, input="x")


def check_one_instance(base: str, env: Dict[str, str], label: str) -> None:
    s = Session(base, env)
    # requestsPerMinute: two calls (one on the proxy, one on the relay), then 429 on both.
    limited = s.client(base, s.key(limits={"requestsPerMinute": 2}))
    chat(limited)
    embed(limited)
    err = raises(openai.RateLimitError, lambda: chat(limited))
    assert 1 <= int(err.response.headers["retry-after"]) <= 30, err.response.headers
    assert err.body["type"] == "rate_limit_exceeded", err.body
    raises(openai.RateLimitError, lambda: embed(limited))

    # models: the list's models only, on the proxy and the relay.
    listed = s.client(base, s.key(models=["gpt-4o-mini", "text-embedding-3-small"]))
    chat(listed)
    embed(listed)
    err = raises(openai.PermissionDeniedError, lambda: chat(listed, "gpt-4o"))
    assert err.body["code"] == "model_not_allowed", err.body
    assert raises(openai.PermissionDeniedError, lambda: embed(listed, "text-embedding-3-large")).body["code"] \
        == "model_not_allowed"

    # scopes: a key for the JSON API only may not call the proxy or the relay.
    api_only = s.client(base, s.key(scopes=["api"]))
    assert raises(openai.PermissionDeniedError, lambda: chat(api_only)).body["code"] == "scope_not_allowed"
    raises(openai.PermissionDeniedError, lambda: embed(api_only))

    # expiry: 401 once it passes.
    soon = (datetime.now(timezone.utc) + timedelta(seconds=2)).isoformat()
    expiring = s.client(base, s.key(expiresAt=soon))
    chat(expiring)
    time.sleep(2.2)
    raises(openai.AuthenticationError, lambda: chat(expiring))
    raises(openai.AuthenticationError, lambda: embed(expiring))

    # tokensPerDay: 32 tokens a call against 40; a call that starts under it completes.
    tokens = s.client(base, s.key(limits={"tokensPerDay": 40}))
    passed = 0
    for _ in range(50):
        try:
            chat(tokens)
            passed += 1
        except openai.RateLimitError:
            break
        assert passed <= 2, "a third call passed 40 tokens a day"
        time.sleep(0.1)
    else:
        raise AssertionError("tokensPerDay never refused")
    # ...and the relay is refused too, once the day's tokens are used.
    raises(openai.RateLimitError, lambda: embed(tokens))

    # concurrentStreams: one stream open; a second is refused until the first ends.
    streams = s.client(base, s.key(limits={"concurrentStreams": 1}))
    first = streams.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "count"}],
                                            stream=True)
    next(iter(first))
    raises(openai.RateLimitError, lambda: streams.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "count"}], stream=True))
    # A relayed stream (the Responses API) takes a place too.
    raises(openai.RateLimitError, lambda: streams.responses.create(model="gpt-4o-mini", input="count", stream=True))
    first.close()
    for _ in range(100):
        try:
            second = streams.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}],
                                                     stream=True)
            second.close()
            break
        except openai.RateLimitError:
            time.sleep(0.1)
    else:
        raise AssertionError("a stream's place was never given back")
    print(f"   {label}: limits, models, scopes and expiry hold through the OpenAI SDK (proxy and relay)")


def check_two_instances(bases: List[str], env: Dict[str, str]) -> None:
    s = Session(bases[0], env)
    key = s.key(limits={"requestsPerMinute": 4})
    clients = [s.client(base, key) for base in bases]
    passed = 0
    for i in range(16):
        try:
            chat(clients[i % 2])
            passed += 1
        except openai.RateLimitError:
            pass
    assert 4 <= passed <= 6, f"{passed} calls passed a limit of 4 a minute over two instances"
    print(f"   PostgreSQL, two instances: {passed} of 16 alternating calls passed a limit of 4 a minute")


def main() -> None:
    provider, fake_base = serve(Provider)
    fake = fake_base + "/v1"
    base_env = dict(os.environ, KEEL_INTERNAL_KEYS=INTERNAL_KEY, KEEL_SESSION_SECRET=SESSION_SECRET,
                    KEEL__PROVIDERS__OPENAI_URL=fake, RUST_LOG="warn")
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(base_env, KEEL_DATABASE_URL=f"sqlite://{scratch}/keel.db?mode=rwc")
        keel, base = start_keel(BINARY, env)
        try:
            check_one_instance(base, env, "SQLite")
        finally:
            stop_keel(keel)

    database = f"keel_keys_{uuid.uuid4().hex[:12]}"
    env = dict(base_env, KEEL_DATABASE_URL=create_database(ADMIN_URL, database))
    instances = []
    try:
        instances.append(start_keel(BINARY, env))
        instances.append(start_keel(BINARY, env))
        check_one_instance(instances[0][1], env, "PostgreSQL")
        check_two_instances([base for _, base in instances], env)
    finally:
        for keel, _ in instances:
            stop_keel(keel)
        provider.shutdown()
        drop_database(ADMIN_URL, database)


if __name__ == "__main__":
    main()
