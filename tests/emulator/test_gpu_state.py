"""GPU ownership as the emulator's ranks, its nvidia-smi and a starting server's check see it:
a probe is never mistaken for an owner, and a rank's claim is not lost to a probe."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from search.emulator import gpu_state


def _probe_lock(state_dir: Path, gpu: int) -> int:
    """A probe caught in the middle: the shared lock ``is_held`` takes for a moment."""
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(gpu_state.lock_path(state_dir, gpu), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    return fd


def test_a_probe_in_progress_is_not_an_owner_to_another_probe(tmp_path: Path) -> None:
    fd = _probe_lock(tmp_path, 0)
    try:
        assert not gpu_state.is_held(tmp_path, 0)
        assert gpu_state.occupant(tmp_path, 0) is None  # a starting server does not see a phantom at 95%
    finally:
        os.close(fd)


def test_a_claim_that_meets_a_probe_still_gets_the_gpu(tmp_path: Path) -> None:
    fd = _probe_lock(tmp_path, 1)
    threading.Timer(0.02, os.close, (fd,)).start()  # the probe ends while the rank is claiming
    owner = gpu_state.try_lock(tmp_path, 1)
    assert owner is not None
    try:
        assert gpu_state.is_held(tmp_path, 1)
        assert gpu_state.try_lock(tmp_path, 1) is None  # a second server cannot take it
    finally:
        os.close(owner)
    assert not gpu_state.is_held(tmp_path, 1)
