"""`python -m keel_worker --action training -- python train.py`: one command per job.

The command gets the job's payload as JSON on stdin and `KEEL_JOB_ID`, `KEEL_ORG_ID`,
`KEEL_PROJECT_ID`, `KEEL_ACTION` and `KEEL_ATTEMPT` in its environment; what it prints on
stdout (JSON, or nothing for null) is the job's result. Exit code 0 succeeds, 75
(`EX_TEMPFAIL`) is a retryable failure, any other a failure with the end of its stderr. When
the user stops the job the command gets SIGTERM (then SIGKILL after `--kill-after` seconds)
and the job ends `user_stopped`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import subprocess
import sys
import threading
from typing import IO, Any, List, Optional, Sequence

from ._worker import Job, RetryableError, Worker

#: The exit code that asks for another attempt (sysexits.h's EX_TEMPFAIL).
EXIT_RETRYABLE = 75
#: How much of the command's stderr a failure carries.
STDERR_TAIL = 4000


def _tee(stream: IO[bytes], keep: List[bytes], limit: int, echo: Optional[IO[bytes]]) -> None:
    """Copies the command's stderr through, keeping its last `limit` bytes."""
    kept = 0
    for chunk in iter(lambda: stream.read1(8192) if hasattr(stream, "read1") else stream.read(8192), b""):
        if echo is not None:
            echo.write(chunk)
            echo.flush()
        keep.append(chunk)
        kept += len(chunk)
        while kept - len(keep[0]) > limit and len(keep) > 1:
            kept -= len(keep.pop(0))


class CommandHandler:
    """Runs `command` for each job (see the module)."""

    def __init__(self, command: Sequence[str], kill_after: float = 10.0) -> None:
        if not command:
            raise ValueError("a command to run per job")
        self.command = list(command)
        self.kill_after = kill_after

    def __call__(self, job: Job) -> Any:
        env = dict(
            os.environ,
            KEEL_JOB_ID=job.job_id,
            KEEL_ORG_ID=job.org_id,
            KEEL_PROJECT_ID=job.project_id,
            KEEL_ACTION=job.action,
            KEEL_ATTEMPT=str(job.attempt),
        )
        # Its own session: a Ctrl-C at the terminal goes to the worker, which decides.
        child = subprocess.Popen(
            self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, start_new_session=True,
        )
        assert child.stdin is not None and child.stdout is not None and child.stderr is not None
        out: List[bytes] = []
        err: List[bytes] = []
        readers = [
            threading.Thread(target=lambda: out.append(child.stdout.read() if child.stdout else b""), daemon=True),
            threading.Thread(target=_tee, args=(child.stderr, err, STDERR_TAIL, sys.stderr.buffer), daemon=True),
        ]
        for reader in readers:
            reader.start()
        try:
            child.stdin.write(json.dumps(job.payload).encode())
            child.stdin.close()
        except BrokenPipeError:
            pass
        while True:
            try:
                code = child.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if job.stop_requested.is_set():
                    child.terminate()
                    try:
                        code = child.wait(timeout=self.kill_after)
                    except subprocess.TimeoutExpired:
                        child.kill()
                        code = child.wait()
                    break
        for reader in readers:
            reader.join(timeout=5)
        if job.stop_requested.is_set():
            return None
        tail = b"".join(err)[-STDERR_TAIL:].decode("utf-8", "replace").strip()
        if code == EXIT_RETRYABLE:
            raise RetryableError(f"the command exited with {code}: {tail}")
        if code != 0:
            how = f"was killed by signal {-code}" if code < 0 else f"exited with {code}"
            raise CommandFailed(f"the command {how}: {tail}")
        text = b"".join(out).decode("utf-8", "replace").strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError:
            raise CommandFailed(f"the command's stdout is not JSON: {text[:200]}") from None


class CommandFailed(Exception):
    """The job's command failed (its message says how)."""


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command: List[str] = []
    if "--" in args:
        split = args.index("--")
        args, command = args[:split], args[split + 1:]
    parser = argparse.ArgumentParser(
        prog="python -m keel_worker",
        description="Run a command for each keel job: python -m keel_worker --action training -- python train.py",
    )
    parser.add_argument("--action", action="append", required=True, help="an action to claim (repeatable)")
    parser.add_argument("--url", default=os.environ.get("KEEL_URL", "http://127.0.0.1:8080"),
                        help="keel's base URL (KEEL_URL)")
    parser.add_argument("--internal-key", default=os.environ.get("KEEL_INTERNAL_KEY"),
                        help="the internal key (KEEL_INTERNAL_KEY)")
    parser.add_argument("--worker-id", default=os.environ.get("KEEL_WORKER_ID", socket.gethostname()),
                        help="this worker's id, stable across its restarts (KEEL_WORKER_ID; default: the host name)")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--wait-secs", type=int, default=20)
    parser.add_argument("--heartbeat-secs", type=float, default=30)
    parser.add_argument("--grace-secs", type=float, default=60)
    parser.add_argument("--prefetch", type=int, default=None,
                        help="jobs claimed ahead to wait for a slot (default: adaptive, at least half of --concurrency)")
    parser.add_argument("--kill-after", type=float, default=10, help="seconds between SIGTERM and SIGKILL on a stop")
    parser.add_argument("--log-level", default=os.environ.get("KEEL_LOG_LEVEL", "INFO"))
    options = parser.parse_args(args)
    if not command:
        parser.error("the command to run per job goes after --")
    if not options.internal_key:
        parser.error("--internal-key or KEEL_INTERNAL_KEY is required")
    logging.basicConfig(level=options.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    Worker(
        options.url, options.internal_key, options.worker_id, options.action,
        CommandHandler(command, options.kill_after),
        concurrency=options.concurrency, wait_secs=options.wait_secs,
        heartbeat_secs=options.heartbeat_secs, grace_secs=options.grace_secs, prefetch=options.prefetch,
    ).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
