"""Several trials at once on the GPUs of one or more hosts, from this process: the slot runner.

Each host of the pool is a `search.slots.GpuPool`. A job is placed on the first available host
(in turn, as `search.runner.InProcessRunner` does) that has as many free GPUs as its layout needs,
and runs `search.runner.run_job` in a thread of its own through a `search.slots.SlotHost`: its own
``CUDA_VISIBLE_DEVICES``, port, marker and log. The driver's hooks are called on the driver's
thread only: a trial's thread queues its events and levels, and a level waits for the verdict the
driver's ``wait`` hands back, so the pruner stops a trial here exactly as on one host or on Ray.

A job that no host has the GPUs for right now waits (``free()`` is 0 meanwhile, so the driver
asks for nothing more); a job no host could ever hold ends at once as a crash of its config (the
space check says so before the night). Ctrl-C kills every running trial's server by marker.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from search.errors import BadInput
from search.hosts.base import Host
from search.lifecycle import Failure
from search.loadtest import LevelResult
from search.runner import Hooks, InProcessRunner, Job, Runner, run_job
from search.slots import GpuPool, SlotHost, job_gpus, too_big
from search.storage import Outcome
from search.trial import TrialResult

JOIN_TIMEOUT_S = 30.0  # how long Ctrl-C waits for a killed trial's thread to tear its server down


@dataclass
class _Verdict:
    """A level's answer from the driver's thread to the trial's."""

    ready: threading.Event = field(default_factory=threading.Event)
    keep: bool = True


@dataclass
class _Slot:
    job: Job
    hooks: Hooks
    host: Host
    gpus: list[int]
    view: Host  # the host as the trial sees it (a SlotHost when the host offers a list)
    thread: threading.Thread | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)


# (slot, kind, payload, verdict): kind "event" | "level" | "done" | "error"
_Message = tuple[_Slot, str, Any, "_Verdict | None"]


class SlotRunner:
    """Runs as many jobs at once as the pool's free GPUs hold (a ``search.runner.Runner``)."""

    def __init__(self, pool: Sequence[Host], hosts: Mapping[str, Host] | None = None) -> None:
        if not pool:
            raise BadInput("no host to run trials on; list at least one in the hosts file")
        self.pool = list(pool)
        self.hosts = dict(hosts or {host.name: host for host in self.pool})
        self._gpus = {host.name: GpuPool(host.gpus) for host in self.pool}
        self._turn = 0
        self._need = 1  # GPUs the last job took: what free() counts in
        self._waiting: list[tuple[Job, Hooks, int]] = []
        self._slots: dict[str, _Slot] = {}  # by marker
        self._inbox: queue.SimpleQueue[_Message] = queue.SimpleQueue()
        self._done: list[tuple[Job, TrialResult]] = []

    # -- Runner --------------------------------------------------------------------------------
    def free(self) -> int:
        if self._waiting:
            return 0
        return sum(self._gpus[h.name].fits(self._need) for h in self.pool if h.available)

    def settling(self) -> bool:
        return False

    def start(self, job: Job, hooks: Hooks) -> None:
        need = self._need_of(job)
        self._need = need
        if not any(self._gpus[h.name].could_hold(need) for h in self.pool if h.available):
            largest = max((len(h.gpus) for h in self.pool if h.gpus is not None), default=0)
            self._done.append((job, too_big(job.marker, job.trial_dir, need, largest)))
            return
        self._waiting.append((job, hooks, need))
        self._place()

    def wait(self, timeout: float) -> list[tuple[Job, TrialResult]]:
        self._place()
        if not self._done and not self._slots:
            return []
        try:
            message = self._inbox.get(timeout=timeout) if not self._done else self._inbox.get_nowait()
            self._handle(message)
            while True:
                self._handle(self._inbox.get_nowait())
        except queue.Empty:
            pass
        self._place()
        done, self._done = self._done, []
        return done

    def cancel(self) -> None:
        """Kill every running trial's server by marker, let its thread tear down, give its GPUs back."""
        self._waiting.clear()
        slots = list(self._slots.values())
        for slot in slots:
            slot.cancelled.set()
            if isinstance(slot.view, SlotHost):
                slot.view.cancelled.set()
            try:
                slot.host.kill_marker(slot.job.marker)
            except Exception:  # the thread's own teardown still runs; a lost host is its fault to report
                pass
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for slot in slots:
            while slot.thread is not None and slot.thread.is_alive() and time.monotonic() < deadline:
                try:  # levels still on their way get "stop"; the rest of the messages are dropped
                    self._answer(self._inbox.get(timeout=0.1), keep=False)
                except queue.Empty:
                    pass
        for slot in slots:
            self._release(slot)
        self._slots.clear()
        self._done.clear()

    def kill_marker(self, marker: str, host: str) -> int:
        return self.hosts.get(host, self.pool[0]).kill_marker(marker)

    def close(self) -> None:
        self.cancel()

    # -- internals -------------------------------------------------------------------------------
    def _need_of(self, job: Job) -> int:
        """GPUs the job's layout takes."""
        return job_gpus(job.space, job.config)

    def _place(self) -> None:
        """Start waiting jobs, in order, on hosts with enough free GPUs; a job that fits nowhere yet keeps its turn.

        A waiting job that no available host could hold any more (its hosts were lost) ends as an
        infrastructure fault, re-enqueued by the driver, which stops the study when no host is left.
        """
        for job, hooks, need in list(self._waiting):
            if not any(self._gpus[h.name].could_hold(need) for h in self.pool if h.available):
                self._waiting.remove((job, hooks, need))
                message = f"no available host can hold its {need} GPU(s) any more (hosts lost); not the config's fault"
                self._done.append((job, TrialResult(outcome=Outcome.INFRASTRUCTURE, artifacts=job.trial_dir,
                                                    marker=job.marker,
                                                    failure=Failure("infrastructure", "starting", "", True, message))))
        while self._waiting:
            job, hooks, need = self._waiting[0]
            placed = self._placement(need)
            if placed is None:
                return
            self._waiting.pop(0)
            host, gpus = placed
            offset = self._gpus[host.name].port_offset(gpus)
            view: Host = SlotHost(host, gpus, offset) if host.gpus is not None else host
            slot = self._slots[job.marker] = _Slot(job, hooks, host, gpus, view)
            hooks.placed(host.name)
            slot.thread = threading.Thread(target=self._run, args=(slot,), name=f"trial {job.marker}", daemon=True)
            slot.thread.start()

    def _placement(self, need: int) -> tuple[Host, list[int]] | None:
        for step in range(len(self.pool)):
            host = self.pool[(self._turn + step) % len(self.pool)]
            if not host.available:
                continue
            gpus = self._gpus[host.name].take(need)
            if gpus is not None:
                self._turn = (self.pool.index(host) + 1) % len(self.pool)
                return host, gpus
        return None

    def _run(self, slot: _Slot) -> None:
        """The trial's thread: run the job; hand events, levels and the result to the driver's thread."""
        def level(result: LevelResult) -> bool:
            verdict = _Verdict()
            self._inbox.put((slot, "level", result, verdict))
            while not verdict.ready.wait(0.2):
                if slot.cancelled.is_set():
                    return False
            return verdict.keep

        try:
            result = run_job(slot.job, slot.view, on_event=lambda event: self._inbox.put((slot, "event", event, None)),
                             on_level=level)
        except BaseException as exc:  # a bug in the trial: raised on the driver's thread, as on one host
            self._inbox.put((slot, "error", exc, None))
            return
        self._inbox.put((slot, "done", result, None))

    def _handle(self, message: _Message) -> None:
        slot, kind, payload, verdict = message
        if slot.job.marker not in self._slots:
            self._answer(message, keep=False)
            return
        if kind == "event":
            slot.hooks.event(payload)
        elif kind == "level":
            assert verdict is not None
            verdict.keep = slot.hooks.level(payload)
            verdict.ready.set()
        else:
            assert slot.thread is not None
            slot.thread.join()
            self._release(slot)
            del self._slots[slot.job.marker]
            if kind == "error":
                raise payload
            self._done.append((slot.job, payload))

    @staticmethod
    def _answer(message: _Message, *, keep: bool) -> None:
        """Answer a level nobody will judge (its trial was cancelled)."""
        verdict = message[3]
        if verdict is not None:
            verdict.keep = keep
            verdict.ready.set()

    def _release(self, slot: _Slot) -> None:
        if slot.thread is None or not slot.thread.is_alive():
            self._gpus[slot.host.name].give(slot.gpus)



def pool_runner(pool: Sequence[Host], hosts: Mapping[str, Host] | None = None) -> Runner:
    """The runner for ``pool``: side by side where a host offers a ``gpus`` list, else one trial at a time."""
    if any(host.gpus is not None for host in pool):
        return SlotRunner(pool, hosts)
    return InProcessRunner(pool, hosts)
