"""A daemon thread that lives for the length of a ``with`` block.

The load test must not wait on slow probes (an SSH round trip, an ``nvidia-smi`` call), so GPU
telemetry and the server health check each run beside it on their own thread.
"""

from __future__ import annotations

import threading
from typing import Self


class Background:
    """Runs ``_run`` on a daemon thread from ``__enter__``; ``__exit__`` sets ``_stop`` and joins it."""

    def __init__(self, name: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        raise NotImplementedError
