#!/usr/bin/env python3
"""Issue 21's "done when", with the official OpenAI SDK: 5,000 recorded chat completions
through keel, the same app's embeddings and models calls relayed, then
`keel traces export --all --format openai-chat` gives 5,000 lines.

Environment: KEEL_URL, KEEL_API_KEY, KEEL_BINARY, KEEL_WORK (a scratch folder).
"""

import json
import os
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from openai import OpenAI

CALLS = 5000
base, key, binary = os.environ["KEEL_URL"], os.environ["KEEL_API_KEY"], os.environ["KEEL_BINARY"]
work = Path(os.environ["KEEL_WORK"])


def api(method, path, body=None):
    request = urllib.request.Request(
        base + path, method=method, data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read())


project = api("POST", "/api/projects", {"name": "SDK walkthrough"})["id"]
client = OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, default_headers={
    "X-Service-Provider": "openai",
    "X-Service-Provider-Key": "sk-ci-provider-key",
    "X-Service-Project-Id": project,
})


def ask(i):
    reply = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": f"Question {i}?"}])
    assert reply.choices[0].message.content, reply


started = time.monotonic()
with ThreadPoolExecutor(16) as pool:
    list(pool.map(ask, range(CALLS)))
print(f"   {CALLS} chat completions through keel in {time.monotonic() - started:.1f} s")

# A stream the provider cuts after three chunks (its body ended by the connection's close):
# the SDK raises (keel sends an error event and aborts the body), and the broken trace is
# never exported as training data.
import openai  # noqa: E402

try:
    stream = client.chat.completions.create(
        model="cut-stream", messages=[{"role": "user", "content": "count"}], stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    raise SystemExit(f"a cut stream did not raise in the SDK (it read {text!r})")
except openai.APIError as err:
    assert "stream" in str(err), err
    print(f"   a cut stream raised {type(err).__name__} in the SDK: {err}")

embedding = client.embeddings.create(model="text-embedding-3-small", input="hello")
assert embedding.data and embedding.data[0].embedding, embedding
models = list(client.models.list())
print(f"   embeddings and models relayed ({len(models)} model(s) listed)")

# The trace writer batches: wait until every call is stored.
for _ in range(100):
    counts = {p["projectId"]: p["traceCount"] for p in api("GET", "/api/traces/projects")["projects"]}
    if counts.get(project) == CALLS + 1:
        break
    time.sleep(0.2)
else:
    raise SystemExit(f"traces stored: {counts.get(project)} of {CALLS + 1}")

out = work / "train.jsonl"
subprocess.run([binary, "traces", "export", "--project", project, "--all", "--format", "openai-chat",
                "--out", str(out)], check=True, env=dict(os.environ, KEEL_URL=base, KEEL_API_KEY=key))
lines = out.read_text().splitlines()
# Every call's trace but the cut stream's.
assert len(lines) == CALLS, len(lines)
assert not any("tok0" in line for line in lines), "the cut stream was exported"
first = json.loads(lines[0])
assert [m["role"] for m in first["messages"]] == ["user", "assistant"], first
print(f"   keel traces export --all --format openai-chat: {len(lines)} lines")

# The same calls as a dataset: its openai-chat lines, downloaded with `keel datasets export`
# (checked against the version's SHA-256), are the trace export's lines.
dataset = api("POST", "/api/datasets", {"projectId": project, "name": "sdk", "filter": {}})
assert dataset["versions"][0]["counts"]["train"] == CALLS, dataset
frozen = work / "dataset.jsonl"
subprocess.run([binary, "datasets", "export", "--dataset", dataset["datasetId"], "--split", "train",
                "--out", str(frozen)], check=True, env=dict(os.environ, KEEL_URL=base, KEEL_API_KEY=key))
assert sorted(frozen.read_text().splitlines()) == sorted(lines), "the dataset's lines are the export's"
print(f"   keel datasets export: {CALLS} lines, the trace export's")
