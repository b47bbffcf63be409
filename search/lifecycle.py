"""Start a server and follow it to readiness or to the failure that ends it, within a second.

The seed engineer waited minutes, grepping the log by hand, to learn whether a restart had
survived autotune. Here every log line goes through the classifier as it is written; the wait
ends on a failure line, on the process exiting, on a phase that goes silent for longer than its
timeout, or on readiness (the ready line *and* ``/health`` answering 200). The same
:class:`Watch` keeps reading the log during the load test so that a dying server aborts it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from search.hosts.base import Host, ServerHandle
from search.logwatch import Event, LogClassifier, describe, signature_version

if TYPE_CHECKING:
    from search.profile import LaunchProfile

OnEvent = Callable[[Event], None]

INFRASTRUCTURE_FAILURES = frozenset({"gpu_busy", "port_busy"})  # the host's fault, not the config's
HEALTH_TIMEOUT_S = 60.0  # after the ready line, unless timeouts["ready"] says otherwise
_TICK_S = 0.1  # longest wait for log lines before the process and the stall timer are checked
_HEALTH_TICK_S = 0.05  # /health poll interval once the ready line is in
_HEALTH_REQUEST_S = 2.0
_SETTLE_S = 0.25  # after the first failure line, how long more informative lines may still come
_STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class PhaseSpan:
    start: float  # epoch seconds
    duration: float


@dataclass(frozen=True)
class Failure:
    """Why a server did not become (or stay) ready, with the line that proves it."""

    kind: str  # one of search.logwatch.FAILURES
    phase: str
    line: str
    infrastructure: bool  # not the config's fault: the study retries instead of blaming it
    message: str  # "crashed at autotune: CalledProcessError: ... ninja ..."
    advice: tuple[str, ...] = ()  # the lines after it that name a flag: what SGLang suggests changing

    @classmethod
    def from_event(cls, event: Event, advice: Sequence[str] = ()) -> Failure:
        return cls(event.name, event.phase, event.line.strip(), event.name in INFRASTRUCTURE_FAILURES,
                   describe(event), tuple(advice))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "phase": self.phase, "line": self.line, "message": self.message,
                "infrastructure": self.infrastructure, "advice": list(self.advice)}


class Watch:
    """Feeds a server's new log lines to its classifier and reports the events.

    Used by :func:`start_server` and afterwards by the trial: :meth:`abort_reason` is the load
    test's ``should_abort``.
    """

    def __init__(self, handle: ServerHandle, classifier: LogClassifier, on_event: OnEvent | None) -> None:
        self.handle = handle
        self.classifier = classifier
        self._on_event = on_event
        self._exit: Event | None = None  # the process ended without a line saying why

    @property
    def failure(self) -> Event | None:
        """The best evidence of failure so far: the classifier's, else the bare exit."""
        return self.classifier.failure or self._exit

    def emit(self, event: Event) -> None:
        if self._on_event is not None:
            self._on_event(event)

    def pump(self, timeout: float) -> int:
        """Classify the lines that arrive within ``timeout``; return how many there were."""
        lines = self.handle.new_lines(timeout)
        for line in lines:
            for event in self.classifier.feed(line):
                self.emit(event)
        return len(lines)

    def settle(self, limit: float = _SETTLE_S) -> None:
        """Keep reading for up to ``limit`` s, less once the process has exited and gone quiet."""
        deadline = time.monotonic() + limit
        while (left := deadline - time.monotonic()) > 0:
            if self.pump(min(left, 0.05)) == 0 and self.handle.returncode() is not None:
                return

    def exit_failure(self, returncode: int) -> Event:
        """The failure of a process that exited without a line saying why."""
        last = self.classifier.last_line
        tail = f"; last line: {self.classifier.message(last)}" if last else ""
        self._exit = Event("failure", "crash", self.classifier.phase or "starting", time.time(),
                           f"server exited with code {returncode}{tail}")
        self.emit(self._exit)
        return self._exit

    def abort_reason(self) -> str | None:
        """Why the server can no longer be measured (a failure line or its exit), else None."""
        self.pump(0)
        if self.failure is None and (rc := self.handle.returncode()) is not None:
            self.settle()
            if self.failure is None:
                self.exit_failure(rc)
        return describe(self.failure) if self.failure is not None else None


@dataclass
class Startup:
    """How a start went: the phase timeline and, when it did not get ready, the failure."""

    ok: bool
    phases: dict[str, PhaseSpan]
    failure: Failure | None
    progress: float | None  # loading % reached
    watch: Watch | None = field(repr=False)  # keeps following the server after startup; None once sent elsewhere

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "phases": phases_dict(self.phases),
            "failure": self.failure.to_dict() if self.failure else None,
            "progress": self.progress,
        }


def phases_dict(phases: Mapping[str, PhaseSpan]) -> dict[str, dict[str, float]]:
    """``{phase: {"start", "duration"}}``: the form ``phases.json`` and the study record use."""
    return {name: {"start": span.start, "duration": span.duration} for name, span in phases.items()}


def _timeline(starts: Mapping[str, float], end: float) -> dict[str, PhaseSpan]:
    ordered = sorted(starts.items(), key=lambda kv: kv[1])
    ends = [t for _, t in ordered[1:]] + [end]
    return {name: PhaseSpan(start, max(0.0, stop - start)) for (name, start), stop in zip(ordered, ends, strict=True)}


def start_server(host: Host, profile: LaunchProfile, *, marker: str, log_path: Path,
                 timeouts: Mapping[str, float], on_event: OnEvent | None = None) -> tuple[ServerHandle, Startup]:
    """Start ``profile`` on ``host`` and follow it until it is ready or has failed.

    ``timeouts`` maps phase -> seconds of silence that count as a ``stall`` (the space's
    ``timeouts``); ``timeouts["ready"]`` bounds the wait for ``/health`` after the ready line.
    The handle is returned either way: the caller stops it. If this function itself is
    interrupted, it stops the server before re-raising. A version without a signature file
    is read with every known wording (see :func:`search.logwatch.signature_version`).
    """
    classifier = LogClassifier(signature_version(profile.sglang_version))
    handle = host.start(profile, marker=marker, log_path=log_path)
    watch = Watch(handle, classifier, on_event)
    try:
        failure, end = _wait(watch, f"{handle.url}/health", timeouts)
    except BaseException:
        handle.stop(grace=_STOP_GRACE_S)
        raise
    return handle, Startup(
        ok=failure is None,
        phases=_timeline(classifier.phase_times, end),
        failure=Failure.from_event(failure, classifier.advice) if failure else None,
        progress=classifier.progress,
        watch=watch,
    )


def _wait(watch: Watch, health_url: str, timeouts: Mapping[str, float]) -> tuple[Event | None, float]:
    """Follow the startup; (the failure or None when ready, the time it ended)."""
    classifier, handle = watch.classifier, watch.handle
    health_timeout = timeouts.get("ready", HEALTH_TIMEOUT_S)
    with httpx.Client(timeout=_HEALTH_REQUEST_S) as client:
        while True:
            ready_line = classifier.phase == "ready"
            watch.pump(_HEALTH_TICK_S if ready_line else _TICK_S)
            if classifier.failure is not None:
                watch.settle()
                return classifier.failure, classifier.failure.time
            if (rc := handle.returncode()) is not None:
                watch.settle()
                failure = watch.failure or watch.exit_failure(rc)
                return failure, failure.time
            now = time.time()
            if (stall := classifier.check_stall(now, timeouts)) is not None:
                watch.emit(stall)
                return stall, now
            if ready_line:
                if _healthy(client, health_url):
                    return None, time.time()
                if now - classifier.phase_times["ready"] > health_timeout:
                    line = f"ready line seen but {health_url} did not answer 200 within {health_timeout:g} s"
                    stall = Event("failure", "stall", "ready", now, line)
                    watch.emit(stall)
                    return stall, now


def _healthy(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(url).status_code == 200
    except httpx.HTTPError:
        return False
