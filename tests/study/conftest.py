"""Whole studies on the real emulator: a tiny space and landscape (tests.helpers) where every outcome shows.

Landscape: the request cap (1 vs SGLang's automatic) decides throughput, ``triton`` crashes at
autotune, ``cutlass`` runs at 30% (below the target at the first level). From the baseline
(cap 1, flashinfer_cutlass) the strategy's sweep tries the cap first (a clear win), then the
backends: four trials show a win, a crash at its phase and a prune after the first level.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """cwd = tmp_path (studies.db, trials/, profiles/ land here); the emulator state is private."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SEARCH_EMULATOR_STATE_DIR", str(tmp_path / "state"))
    return tmp_path
