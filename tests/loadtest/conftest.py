"""Fixtures: the emulator as a real subprocess (see server.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .server import Server, start_emulator


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One emulator shared by a module's tests that do not stop it."""
    with start_emulator(tmp_path_factory.mktemp("emulator-state")) as server:
        yield server


@pytest.fixture
def own_emulator(tmp_path: Path) -> Iterator[Server]:
    """An emulator this test may kill."""
    with start_emulator(tmp_path) as server:
        yield server
