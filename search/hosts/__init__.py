"""Where servers run: the :class:`Host` / :class:`ServerHandle` protocols and the local host."""

from search.hosts.base import MARKER_ENV, GpuSample, Host, ServerHandle
from search.hosts.local import LocalHost

__all__ = ["MARKER_ENV", "GpuSample", "Host", "LocalHost", "ServerHandle"]
