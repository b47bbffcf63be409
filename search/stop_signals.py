"""Every signal that would end a run from outside stops it as Ctrl-C does.

An overnight run usually dies from outside: the terminal closes or the SSH session to the
controller drops (SIGHUP), systemd or a scheduler stops it (SIGTERM), someone sends SIGQUIT or
SIGUSR1. Left to their default action these kill the driver on the spot, and the trial's server,
detached in its own session so that a Ctrl-C meant for the driver does not reach it, lives on
holding the port and every GPU. Raised as KeyboardInterrupt instead, they take the one path
Ctrl-C takes: the running trials are torn down, recorded and re-enqueued.

Ctrl-C itself goes through the same handler, so that it too waits for a storage call to return
and a second one cannot cut the teardown short.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

# Catchable signals whose default action ends the process (SIGINT, Ctrl-C, raises KeyboardInterrupt
# unless ignored: see `_handled`; SIGPIPE is ignored by Python; SIGSEGV and the like are the
# process's own faults, not a request to stop).
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


def _resend(signum: int) -> None:
    """Deliver ``signum`` again ``_REDELIVER_S`` from now, from another thread: once the code it
    landed in (a commit, a finalizer) has returned."""
    threading.Timer(_REDELIVER_S, os.kill, (os.getpid(), signum)).start()


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


def _handled() -> tuple[signal.Signals, ...]:
    """`STOP_SIGNALS`, and Ctrl-C where it raises KeyboardInterrupt: a run started in the background
    by a non-interactive shell (``search study run ... &`` in a script) inherits SIGINT ignored, and
    a Ctrl-C meant for that shell's foreground job must not stop it."""
    ctrl_c = (signal.SIGINT,) if signal.getsignal(signal.SIGINT) is signal.default_int_handler else ()
    return ctrl_c + STOP_SIGNALS


@contextmanager
def stop_signals_as_interrupt() -> Iterator[None]:
    """Within the block, the first stop signal (Ctrl-C or one of `STOP_SIGNALS`) raises
    KeyboardInterrupt; later ones are ignored, so that a second signal (a hang-up after SIGTERM,
    Ctrl-C pressed twice) cannot cut the teardown short. A stop that Python drops is delivered
    again (`_SwallowedStop`). Outside the main thread, where Python cannot set handlers, signals
    are left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stop = _SwallowedStop(sys.unraisablehook)

    def handler(signum: int, frame: FrameType | None) -> None:
        if signum == getattr(signal, "SIGHUP", None):
            _detach_terminal()
        if stop.stopping:
            return
        if _in_storage(frame):  # raised inside a commit, it leaves the storage unusable for the teardown
            _resend(signum)
            return
        stop.raised(signal.Signals(signum))
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in _handled()}
    sys.unraisablehook = stop
    try:
        yield
    finally:
        sys.unraisablehook = stop.previous
        for sig, old in previous.items():
            signal.signal(sig, old)


class _SwallowedStop:
    """The ``sys.unraisablehook`` of a run: a KeyboardInterrupt raised inside a finalizer or a weakref
    callback is printed and dropped by Python ("Exception ignored in ..."), and the stop with it. Ctrl-C
    landing in the module-lock callback of an import that way let a study run on to its end and exit 0.
    So the signal that raised it is sent again, a moment later, once that callback has returned."""

    def __init__(self, previous: Callable[[sys.UnraisableHookArgs], object]) -> None:
        self.previous = previous
        self.stopping = False  # a stop signal has raised; later ones are ignored
        self._signal = signal.SIGINT  # what raised the last KeyboardInterrupt: SIGINT unless a stop signal did

    def raised(self, signum: signal.Signals) -> None:
        self.stopping, self._signal = True, signum

    def __call__(self, unraisable: sys.UnraisableHookArgs) -> None:
        if unraisable.exc_type is None or not issubclass(unraisable.exc_type, KeyboardInterrupt):
            self.previous(unraisable)
            return
        signum, self._signal, self.stopping = self._signal, signal.SIGINT, False
        _resend(signum)  # sent from this hook, the handler would run before it returns, and be dropped again
