"""Every signal that would end a run from outside stops it as Ctrl-C does.

An overnight run usually dies from outside: the terminal closes or the SSH session to the
controller drops (SIGHUP), systemd or a scheduler stops it (SIGTERM), someone sends SIGQUIT or
SIGUSR1. Left to their default action these kill the driver on the spot, and the trial's server,
detached in its own session so that a Ctrl-C meant for the driver does not reach it, lives on
holding the port and every GPU. Raised as KeyboardInterrupt instead, they take the one path
Ctrl-C takes: the running trials are torn down, recorded and re-enqueued.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

# Catchable signals whose default action ends the process (SIGINT already raises KeyboardInterrupt;
# SIGPIPE is ignored by Python; SIGSEGV and the like are the process's own faults, not a request to stop).
STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGHUP", "SIGTERM", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM",
                                       "SIGVTALRM", "SIGPROF", "SIGXCPU", "SIGXFSZ", "SIGPWR")
    if hasattr(signal, name))


_STORAGE_MODULES = ("sqlalchemy", "sqlite3", "optuna.storages", "psycopg")
_REDELIVER_S = 0.05


def _in_storage(frame: FrameType | None) -> bool:
    """Whether the main thread is inside a storage call (Optuna's RDB storage, SQLAlchemy, the
    driver). A KeyboardInterrupt raised there can break the session mid-commit, and the teardown's
    own writes then fail with StorageInternalError; so the signal is delivered again a moment later,
    once the call has returned."""
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith(_STORAGE_MODULES):
            return True
        frame = frame.f_back
    return False


def _detach_terminal() -> None:
    """After a hang-up the terminal is gone and writing to it fails (EIO): send that output nowhere,
    so that the teardown's messages cannot interrupt the teardown."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            if os.isatty(fd):
                os.dup2(devnull, fd)
    finally:
        os.close(devnull)


@contextmanager
def stop_signals_as_interrupt() -> Iterator[None]:
    """Within the block, the first of `STOP_SIGNALS` raises KeyboardInterrupt; later ones are ignored,
    so that a second signal (a hang-up after SIGTERM) cannot cut the teardown short. Outside the
    main thread, where Python cannot set handlers, signals are left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopping = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if signum == getattr(signal, "SIGHUP", None):
            _detach_terminal()
        if stopping:
            return
        if _in_storage(frame):  # raised inside a commit, it leaves the storage unusable for the teardown
            threading.Timer(_REDELIVER_S, os.kill, (os.getpid(), signum)).start()
            return
        stopping = True
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
