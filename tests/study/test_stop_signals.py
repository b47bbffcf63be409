"""A stop signal that lands inside a storage call is raised once the call has returned: a
KeyboardInterrupt in the middle of a commit left the storage unusable for the teardown's writes
(a hang-up then ended the driver with StorageInternalError, exit 1, instead of 130). One that lands
in a finalizer, where Python drops what is raised, is raised again once the finalizer has returned."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from search.stop_signals import stop_signals_as_interrupt


@contextmanager
def ctrl_c_interrupts() -> Iterator[None]:
    """Ctrl-C raising KeyboardInterrupt, as in a terminal: a suite started in the background by a
    non-interactive shell inherits SIGINT ignored, and a run leaves an ignored SIGINT ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)

# Code that runs as if it were SQLAlchemy's: the signal arrives while it works.
_COMMIT = """
def commit(signum):
    os.kill(os.getpid(), signum)
    until = time.monotonic() + 0.3
    while time.monotonic() < until:  # a commit in progress: the interrupt must not land here
        pass
    return "committed"
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGUSR1], ids=["ctrl-c", "stop-signal"])
def test_a_stop_signal_inside_a_storage_call_waits_for_it_to_return(signum: int) -> None:
    scope: dict[str, Any] = {"__name__": "sqlalchemy.engine.fake", "os": os, "time": time}
    exec(compile(_COMMIT, "<sqlalchemy>", "exec"), scope)  # noqa: S102 - a frame of another module, on purpose
    done: list[str] = []
    with pytest.raises(KeyboardInterrupt), ctrl_c_interrupts(), stop_signals_as_interrupt():
        done.append(scope["commit"](signum))
        time.sleep(5)  # the re-delivered signal ends this wait
    assert done == ["committed"]


def test_a_stop_signal_elsewhere_interrupts_at_once() -> None:
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt), stop_signals_as_interrupt():
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(5)
    assert time.monotonic() - started < 4


class _Finalized:
    """Its finalizer is where the signal arrives, as Ctrl-C once arrived in an import's module-lock
    weakref callback: Python prints a KeyboardInterrupt raised there and drops it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.finished = False

    def __del__(self) -> None:
        os.kill(os.getpid(), self.signum)
        until = time.monotonic() + 0.3
        while time.monotonic() < until:  # the handler runs here, inside the finalizer
            pass
        self.finished = True


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGUSR1], ids=["ctrl-c", "stop-signal"])
def test_a_stop_dropped_by_a_finalizer_is_raised_when_it_returns(signum: int,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt), ctrl_c_interrupts(), stop_signals_as_interrupt():
        doomed = _Finalized(signum)
        del doomed
        time.sleep(5)  # the stop delivered again ends this wait
    assert time.monotonic() - started < 4
    assert "Traceback" not in capsys.readouterr().err  # handled, not printed as ignored


def test_an_ignored_ctrl_c_stays_ignored() -> None:
    """A run started in the background by a script inherits SIGINT ignored: a Ctrl-C meant for the
    script's foreground job does not stop it."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with stop_signals_as_interrupt():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
