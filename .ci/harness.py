"""What the `.ci/*_check.py` scripts share: a free port, a fake HTTP server on a thread, a
scratch PostgreSQL database, and a `keel serve` process started, waited for and stopped."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Tuple, Type

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(handler: Type[BaseHTTPRequestHandler]) -> Tuple[ThreadingHTTPServer, str]:
    """`handler` served on a free local port by a daemon thread: the server and its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def create_database(admin_url: str, name: str) -> str:
    """A new, empty database `name` on the server of `admin_url`: its URL."""
    subprocess.run(["psql", admin_url, "-q", "-c", f'CREATE DATABASE "{name}"'], check=True, capture_output=True)
    return admin_url.rsplit("/", 1)[0] + "/" + name


def drop_database(admin_url: str, name: str) -> None:
    subprocess.run(["psql", admin_url, "-q", "-c", f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'],
                   check=False, capture_output=True)


def start_keel(binary: str, env: Dict[str, str]) -> Tuple[subprocess.Popen[bytes], str]:
    """`keel serve` on a free port with `env`, once `/healthz` answers: the process and its base
    URL. Its stderr is kept for the failure message when it does not come up."""
    port = free_port()
    keel = subprocess.Popen([binary, "serve"], env=dict(env, KEEL_LISTEN=f"127.0.0.1:{port}"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                return keel, base
        except httpx.TransportError:
            pass
        if keel.poll() is not None:
            break
        time.sleep(0.05)
    keel.kill()
    raise AssertionError(f"keel did not start: {keel.stderr.read().decode() if keel.stderr else ''}")


def stop_keel(keel: subprocess.Popen[bytes]) -> None:
    keel.kill()
    keel.wait()


def bootstrap(binary: str, env: Dict[str, str], org: str, owner: str) -> Dict[str, Any]:
    """`keel admin bootstrap`: an organization, its owner and an API key (`apiKey`, `orgId`, ...)."""
    out = subprocess.run([binary, "admin", "bootstrap", "--org", org, "--owner", owner],
                         env=env, check=True, capture_output=True, text=True).stdout
    answer: Dict[str, Any] = json.loads(out)
    return answer
