"""Trials side by side on one emulated host's GPUs: each test runs in its own directory and emulator state."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SEARCH_EMULATOR_STATE_DIR", str(tmp_path / "state"))
    return tmp_path
