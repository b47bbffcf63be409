"""Where servers run: the :class:`Host` / :class:`ServerHandle` protocols, this machine, the emulator on it."""

from search.hosts.base import MARKER_ENV, GpuSample, Host, ServerHandle
from search.hosts.local import LocalHost

__all__ = ["MARKER_ENV", "GpuSample", "Host", "LocalHost", "ServerHandle", "local_host"]


def local_host(*, emulate: bool = False, name: str = "local", gpus: list[int] | None = None) -> LocalHost:
    """This machine: SGLang as the profile launches it, or with ``emulate`` the SGLang emulator; ``gpus``:
    the GPUs it offers trials side by side (None: one trial at a time)."""
    if emulate:
        from search.hosts.emulated import EmulatedHost  # the emulator is loaded only when it runs

        return EmulatedHost(name=name, gpus=gpus)
    return LocalHost(name=name, gpus=gpus)
