"""GPU slots: a host's GPUs shared out among trials that run side by side.

A space served at ``--tp-size 2`` on an 8-GPU host leaves six GPUs idle if the host runs one trial
at a time. A host that offers a ``gpus`` list (``hosts.yaml``, ``--gpus``, a Ray node's
``SEARCH_HOST_GPUS``) is instead a :class:`GpuPool`: each trial takes as many free GPUs as its
layout needs (`search.layout`) and gives them back when it ends. The trial runs through a
:class:`SlotHost`, the host seen through one placement: the profile gets the placement's
``CUDA_VISIBLE_DEVICES`` and its own port, so the host's usual checks (port and GPUs free before
start, released after stop) and its marker-based teardown apply per trial, unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from search.errors import InfrastructureFault
from search.hosts.base import GpuSample, Host, ServerHandle
from search.layout import gpus_needed
from search.lifecycle import Failure
from search.profile import render
from search.space import Space
from search.storage import Outcome
from search.trial import TrialResult

if TYPE_CHECKING:
    from search.profile import LaunchProfile


class GpuPool:
    """One host's GPUs as trials take and return them; a host without a list is one slot for the whole host."""

    def __init__(self, gpus: list[int] | None) -> None:
        self.offered = None if gpus is None else list(gpus)
        self._free = list(self.offered or [])
        self._whole_busy = False

    def could_hold(self, need: int) -> bool:
        """Whether a trial needing ``need`` GPUs fits here at all (once everything else has ended)."""
        return self.offered is None or need <= len(self.offered)

    def fits(self, need: int) -> int:
        """How many trials of ``need`` GPUs could start here now."""
        if self.offered is None:
            return 0 if self._whole_busy else 1
        return len(self._free) // max(1, need)

    def take(self, need: int) -> list[int] | None:
        """``need`` free GPUs (the lowest first, so trials pack), or None when they are not free now.

        A whole-host pool gives ``[]``: the trial uses what its own profile asks for.
        """
        if self.offered is None:
            if self._whole_busy:
                return None
            self._whole_busy = True
            return []
        if need > len(self._free):
            return None
        self._free.sort(key=self.offered.index)
        taken, self._free = self._free[:need], self._free[need:]
        return taken

    def give(self, gpus: list[int]) -> None:
        """Return what :meth:`take` gave."""
        if self.offered is None:
            self._whole_busy = False
        else:
            self._free.extend(g for g in gpus if g not in self._free)

    def port_offset(self, gpus: list[int]) -> int:
        """The placement's port offset from the host's: its first GPU's position in the list (disjoint
        placements never share one)."""
        return self.offered.index(gpus[0]) if self.offered and gpus else 0


def job_gpus(space: Space, config: Mapping[str, Any]) -> int:
    """GPUs a trial of ``config`` takes: its rendered layout (`search.layout`)."""
    return gpus_needed(render(space, dict(config)).args)


def too_big(marker: str, trial_dir: Path, need: int, largest: int) -> TrialResult:
    """The result of a trial no host can hold: the config's fault (its layout), never retried, nothing started."""
    message = (f"this layout takes {need} GPUs; the largest host offers {largest}: not runnable here "
               "(`search space check --gpu-count N` finds such layouts before the night)")
    return TrialResult(outcome=Outcome.CRASHED, artifacts=trial_dir, marker=marker,
                       failure=Failure("unsupported", "starting", "", False, message))


class SlotHost:
    """``host`` seen through one placement: ``gpus`` and a port of its own; everything else is the host's.

    ``cancelled`` (set by the runner on Ctrl-C) refuses a start that had not begun yet, so a trial
    torn down between its checks and its launch cannot leave a server behind.
    """

    def __init__(self, host: Host, gpus: list[int], port_offset: int) -> None:
        self.inner = host
        self.name = host.name
        self.placed = list(gpus)
        self.port_offset = port_offset
        self.cancelled = threading.Event()

    @property
    def gpus(self) -> list[int] | None:
        return self.placed

    @property
    def available(self) -> bool:
        return self.inner.available

    def adapt(self, profile: LaunchProfile) -> LaunchProfile:
        adapted = self.inner.adapt(profile)
        return adapted.on_port(adapted.port + self.port_offset).on_gpus(self.placed)

    def start(self, profile: LaunchProfile, *, marker: str, log_path: Path) -> ServerHandle:
        if self.cancelled.is_set():
            raise InfrastructureFault(f"host {self.name}: the study stopped before this trial's server started")
        return self.inner.start(profile, marker=marker, log_path=log_path)

    def ensure_clean(self, profile: LaunchProfile, *, timeout: float) -> None:
        self.inner.ensure_clean(profile, timeout=timeout)

    def kill_marker(self, marker: str) -> int:
        return self.inner.kill_marker(marker)

    def trial_gpus(self, profile: LaunchProfile) -> list[int]:
        return self.inner.trial_gpus(profile)

    def gpu_samples(self, env: Mapping[str, str] | None = None) -> list[GpuSample] | None:
        return self.inner.gpu_samples(env)
