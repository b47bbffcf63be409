"""What every host offers the lifecycle: start a profile, follow its log, stop it, check it is clean.

A host is where servers run (this machine, an SSH target); a handle is one running server.
The local and SSH hosts implement the same two protocols so that the lifecycle, the trial and
the study never know which one they drive. The trial marker (the environment variable
:data:`MARKER_ENV`) is the only way anything is ever killed: never a process name or pattern.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from search.layout import gpus_needed

if TYPE_CHECKING:
    from search.profile import LaunchProfile

MARKER_ENV = "SEARCH_TRIAL_MARKER"


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one moment, as ``nvidia-smi`` (or the emulator's stand-in) reports it."""

    index: int
    memory_used_mib: float
    memory_total_mib: float
    power_w: float | None
    power_limit_w: float | None
    utilization_pct: float | None


@runtime_checkable
class ServerHandle(Protocol):
    """One server started by a host."""

    marker: str
    url: str
    log_path: Path  # local copy of the server log, kept growing

    def new_lines(self, timeout: float) -> list[str]:
        """Complete log lines written since the last call; waits at most ``timeout`` for the first.

        A line ends at ``\n``, ``\r\n`` or a lone ``\r`` (a tqdm redraw; see
        :func:`search.logwatch.split_pieces`), so a progress bar counts as output while it runs.
        """
        ...

    def returncode(self) -> int | None:
        """The server process's exit status, None while it runs."""
        ...

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM to the group and to what carries the marker outside it, ``grace`` seconds, SIGKILL to both."""
        ...


@runtime_checkable
class Host(Protocol):
    """A machine that runs launch profiles."""

    name: str

    @property
    def gpus(self) -> list[int] | None:
        """The GPUs this host offers trials (``hosts.yaml`` ``gpus``, ``--gpus``); None: each trial takes the
        whole host, one at a time. With a list, the runner places trials side by side on free GPUs of it."""
        ...

    @property
    def available(self) -> bool:
        """False once the host is lost (an SSH host whose reconnects failed): runners skip it."""
        ...

    def adapt(self, profile: LaunchProfile) -> LaunchProfile:
        """``profile`` as this host runs it (an SSH host's ``server_port``): what the trial starts and records."""
        ...

    def start(self, profile: LaunchProfile, *, marker: str, log_path: Path) -> ServerHandle:
        """Launch ``profile`` with ``marker`` in its environment, its output going to ``log_path``."""
        ...

    def ensure_clean(self, profile: LaunchProfile, *, timeout: float) -> None:
        """Wait up to ``timeout`` for the profile's port and GPUs; raise InfrastructureFault naming the holders."""
        ...

    def kill_marker(self, marker: str) -> int:
        """Kill every process carrying ``marker``; return how many there were."""
        ...

    def trial_gpus(self, profile: LaunchProfile) -> list[int]:
        """The GPUs ``profile`` uses on this host (its CUDA_VISIBLE_DEVICES, else the first its layout takes)."""
        ...

    def gpu_samples(self, env: Mapping[str, str] | None = None) -> list[GpuSample] | None:
        """The host's GPUs now, read with a trial's environment ``env`` on top; None where no ``nvidia-smi`` is."""
        ...


def server_gpus(args: list[str], env: Mapping[str, str]) -> list[int]:
    """The GPUs a server uses: ``CUDA_VISIBLE_DEVICES``, else the first its layout takes (as SGLang and the emulator)."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [int(part) for part in visible.split(",") if part.strip().isdigit()]
    return list(range(gpus_needed(args)))
