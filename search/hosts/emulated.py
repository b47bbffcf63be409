"""This machine running the SGLang emulator (`search.emulator`) instead of SGLang: ``--emulate``.

The profile's SGLang flags go to ``python -m search.emulator``; GPUs are the emulator's (a
``flock`` per GPU under its state directory, read by its ``nvidia-smi`` stand-in). Everything
else (sessions, markers, teardown, the port check) is `search.hosts.local.LocalHost`'s, so an
emulated study exercises the same host code a real one does. This is the only tuner module
that imports the emulator.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from search.emulator import gpu_state
from search.emulator.config import Settings
from search.hosts.local import LocalHost, describe_pid

if TYPE_CHECKING:
    from search.profile import LaunchProfile

LAUNCHER = (sys.executable, "-m", "search.emulator")
NVIDIA_SMI = (sys.executable, "-m", "search.emulator.nvidia_smi")


class EmulatedHost(LocalHost):
    """Runs each profile's flags on the emulator, on this machine."""

    def argv(self, profile: LaunchProfile) -> list[str]:
        return [*LAUNCHER, *profile.args]

    def nvidia_smi(self) -> tuple[str, ...]:
        return NVIDIA_SMI

    def gpu_holders(self, profile: LaunchProfile, gpus: list[int]) -> list[str]:
        """The emulated GPUs whose lock another server's rank holds (the profile's state directory wins)."""
        state = Settings.from_env({**os.environ, **profile.env}).state_dir
        return [f"GPU {i} by {describe_pid(gpu_state.read(state, i).pid or None)}" for i in gpus
                if gpu_state.is_held(state, i)]
