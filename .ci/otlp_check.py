"""Traces exported as OTLP/JSON (issue 44), checked with the OpenTelemetry reference package
(`opentelemetry-proto`'s generated classes and protobuf's JSON parser), not keel's code:
calls recorded through keel (the OpenAI SDK), one tagged and scored, then
`keel traces export --format otlp-json --all --tag ... --min-score ...` and the unfiltered
export; every line must parse as an `ExportTraceServiceRequest` and carry the GenAI
semantic-convention attributes, and its trace and span ids must be keel's, byte for byte.

OTLP/JSON writes trace and span ids in hex, where protobuf's own JSON mapping reads bytes as
base64: a line is read as an OTLP/JSON receiver reads it, its ids turned from hex into the
bytes they name before protobuf's parser sees them (read as base64 instead, a 32-character
trace id becomes 24 other bytes).

Then the push (issue 58): the project is pointed at a receiver (`PATCH /api/projects/{id}
{"otlpExport": ...}`, as Langfuse takes it: a base URL and a Basic authorization header) that
decodes each OTLP/HTTP protobuf request with the same reference classes; the calls recorded
next arrive as spans with keel's ids, the model, the tokens and the messages.

Usage: otlp_check.py KEEL_BINARY
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Dict, List

import httpx
from google.protobuf.json_format import Parse
from openai import OpenAI
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from harness import bootstrap, serve, start_keel, stop_keel

BINARY = sys.argv[1]
COMPLETION = {
    "id": "chatcmpl-otlp", "object": "chat.completion", "created": 1763683200, "model": "gpt-4o-mini-2024-07-18",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris."}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 24, "completion_tokens": 8, "total_tokens": 32},
}


class Provider(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
        self.rfile.read(int(self.headers.get("content-length", "0")))
        data = json.dumps(COMPLETION).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


PUSHED: List[Any] = []
PUSH_HEADERS: List[Dict[str, str]] = []


class Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver: protobuf `ExportTraceServiceRequest`s at /api/public/otel/v1/traces."""

    def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        ok = self.path == "/api/public/otel/v1/traces" and self.headers.get("content-type") == "application/x-protobuf"
        if ok:
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    PUSHED.extend(scope.spans)
            PUSH_HEADERS.append({k.lower(): v for k, v in self.headers.items()})
        self.send_response(200 if ok else 404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def attributes(span: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind)
    return out


ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def otlp_json(line: str) -> ExportTraceServiceRequest:
    """One OTLP/JSON line as an OTLP receiver reads it: hex ids become their bytes."""
    document = json.loads(line)
    for resource in document.get("resourceSpans", []):
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                for field in ID_FIELDS:
                    if span.get(field):
                        span[field] = base64.b64encode(bytes.fromhex(span[field])).decode()
    return Parse(json.dumps(document), ExportTraceServiceRequest())


def spans_of(path: Path) -> List[Any]:
    spans = []
    for line in path.read_text().splitlines():
        request = otlp_json(line)
        for resource in request.resource_spans:
            assert any(a.key == "service.name" for a in resource.resource.attributes)
            for scope in resource.scope_spans:
                spans.extend(scope.spans)
    return spans


def main() -> None:
    provider, fake = serve(Provider)
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ, KEEL_DATABASE_URL=f"sqlite://{scratch}/keel.db?mode=rwc",
                   KEEL_INTERNAL_KEYS="otlp-check-internal", KEEL_SESSION_SECRET="otlp-check-session-secret-0123456789",
                   KEEL__PROVIDERS__OPENAI_URL=f"{fake}/v1", RUST_LOG="warn",
                   # The receiver listens on loopback over http.
                   KEEL__WEBHOOKS__ALLOW_HTTP="true", KEEL__WEBHOOKS__ALLOW_PRIVATE_DESTINATIONS="true",
                   KEEL__OTLP_PUSH__INTERVAL_MS="200")
        keel, base = start_keel(BINARY, env)
        try:
            boot = bootstrap(BINARY, env, "Otlp", "otlp-owner")
            api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {boot['apiKey']}"}, timeout=30)
            project = api.post("/api/projects", json={"name": "otlp"}).json()["id"]
            client = OpenAI(base_url=base + "/v1", api_key=boot["apiKey"], max_retries=0, default_headers={
                "X-Service-Provider": "openai", "X-Service-Provider-Key": "sk-otlp", "X-Service-Project-Id": project})
            for question in ["Capital of France?", "Capital of Italy?", "Capital of Spain?"]:
                client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": question}])
            traces: List[Dict[str, Any]] = []
            for _ in range(100):
                traces = api.get("/api/traces", params={"projectId": project}).json()["traces"]
                if len(traces) == 3:
                    break
                time.sleep(0.1)
            assert len(traces) == 3, traces
            chosen = traces[0]["traceId"]
            assert api.post(f"/api/traces/{chosen}/tags", json={"add": ["golden"]}).status_code == 200
            assert api.put(f"/api/traces/{chosen}/scores/quality", json={"value": 0.9}).status_code == 200

            cli_env = dict(env, KEEL_URL=base, KEEL_API_KEY=boot["apiKey"])
            every = Path(scratch) / "all.jsonl"
            subprocess.run([BINARY, "traces", "export", "--project", project, "--format", "otlp-json", "--all",
                            "--out", str(every)], env=cli_env, check=True, capture_output=True)
            spans = spans_of(every)
            assert len(spans) == 3, spans
            for span in spans:
                a = attributes(span)
                assert a["gen_ai.operation.name"] == "chat", a
                assert a["gen_ai.provider.name"] == "openai", a
                assert a["gen_ai.request.model"] == "gpt-4o-mini", a
                assert a["gen_ai.response.model"] == "gpt-4o-mini-2024-07-18", a
                assert a["gen_ai.usage.input_tokens"] == 24 and a["gen_ai.usage.output_tokens"] == 8, a
                inputs = json.loads(a["gen_ai.input.messages"])
                assert inputs[0]["role"] == "user" and inputs[0]["parts"][0]["type"] == "text", inputs
                outputs = json.loads(a["gen_ai.output.messages"])
                assert outputs == [{"role": "assistant", "parts": [{"type": "text", "content": "Paris."}],
                                    "finish_reason": "stop"}], outputs
                assert span.kind == span.SPAN_KIND_CLIENT and span.end_time_unix_nano > span.start_time_unix_nano
                # The ids are keel's, byte for byte: the trace id is the trace's UUID, the span
                # id its last 8 bytes.
                keel_id = bytes.fromhex(a["keel.trace_id"].replace("-", ""))
                assert len(span.trace_id) == 16 and span.trace_id == keel_id, (span.trace_id.hex(), keel_id.hex())
                assert len(span.span_id) == 8 and span.span_id == keel_id[8:], span.span_id.hex()
            assert {a["keel.trace_id"] for a in map(attributes, spans)} == {t["traceId"] for t in traces}

            chosen_only = Path(scratch) / "golden.jsonl"
            subprocess.run([BINARY, "traces", "export", "--project", project, "--format", "otlp-json", "--all",
                            "--tag", "golden", "--min-score", "quality:0.5", "--out", str(chosen_only)],
                           env=cli_env, check=True, capture_output=True)
            golden = spans_of(chosen_only)
            assert len(golden) == 1, golden
            a = attributes(golden[0])
            assert a["keel.trace_id"] == chosen and a["keel.score.quality"] == 0.9, a
            print(f"   otlp-json: {len(spans)} spans parsed by opentelemetry-proto with the GenAI attributes "
                  "and keel's ids byte for byte; tag and minScore select the export")

            # The push: the owner points the project at a receiver, Langfuse-style.
            receiver, receiver_url = serve(Receiver)
            basic = "Basic " + base64.b64encode(b"pk-lf-check:sk-lf-check").decode()
            owner = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {boot['sessionToken']}",
                                                         "X-Org-Id": boot["orgId"]}, timeout=30)
            set_push = owner.patch(f"/api/projects/{project}", json={"otlpExport": {
                "endpoint": f"{receiver_url}/api/public/otel", "headers": {"Authorization": basic}}})
            assert set_push.status_code == 200, set_push.text
            assert "sk-lf-check" not in set_push.text and basic not in set_push.text, set_push.text
            for question in ["Capital of Peru?", "Capital of Chile?"]:
                client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": question}])
            for _ in range(150):
                if len(PUSHED) >= 2:
                    break
                time.sleep(0.1)
            assert len(PUSHED) == 2, PUSHED
            assert all(h.get("authorization") == basic for h in PUSH_HEADERS), PUSH_HEADERS
            recorded = {t["traceId"] for t in api.get("/api/traces", params={"projectId": project}).json()["traces"]}
            for span in PUSHED:
                a = attributes(span)
                keel_id = bytes.fromhex(a["keel.trace_id"].replace("-", ""))
                assert span.trace_id == keel_id and span.span_id == keel_id[8:], span
                assert a["keel.trace_id"] in recorded, a
                assert a["gen_ai.request.model"] == "gpt-4o-mini", a
                assert a["gen_ai.usage.input_tokens"] == 24 and a["gen_ai.usage.output_tokens"] == 8, a
                question = json.loads(a["gen_ai.input.messages"])[0]["parts"][0]["content"]
                assert question in ("Capital of Peru?", "Capital of Chile?"), question
                assert json.loads(a["gen_ai.output.messages"])[0]["parts"][0]["content"] == "Paris.", a
            receiver.shutdown()
            print(f"   push: {len(PUSHED)} recorded calls arrived at an OTLP/HTTP receiver as protobuf spans "
                  "(opentelemetry-proto) with keel's ids, the Basic header, the model, tokens and messages")
        finally:
            stop_keel(keel)
            provider.shutdown()


if __name__ == "__main__":
    main()
