"""The worker loop: claim ahead with a long poll (free slots plus an adaptive prefetch), run the
handler on `concurrency` slot threads, heartbeat every held job in one request, send
reports from a thread of their own (several that end together in one request), hand jobs
back on shutdown."""

from __future__ import annotations

import json
import logging
import random
import signal
import threading
import time
from collections import deque
from types import FrameType
import hashlib
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import httpx

log = logging.getLogger("keel_worker")

#: keel's bound on a report's `error` and `reason` (characters).
MAX_TEXT = 10_000
#: How long the hand-back at shutdown keeps retrying while keel cannot be reached.
HAND_BACK_SECS = 10.0
INTERNAL = "/api/training/internal"
#: At most this many reports, or held jobs heartbeaten, in one request (keel's bound).
MAX_BATCHED = 1000
#: Claims that may go out beside the long poll while an action's claims come back full.
CLAIMS_AHEAD = 2
#: The adaptive prefetch's most, per slot.
MAX_PREFETCH_PER_SLOT = 4
#: The weight of the latest observation in the running means of a job's and a claim's time.
SMOOTHING = 0.2
#: A report's route, by the name `reported` counts it under; and the outcome the batched
#: route names it by.
OUTCOMES = {"succeeded": "succeeded", "failed": "failed", "blocked": "blocked", "user-stopped": "user_stopped"}


class KeelError(Exception):
    """keel refused a call in a way that retrying cannot mend (a wrong internal key, a body
    it does not accept). `run()` raises it for its own calls."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"keel answered {status}: {body[:500]}")
        self.status = status
        self.body = body


class DatasetMismatch(KeelError):
    """The lines `Job.dataset()` read are not the version the job pinned (their count or
    SHA-256 differs from what keel said): raised after the last line, so train on them only
    once the iteration ended without it."""

    def __init__(self, message: str) -> None:
        super().__init__(0, message)


class RetryableError(Exception):
    """Raised by a handler: this attempt failed, but another may succeed. keel schedules the
    job again after a backoff while it has attempts left (`queue.max_attempts`), else it
    fails."""


class Blocked(Exception):
    """Raised (or returned) by a handler: the job cannot run as asked (no quota, a missing
    dataset); it ends `blocked` with `reason`."""

    def __init__(self, reason: str = "blocked") -> None:
        super().__init__(reason)
        self.reason = reason


def _bounded(text: str) -> str:
    text = text.strip() or "(no message)"
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def _describe(error: BaseException) -> str:
    message = str(error)
    return _bounded(f"{type(error).__name__}: {message}" if message else type(error).__name__)


def _transient(status: int) -> bool:
    return status >= 500 or status in (408, 429)


def _retry_after(answer: httpx.Response) -> float:
    """The seconds of a `Retry-After` header (0 when absent or a date; at most a minute)."""
    try:
        return min(max(float(answer.headers.get("retry-after", "0")), 0.0), 60.0)
    except ValueError:
        return 0.0


class Job:
    """A claimed job, as the handler sees it."""

    def __init__(self, worker: "Worker", claimed: Mapping[str, Any]) -> None:
        self.job_id: str = str(claimed["job_id"])
        self.org_id: str = str(claimed["org_id"])
        self.project_id: str = str(claimed["project_id"])
        self.action: str = str(claimed["action"])
        self.payload: Dict[str, Any] = dict(claimed.get("payload") or {})
        #: 1 on the job's first claim, then one more per claim.
        self.attempt: int = int(claimed["attempt"])
        #: 0 (most urgent) to 9.
        self.priority: int = int(claimed.get("priority", 5))
        #: The dataset version the job trains on, as keel pinned it when the job was created:
        #: `{"datasetId", "version", "counts": {"train", "validation"}, "sha256": {"train",
        #: "validation"}}` (the digests of the `openai-chat` lines), or None.
        self.dataset_pinned: Optional[Dict[str, Any]] = (
            dict(claimed["dataset"]) if isinstance(claimed.get("dataset"), Mapping) else None)
        #: Set when keel asks the job to stop (the user stopped it), when the job is no
        #: longer this worker's, or when the worker's grace period ran out. A handler that
        #: returns once it is set because the user asked reports `user-stopped`.
        self.stop_requested = threading.Event()
        self._worker = worker
        # The user asked to stop (a heartbeat said so).
        self._user_stop = False
        # keel no longer counts the job as ours (requeued as stale, ended elsewhere).
        self._lost = False
        # The worker handed it back at shutdown: its report must not be sent.
        self._abandoned = False

    def __repr__(self) -> str:
        return f"Job({self.job_id!r}, action={self.action!r}, attempt={self.attempt})"

    def set_live_status(self, status: Mapping[str, Any]) -> bool:
        """Publishes free-form progress (`{"step": 120, "loss": 0.31}`) that readers of the
        job see; False when keel could not take it (the job is no longer this worker's, or
        keel could not be reached)."""
        body = {"job_id": self.job_id, "worker_id": self._worker.worker_id, "live_status": dict(status)}
        answer = self._worker._send("POST", f"{INTERNAL}/jobs/live-status", body, deadline=time.monotonic() + 10)
        return answer is not None and answer.status_code == 200

    def secrets(self) -> Dict[str, str]:
        """The organization's training secrets (decrypted; never log them)."""
        answer = self._worker._send("GET", f"{INTERNAL}/jobs/{self.job_id}", None, deadline=time.monotonic() + 30)
        if answer is None:
            raise KeelError(0, "keel could not be reached")
        if answer.status_code != 200:
            raise KeelError(answer.status_code, answer.text)
        secrets = answer.json().get("secrets") or {}
        return {str(k): str(v) for k, v in secrets.items()}


    def dataset(self, split: str = "train", format: str = "openai-chat") -> Iterator[Dict[str, Any]]:
        """The lines of the job's dataset version, `split` (`train`, `validation` or `all`) in
        `format` (`openai-chat`, `records` or `prompts`), each parsed, streamed as keel sends
        them (constant memory). A connection that breaks is taken up again after the lines
        already read. After the last line the bytes are checked against the count and SHA-256
        keel gave (and, for `openai-chat`, the digest pinned in `dataset_pinned`):
        `DatasetMismatch` if they differ."""
        if self.dataset_pinned is None:
            raise KeelError(404, f"job {self.job_id} has no dataset")
        expected: Optional[str] = None
        if format == "openai-chat" and split in ("train", "validation"):
            expected = str((self.dataset_pinned.get("sha256") or {}).get(split) or "") or None
        path = f"{INTERNAL}/jobs/{self.job_id}/dataset"
        params = {"worker_id": self._worker.worker_id, "split": split, "format": format}
        return _dataset_lines(self._worker._http, path, params, expected)


def _dataset_lines(http: httpx.Client, path: str, params: Mapping[str, str],
                   pinned: Optional[str]) -> Iterator[Dict[str, Any]]:
    """The lines at `path`, hashed as they come, taken up after the lines read when the
    connection breaks (at most 5 times in a row), checked at the end."""
    digest = hashlib.sha256()
    lines = 0
    total: Optional[int] = None
    said: Optional[str] = pinned
    backoff = _Backoff()
    breaks = 0
    while True:
        pending = b""
        try:
            with http.stream("GET", path, params=dict(params, offset=str(lines)), timeout=httpx.Timeout(300.0, connect=5.0)) as answer:
                if answer.status_code != 200:
                    answer.read()
                    if _transient(answer.status_code) and breaks < 5:
                        raise httpx.RemoteProtocolError(f"HTTP {answer.status_code}")
                    raise KeelError(answer.status_code, answer.text)
                total = int(answer.headers.get("x-dataset-lines", "-1"))
                sha = answer.headers.get("x-dataset-sha256", "")
                if said is not None and sha != said:
                    raise DatasetMismatch(f"keel serves sha256 {sha}, the job pinned {said}")
                said = sha
                for chunk in answer.iter_bytes():
                    pending += chunk
                    *whole, pending = pending.split(b"\n")
                    for line in whole:
                        digest.update(line + b"\n")
                        lines += 1
                        try:
                            parsed = json.loads(line)
                        except ValueError as error:
                            raise DatasetMismatch(f"line {lines} is not JSON: {error}") from error
                        yield dict(parsed)
                        breaks = 0
            if pending:
                raise DatasetMismatch(f"the lines end without a newline after line {lines}")
            break
        except httpx.TransportError as error:
            breaks += 1
            if breaks > 5:
                raise KeelError(0, f"the dataset could not be read: {error}") from error
            delay = backoff.next()
            log.warning("reading the dataset broke off after %d lines (%s); going on in %.1fs", lines, error, delay)
            time.sleep(delay)
    got = digest.hexdigest()
    if lines != total or got != said:
        raise DatasetMismatch(f"read {lines} lines with sha256 {got}; keel said {total} with {said}")


Handler = Callable[[Job], Any]


class _Interrupted(BaseException):
    """Raised by the signal handler to cut a long-poll claim short."""


class Worker:
    """Claims jobs of `actions` for `worker_id` and runs `handler(job)` for each, at most
    `concurrency` at once.

    `run()` blocks until `stop()` is called (from another thread) or, when `run()` is on the
    main thread, until SIGTERM or SIGINT. It then claims nothing more, lets running jobs
    finish within `grace_secs`, and hands back the rest with requeue-interrupted (a second
    signal skips the grace). The handler's return value is the succeeded report's result;
    `RetryableError` reports a retryable failure, `Blocked` a blocked job, any other
    exception a failure with its message; a handler that returns after the user asked it to
    stop reports `user-stopped`.

    The worker keeps its slots full: it claims up to its free slots plus `prefetch` jobs
    that wait for a slot (heartbeaten like the running ones), so a slot that frees takes the
    next job at once. By default (`prefetch=None`) the prefetch adapts: at least half of
    `concurrency` (none for a worker of one slot), and, while jobs are short against a
    claim's round trip, the jobs the slots end in two round trips (at most
    `MAX_PREFETCH_PER_SLOT` per slot), so a job claimed ahead waits about two round trips
    behind jobs of the usual length. One long job brings it back to the floor (the jobs
    claimed ahead while short ones ran may wait behind that one).
    While claims come back full, up to `CLAIMS_AHEAD` more go out beside the long poll.
    Reports go out from a thread of their own and never hold a slot; several that end
    together go in one request.
    """

    def __init__(
        self,
        base_url: str,
        internal_key: str,
        worker_id: str,
        actions: Sequence[str],
        handler: Handler,
        *,
        concurrency: int = 1,
        wait_secs: int = 20,
        heartbeat_secs: float = 30,
        grace_secs: float = 60,
        prefetch: Optional[int] = None,
    ) -> None:
        if isinstance(actions, str):
            actions = [actions]
        if not actions:
            raise ValueError("actions: at least one action")
        if not 1 <= len(worker_id) <= 200:
            raise ValueError("worker_id: 1 to 200 characters")
        if concurrency < 1:
            raise ValueError("concurrency: at least 1")
        if heartbeat_secs <= 0 or wait_secs < 0 or grace_secs < 0:
            raise ValueError("heartbeat_secs must be positive, wait_secs and grace_secs not negative")
        if prefetch is not None and prefetch < 0:
            raise ValueError("prefetch: not negative")
        self.base_url = base_url.rstrip("/")
        self.worker_id = worker_id
        self.actions: List[str] = list(actions)
        self.handler = handler
        self.concurrency = concurrency
        self.wait_secs = wait_secs
        self.heartbeat_secs = heartbeat_secs
        self.grace_secs = grace_secs
        # A fixed prefetch, or None: adaptive (see the class and `prefetch`).
        self._fixed_prefetch = prefetch
        # Running means of a handler's time and of a claim answered at once (seconds), for
        # the adaptive prefetch; None until one is seen.
        self._job_secs: Optional[float] = None
        self._claim_secs: Optional[float] = None
        headers = {"Authorization": f"Bearer {internal_key}", "User-Agent": "keel-worker/0.1"}
        timeout = httpx.Timeout(30.0, connect=5.0)
        # Reports, heartbeats and hand-backs share one pool; claims keep their own, so a
        # long poll cut short by a signal leaves the shared pool whole.
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)
        self._claims = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)
        # Reentrant: the main thread may stop() while it holds the lock (after a signal).
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        # What the slot threads wait on (the same lock): told once per job made ready and at
        # a stop, so a change that only the claim, report or heartbeat threads care about
        # does not wake every slot.
        self._work = threading.Condition(self._lock)
        # Jobs claimed ahead, waiting for a slot; jobs whose handler runs (they hold a slot);
        # then jobs whose report is on its way (they do not: the next job overlaps the report),
        # with the reports not yet sent.
        self._ready: "deque[Job]" = deque()
        self._running: Dict[str, Tuple[Job, threading.Thread]] = {}
        self._reporting: Dict[str, Job] = {}
        self._outbox: List[Tuple[Job, str, Dict[str, Any]]] = []
        # Jobs asked for by claims in flight; and the action whose last claim came back full
        # (more are queued: claims may go out beside the long poll), if any.
        self._claiming = 0
        self._backlog: Optional[str] = None
        self._ahead: List[threading.Thread] = []
        self._stopping = threading.Event()
        self._hurry = False
        self._stopped_at: Optional[float] = None
        self._in_claim = False
        # Signals arrived and seen: a signal handler only counts (and cuts a long poll); the
        # main thread acts on the count outside it, so the handler never takes a lock.
        self._signals = 0
        self._signals_seen = 0
        self._started = False
        #: Jobs this worker ran to a report, by the report sent (succeeded, failed, ...).
        self.reported: Dict[str, int] = {}

    # -- control --------------------------------------------------------------------------

    def stop(self) -> None:
        """Asks `run()` to wind down: no more claims, running jobs get `grace_secs`. Safe
        from any thread and from a signal handler; a second call skips the grace."""
        with self._changed:
            if self._stopping.is_set():
                self._hurry = True
            else:
                self._stopped_at = time.monotonic()
                self._stopping.set()
            self._changed.notify_all()
            self._work.notify_all()

    @property
    def prefetch(self) -> int:
        """The jobs the worker claims beyond its free slots now: the fixed `prefetch`, or the
        adaptive one (see the class)."""
        if self._fixed_prefetch is not None:
            return self._fixed_prefetch
        floor = self.concurrency // 2
        job, claim = self._job_secs, self._claim_secs
        if job is None or claim is None:
            return floor
        # The jobs the slots end during two claim round trips.
        covering = int(2 * self.concurrency * claim / max(job, 1e-6))
        return max(floor, min(covering, MAX_PREFETCH_PER_SLOT * self.concurrency))

    def _wanted(self) -> int:
        """The jobs the worker wants to hold (running, waiting for a slot, being claimed)."""
        return self.concurrency + self.prefetch

    def _observe(self, name: str, secs: float) -> None:
        """Folds one observation into the running mean `name` (`_job_secs`, `_claim_secs`)."""
        with self._lock:
            known = getattr(self, name)
            setattr(self, name, secs if known is None else known + SMOOTHING * (secs - known))

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def running_jobs(self) -> List[Job]:
        with self._lock:
            return [job for job, _ in self._running.values()]

    def run(self) -> None:
        """Works until stopped; see the class. Raises `KeelError` when keel refuses the
        worker itself (a wrong internal key)."""
        if self._started:
            raise RuntimeError("a Worker runs once; make another")
        self._started = True
        restore = self._install_signals()
        helpers = [
            threading.Thread(target=self._slot_loop, name=f"keel-slot-{n}", daemon=True)
            for n in range(self.concurrency)
        ]
        helpers.append(threading.Thread(target=self._report_loop, name="keel-reports", daemon=True))
        self._ahead = [
            threading.Thread(target=self._claim_ahead_loop, name=f"keel-claims-ahead-{n}", daemon=True)
            for n in range(CLAIMS_AHEAD)
        ]
        helpers.extend(self._ahead)
        helpers.append(threading.Thread(target=self._heartbeat_loop, name="keel-heartbeats", daemon=True))
        try:
            self._hand_back(deadline=None)
            for thread in helpers:
                thread.start()
            self._claim_loop()
        except _Interrupted:
            pass
        finally:
            try:
                self._shut_down()
            finally:
                for signum, previous in restore:
                    signal.signal(signum, previous)
                self._claims.close()
                self._http.close()

    def _install_signals(self) -> List[Tuple[int, Any]]:
        if threading.current_thread() is not threading.main_thread():
            return []

        def on_signal(signum: int, frame: Optional[FrameType]) -> None:
            self._signals += 1
            if self._in_claim:
                # Cut the long poll: a job it claimed anyway is handed back at shutdown.
                raise _Interrupted()

        restore: List[Tuple[int, Any]] = []
        for signum in (signal.SIGTERM, signal.SIGINT):
            restore.append((signum, signal.getsignal(signum)))
            signal.signal(signum, on_signal)
        return restore

    # -- claiming -------------------------------------------------------------------------

    def _check_signals(self) -> bool:
        """Acts on signals counted since the last look (main thread); True once stopping."""
        while self._signals_seen < self._signals:
            self._signals_seen += 1
            log.info("signal: stopping (running jobs get %ss; another signal skips that)", self.grace_secs)
            self.stop()
        return self._stopping.is_set()

    def _pause(self, secs: float) -> None:
        """Sleeps up to `secs`, waking early when stopped."""
        until = time.monotonic() + secs
        while not self._check_signals():
            left = until - time.monotonic()
            if left <= 0:
                return
            self._stopping.wait(min(left, 0.2))

    def _room(self) -> int:
        """Waits until the worker may claim (room for a claim worth making: its slots and
        prefetch not all taken, and the jobs waiting for a slot running low); answers how
        many to claim, 0 once stopping."""
        with self._changed:
            while not self._check_signals():
                wanted = self._wanted()
                held = len(self._running) + len(self._ready) + self._claiming
                room = wanted - held
                # Claim at once when a slot would otherwise idle, else when a quarter of the
                # room is free (claims of several jobs, not one per job that ends).
                if room > 0 and (len(self._ready) == 0 or room >= max(1, wanted // 4)):
                    return room
                self._changed.wait(0.2)
            return 0

    def _claim_loop(self) -> None:
        turn = 0
        backoff = _Backoff()
        # With several actions, each long poll is a share of wait_secs, so no action waits
        # longer than wait_secs for a look.
        wait = self.wait_secs if len(self.actions) == 1 else max(1, self.wait_secs // len(self.actions))
        while True:
            room = self._room()
            if room == 0:
                return
            action = self.actions[turn % len(self.actions)]
            turn += 1
            asked = time.monotonic()
            with self._changed:
                self._claiming += room
            try:
                claimed, retry_after = self._claim(action, room, wait)
            finally:
                with self._changed:
                    self._claiming -= room
                    self._changed.notify_all()
            with self._changed:
                # A full answer: more are queued, and a claim beside this loop's may help.
                self._backlog = action if claimed is not None and len(claimed) >= min(room, 100) else None
                self._changed.notify_all()
            if claimed is None:
                # keel failed or is draining: wait (its Retry-After, at least), with jitter.
                self._pause(max(backoff.next(), retry_after * random.uniform(1.0, 1.2)))
                continue
            if not claimed and wait > 0 and time.monotonic() - asked < wait * 0.8:
                # An empty answer long before the wait was up: keel is not holding long polls
                # (shutting down, or a proxy cut it); asking again at once would flood it.
                self._pause(backoff.next())
                continue
            backoff.reset()
            jobs = [Job(self, item) for item in claimed]
            if self._check_signals():
                # Claimed as the worker stopped: handed back with the rest at shutdown.
                continue
            with self._changed:
                self._ready.extend(jobs)
                self._work.notify(len(jobs))
                self._changed.notify_all()

    def _claim_ahead_loop(self) -> None:
        """While an action's claims come back full (a backlog), claims go out beside the main
        loop's (one per such thread, `CLAIMS_AHEAD`), without a long poll, so the worker's
        claims overlap their round trips; they stop as soon as one comes back short."""
        while True:
            with self._changed:
                while True:
                    if self._stopping.is_set():
                        return
                    wanted = self._wanted()
                    room = wanted - len(self._running) - len(self._ready) - self._claiming
                    if self._backlog is not None and room >= max(1, wanted // 4):
                        break
                    self._changed.wait(0.2)
                action = self._backlog
                self._claiming += room
            claimed: Optional[List[Mapping[str, Any]]] = None
            try:
                claimed, _ = self._claim(action, room, 0, interruptible=False)
            except KeelError as error:
                log.warning("claim ahead: %s", error)
            finally:
                with self._changed:
                    self._claiming -= room
                    if claimed is None or len(claimed) < min(room, 100):
                        self._backlog = None
                    if claimed and not self._stopping.is_set():
                        self._ready.extend(Job(self, item) for item in claimed)
                        self._work.notify(len(claimed))
                    self._changed.notify_all()

    def _claim(
        self, action: str, limit: int, wait: int, interruptible: bool = True,
    ) -> Tuple[Optional[List[Mapping[str, Any]]], float]:
        """The jobs claimed (perhaps none), or None after a transient failure; and the
        seconds keel asked to wait before the next claim (its `Retry-After`, else 0). Only the
        main loop's claims (`interruptible`) may be cut short by a signal."""
        headers = {"Prefer": f"wait={wait}"} if wait > 0 else {}
        body = {"worker_id": self.worker_id, "action": action, "limit": min(limit, 100)}
        client = self._claims if interruptible else self._http
        if interruptible:
            self._in_claim = True
        asked = time.monotonic()
        try:
            if interruptible and self._check_signals():
                return [], 0.0
            answer = client.post(
                f"{INTERNAL}/jobs/claim", json=body, headers=headers,
                timeout=httpx.Timeout(wait + 30.0, connect=5.0),
            )
        except httpx.TransportError as error:
            log.warning("claim: keel unreachable (%s); retrying", error)
            return None, 0.0
        finally:
            if interruptible:
                self._in_claim = False
        if _transient(answer.status_code):
            retry_after = _retry_after(answer)
            log.warning("claim: keel answered %s; retrying in %.0fs at least", answer.status_code, retry_after)
            return None, retry_after
        if answer.status_code != 200:
            raise KeelError(answer.status_code, answer.text)
        jobs: List[Mapping[str, Any]] = answer.json().get("jobs") or []
        if jobs and len(jobs) >= min(limit, 100):
            # A full answer came at once (a long poll returns early only with jobs enough):
            # the claim's round trip.
            self._observe("_claim_secs", time.monotonic() - asked)
        return jobs, 0.0

    # -- running jobs -------------------------------------------------------------------

    def _slot_loop(self) -> None:
        """One slot: runs the jobs waiting for a slot, one after another, until stopping."""
        while True:
            with self._work:
                while not self._ready and not self._stopping.is_set():
                    self._work.wait(0.2)
                if self._stopping.is_set():
                    return
                job = self._ready.popleft()
                self._running[job.job_id] = (job, threading.current_thread())
                self._changed.notify_all()
            self._run_job(job)

    def _run_job(self, job: Job) -> None:
        if job._user_stop:
            # Stopped by its user while it waited for a slot: it never runs.
            path, body = "user-stopped", {"job_id": job.job_id, "worker_id": self.worker_id,
                                          "reason": "stopped at the user's request before it started"}
        else:
            began = time.monotonic()
            try:
                path, body = self._outcome(job)
            except BaseException:  # noqa: BLE001 - _outcome catches the handler's; this is ours
                log.exception("%s: could not work out its report", job)
                path, body = "failed", {"job_id": job.job_id, "worker_id": self.worker_id, "error": "keel_worker failed"}
            self._observe("_job_secs", time.monotonic() - began)
        with self._changed:
            # The slot is free once the handler is done: the report overlaps the next job.
            self._running.pop(job.job_id, None)
            if job._lost:
                log.warning("%s: keel no longer counts it as this worker's; its outcome is not reported", job)
            elif not job._abandoned:
                self._reporting[job.job_id] = job
                self._outbox.append((job, path, body))
            self._changed.notify_all()

    def _outcome(self, job: Job) -> Tuple[str, Dict[str, Any]]:
        """Runs the handler; the report it calls for."""
        ids = {"job_id": job.job_id, "worker_id": self.worker_id}
        try:
            value = self.handler(job)
        except RetryableError as error:
            log.info("%s: retryable failure: %s", job, error)
            return "failed", {**ids, "error": _describe(error), "retryable": True}
        except Blocked as blocked:
            return "blocked", {**ids, "reason": _bounded(blocked.reason)}
        except BaseException as error:  # noqa: BLE001 - a job never stays running
            log.exception("%s: the handler raised", job)
            return "failed", {**ids, "error": _describe(error)}
        if isinstance(value, Blocked):
            return "blocked", {**ids, "reason": _bounded(value.reason)}
        if job._user_stop:
            return "user-stopped", {**ids, "reason": "stopped at the user's request"}
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as error:
            return "failed", {**ids, "error": _bounded(f"the handler's result is not JSON: {error}")}
        return "succeeded", {**ids, "result": value}

    def _held(self) -> List[Job]:
        with self._lock:
            return [job for job, _ in self._running.values()] + list(self._ready) + list(self._reporting.values())

    def _heartbeat_loop(self) -> None:
        """Every `heartbeat_secs`, one heartbeat for every job the worker holds (running,
        waiting for a slot, or reported but not yet answered); through the grace too, until
        nothing runs."""
        interval = self.heartbeat_secs
        while True:
            due = time.monotonic() + interval
            with self._changed:
                while time.monotonic() < due:
                    if self._stopping.is_set() and not self._running and not self._reporting:
                        return
                    self._changed.wait(min(0.2, max(0.0, due - time.monotonic())))
            interval = self.heartbeat_secs
            held = {job.job_id: job for job in self._held() if not job._abandoned}
            ids = list(held)
            for start in range(0, len(ids), MAX_BATCHED):
                if not self._heartbeat(held, ids[start:start + MAX_BATCHED]):
                    interval = min(self.heartbeat_secs, 5.0)

    def _heartbeat(self, held: Mapping[str, Job], ids: List[str]) -> bool:
        """One heartbeat request; False when keel could not be reached or failed."""
        if not ids:
            return True
        try:
            answer = self._http.post(
                f"{INTERNAL}/jobs/heartbeats",
                json={"worker_id": self.worker_id, "job_ids": ids},
                timeout=httpx.Timeout(min(30.0, max(5.0, self.heartbeat_secs)), connect=5.0),
            )
        except httpx.TransportError as error:
            log.warning("heartbeat: keel unreachable (%s)", error)
            return False
        if answer.status_code != 200:
            log.warning("heartbeat: keel answered %s", answer.status_code)
            return False
        try:
            beats = answer.json().get("jobs") or []
        except ValueError:
            return False
        for beat in beats:
            job = held.get(str(beat.get("job_id")))
            if job is None or job.job_id in self._reporting:
                continue
            if not beat.get("ok"):
                log.warning("%s: keel no longer counts it as this worker's", job)
                job._lost = True
                job.stop_requested.set()
                with self._changed:
                    if job in self._ready:
                        self._ready.remove(job)
                        self._changed.notify_all()
            elif beat.get("stop_requested") and not job._user_stop:
                log.info("%s: the user asked to stop", job)
                job._user_stop = True
                job.stop_requested.set()
        return True

    def _report_loop(self) -> None:
        """Sends the reports as jobs end: one on its own route, several that ended together
        in one request; until stopping with nothing left to send."""
        while True:
            with self._changed:
                while not self._outbox:
                    if self._stopping.is_set() and not self._running and not self._reporting:
                        return
                    if self._hurry:
                        return
                    self._changed.wait(0.2)
                batch = self._outbox[:MAX_BATCHED]
                del self._outbox[:MAX_BATCHED]
            try:
                if len(batch) == 1:
                    self._report(*batch[0])
                else:
                    self._report_many(batch)
            finally:
                with self._changed:
                    for job, _, _ in batch:
                        self._reporting.pop(job.job_id, None)
                    self._changed.notify_all()

    def _counted(self, path: str) -> None:
        with self._lock:
            self.reported[path] = self.reported.get(path, 0) + 1

    def _report(self, job: Job, path: str, body: Dict[str, Any]) -> None:
        """Sends one report, retrying while keel cannot be reached; a repeat of a report
        keel already took is answered 200, so a retry never ends the job twice."""
        answer = self._send("POST", f"{INTERNAL}/jobs/{path}", body, deadline=None, give_up=lambda: job._abandoned)
        if answer is None:
            log.warning("%s: its %s report was not sent (handed back at shutdown)", job, path)
        elif answer.status_code == 200:
            self._counted(path)
        else:
            log.warning("%s: keel refused its %s report: %s %s", job, path, answer.status_code, answer.text[:300])

    def _report_many(self, batch: List[Tuple[Job, str, Dict[str, Any]]]) -> None:
        """Sends several reports in one request (`/jobs/reports`), retried as one report is."""
        items = [{**body, "outcome": OUTCOMES[path]} for _, path, body in batch]
        answer = self._send(
            "POST", f"{INTERNAL}/jobs/reports", {"reports": items}, deadline=None,
            give_up=lambda: all(job._abandoned for job, _, _ in batch),
        )
        if answer is None:
            log.warning("%d reports were not sent (handed back at shutdown)", len(batch))
            return
        if answer.status_code != 200:
            log.warning("keel refused %d reports: %s %s", len(batch), answer.status_code, answer.text[:300])
            return
        results = answer.json().get("results") or []
        for (job, path, _), result in zip(batch, results):
            if result.get("ok"):
                self._counted(path)
            else:
                log.warning("%s: keel refused its %s report: %s", job, path, result.get("error"))

    # -- shutting down --------------------------------------------------------------------

    def _shut_down(self) -> None:
        if not self._check_signals():
            self.stop()
        started = self._stopped_at if self._stopped_at is not None else time.monotonic()
        deadline = started + self.grace_secs
        with self._changed:
            while (self._running or self._reporting) and not self._hurry:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(min(left, 0.2))
                self._check_signals()
            leftover = [job for job, _ in self._running.values()] + list(self._reporting.values())
            leftover += list(self._ready)
            self._ready.clear()
            for job in leftover:
                job._abandoned = True
                job.stop_requested.set()
        if leftover:
            log.warning("grace over: handing back %d job(s) not yet reported", len(leftover))
        # Claims beside the main loop's (no long poll) end soon; what they took is handed back
        # with the rest, so they must have ended first.
        for ahead in self._ahead:
            if ahead.is_alive():
                ahead.join(35.0)
        self._hand_back(deadline=time.monotonic() + HAND_BACK_SECS)

    def _hand_back(self, deadline: Optional[float]) -> None:
        """requeue-interrupted for this worker: at start, the jobs a previous run of it left
        claimed; at shutdown, the jobs it could not finish (and any a cut claim took)."""
        give_up = None if deadline is not None else self._check_signals
        answer = self._send(
            "POST", f"{INTERNAL}/jobs/requeue-interrupted", {"worker_id": self.worker_id},
            deadline=deadline, give_up=give_up,
        )
        if answer is None:
            if deadline is not None:
                log.warning("could not hand jobs back: keel unreachable; its stale sweep will requeue them")
            return
        if answer.status_code != 200:
            raise KeelError(answer.status_code, answer.text)
        requeued = answer.json().get("requeued", 0)
        if requeued:
            log.info("handed back %s job(s) held by %s", requeued, self.worker_id)

    def _send(
        self,
        method: str,
        path: str,
        body: Optional[Mapping[str, Any]],
        *,
        deadline: Optional[float],
        give_up: Optional[Callable[[], bool]] = None,
    ) -> Optional[httpx.Response]:
        """One call, retried with backoff after connection errors and 5xx answers until it
        is answered, `deadline` passes or `give_up()` says so (None then)."""
        backoff = _Backoff()
        while True:
            if give_up is not None and give_up():
                return None
            try:
                answer = self._http.request(method, path, json=body)
                if not _transient(answer.status_code):
                    return answer
                reason = f"HTTP {answer.status_code}"
            except httpx.TransportError as error:
                reason = str(error) or type(error).__name__
            delay = backoff.next()
            if deadline is not None and time.monotonic() + delay > deadline:
                return None
            log.warning("%s %s: %s; retrying in %.1fs", method, path, reason, delay)
            time.sleep(delay)


class _Backoff:
    """0.2 s doubling to 10 s, each with ±20% jitter."""

    def __init__(self) -> None:
        self._next = 0.2

    def next(self) -> float:
        delay = self._next * random.uniform(0.8, 1.2)
        self._next = min(self._next * 2, 10.0)
        return delay

    def reset(self) -> None:
        self._next = 0.2
