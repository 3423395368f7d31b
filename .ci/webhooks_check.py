"""Outbound webhooks checked with the Standard Webhooks reference library from PyPI
(`standardwebhooks`), not with keel's own code: every event type keel sends in a session is
received by a local endpoint and verified; a tampered body, a wrong secret and a stale
timestamp are refused; during a rotation both secrets verify.

Usage: webhooks_check.py KEEL_BINARY POSTGRES_ADMIN_URL
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler
from typing import Any, Dict, List, Tuple

import httpx
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from harness import bootstrap, create_database, drop_database, serve, start_keel, stop_keel

BINARY, ADMIN_URL = sys.argv[1], sys.argv[2]
INTERNAL_KEY = "webhooks-check-internal-key"
Received = Tuple[bytes, Dict[str, str]]


class Receiver(BaseHTTPRequestHandler):
    received: List[Received] = []
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        with Receiver.lock:
            Receiver.received.append((body, {k.lower(): v for k, v in self.headers.items()}))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def wait_for(n: int, timeout: float = 15) -> List[Received]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with Receiver.lock:
            if len(Receiver.received) >= n:
                return list(Receiver.received)
        time.sleep(0.05)
    with Receiver.lock:
        types = [json.loads(b)["type"] for b, _ in Receiver.received]
    raise AssertionError(f"{n} deliveries expected, {len(types)} arrived: {types}")


def ok(answer: httpx.Response) -> Any:
    assert answer.status_code < 300, f"{answer.request.method} {answer.request.url}: {answer.status_code} {answer.text}"
    return answer.json() if answer.content else None


def main() -> None:
    database = f"keel_webhooks_{uuid.uuid4().hex[:12]}"
    server, receiver = serve(Receiver)
    hook_url = f"{receiver}/keel"
    env = dict(
        os.environ,
        KEEL_DATABASE_URL=create_database(ADMIN_URL, database),
        KEEL_INTERNAL_KEYS=INTERNAL_KEY,
        KEEL_SESSION_SECRET="webhooks-check-session-secret",
        KEEL__WEBHOOKS__ALLOW_HTTP="true",
        KEEL__WEBHOOKS__ALLOW_PRIVATE_DESTINATIONS="true",
        RUST_LOG="warn",
    )
    keel = None
    try:
        keel, base = start_keel(BINARY, env)
        boot = bootstrap(BINARY, env, "Hooks", "hooks-owner")
        org_id = boot["orgId"]
        api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {boot['apiKey']}"}, timeout=30)
        internal = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {INTERNAL_KEY}"}, timeout=30)
        endpoint = ok(api.post("/api/webhooks/endpoints", json={"url": hook_url, "events": ["*"]}))
        secret = endpoint["secret"]

        # webhook.test; a top-up; a declined top-up; a fee under the low balance; a job's end.
        ok(api.post(f"/api/webhooks/endpoints/{endpoint['endpointId']}/test", json={}))
        ok(api.post("/api/billing/payment-method", json={"orgId": org_id, "paymentMethodId": "pm_card_visa"}))
        ok(api.post("/api/billing/topup", json={"orgId": org_id, "amountCents": 1050}))
        ok(api.post("/api/billing/debit", json={"orgId": org_id, "runId": "run-1"}))
        project = ok(api.post("/api/projects", json={"name": "Hooks"}))["id"]
        job = ok(api.post("/api/training/jobs", json={"action": "tracer", "projectId": project}))["jobId"]
        claimed = ok(internal.post("/api/training/internal/jobs/claim",
                                   json={"worker_id": "w", "action": "tracer", "limit": 1}))["jobs"]
        assert [j["job_id"] for j in claimed] == [job], claimed
        ok(internal.post("/api/training/internal/jobs/succeeded", json={"job_id": job, "worker_id": "w"}))
        ok(api.post("/api/billing/payment-method", json={"orgId": org_id, "paymentMethodId": "pm_card_chargeDeclined"}))
        assert api.post("/api/billing/topup", json={"orgId": org_id, "amountCents": 700}).status_code == 402
        expected = {"webhook.test", "billing.topup.succeeded", "billing.balance.low", "job.succeeded",
                    "billing.topup.failed"}
        received = wait_for(len(expected))
        seen = set()
        for body, headers in received:
            event = Webhook(secret).verify(body, headers)
            assert event["orgId"] == org_id and event["id"] == headers["webhook-id"], event
            seen.add(event["type"])
        assert seen == expected, seen

        # Refused: another secret, a changed body, an old timestamp.
        body, headers = received[0]
        refusals = [
            (Webhook("whsec_" + "A" * 43 + "="), body, headers),
            (Webhook(secret), body.replace(b"}", b" }", 1), headers),
            (Webhook(secret), body, dict(headers, **{"webhook-timestamp": str(int(time.time()) - 3600)})),
        ]
        for webhook, data, hdrs in refusals:
            try:
                webhook.verify(data, hdrs)
            except WebhookVerificationError:
                continue
            raise AssertionError("a forged delivery verified")

        # A rotation: the next delivery carries both signatures; each secret verifies it.
        rotated = ok(api.post(f"/api/webhooks/endpoints/{endpoint['endpointId']}/rotate-secret", json={}))
        ok(api.post(f"/api/webhooks/endpoints/{endpoint['endpointId']}/test", json={}))
        body, headers = wait_for(len(expected) + 1)[-1]
        assert len(headers["webhook-signature"].split(" ")) == 2, headers["webhook-signature"]
        for key in (secret, rotated["secret"]):
            assert Webhook(key).verify(body, headers)["type"] == "webhook.test"
        print(f"webhooks: {len(expected) + 1} deliveries verified with standardwebhooks; forgeries refused")
    finally:
        if keel is not None:
            stop_keel(keel)
        server.shutdown()
        drop_database(ADMIN_URL, database)


if __name__ == "__main__":
    main()
