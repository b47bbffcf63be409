"""The strategy's settings: one frozen object, validated, varied by the benchmark's ``--settings``."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from search.errors import BadInput
from search.settings import DEFAULT, Settings

ROOT = Path(__file__).resolve().parents[2]


def test_varied_applies_typed_pairs_and_leaves_the_default_alone() -> None:
    varied = DEFAULT.varied(["max_skips=3", "noise_margin=0.06", "screen=false", "plan_off=revisit,model"])
    assert (varied.max_skips, varied.noise_margin, varied.screen) == (3, 0.06, False)
    assert varied.plan_off == ("revisit", "model") and DEFAULT.plan_off == ()
    assert DEFAULT == Settings() and DEFAULT.max_skips == 30
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT.max_skips = 3  # type: ignore[misc]


@pytest.mark.parametrize("pairs, message", [
    (["nosuch=1"], "give KEY=VALUE with KEY one of prune_ratio"),
    (["max_skips"], "give KEY=VALUE"),
    (["max_skips=many"], "'many' is not a int"),
    (["noise_margin=1.5"], "setting noise_margin: 1.5 is not a fraction in (0, 1]"),
    (["model_candidates=0"], "setting model_candidates: 0 is not a whole number of at least 1"),
    (["screen=maybe"], "'maybe' is not a bool"),
    (["plan_off=revisit,nosuch"], "setting plan_off: nosuch is not a source of the plan (one of crash_fix, repairs"),
])
def test_bad_settings_are_refused_naming_the_key(pairs: list[str], message: str) -> None:
    with pytest.raises(BadInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        DEFAULT.varied(pairs)


def test_the_benchmark_refuses_a_bad_setting_before_running_anything() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_search.py"), "--space",
                           str(ROOT / "scripts" / "landscapes" / "space.yaml"), "--landscape",
                           str(ROOT / "scripts" / "landscapes" / "backend_crash.py"), "--settings", "prune_ratio=2"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == "error: setting prune_ratio: 2.0 is not a fraction in (0, 1]"
