"""The study lock of a storage that is no SQLite file lives in this user's cache, which a fresh machine lacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from search.lock import StudyLock


def test_a_fresh_machine_s_cache_folder_is_made_for_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "no-cache-yet"))
    with StudyLock("sqlite:///:memory:", "s") as lock:
        assert lock.path.is_file() and lock.path.is_relative_to(tmp_path / "no-cache-yet")
