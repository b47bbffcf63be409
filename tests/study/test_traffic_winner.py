"""The traffic decides the winner: one space, two workloads, two different best configs.

The landscape makes SGLang's radix cache cost a third of decode speed (a made-up price, so that
dropping it pays where it buys nothing) and prefill slow (4,000 tok/s). On short random prompts
nothing is ever cached, so `--disable-radix-cache` wins; on a shared-prefix workload (800-token system prompts)
the cache skips almost all prefill, and keeping it wins by far.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from search.cli import app
from search.hosts.emulated import EmulatedHost
from search.ranking import Ranking
from search.space import load_space
from search.storage import views
from search.strategy import discover
from search.study import StudyRun
from tests.helpers import write_space

LANDSCAPE = """
def startup(flags, env):
    return None

def throughput(flags, env, running):
    return 200.0 * running * (1.5 if flags["disable_radix_cache"] else 1.0)

def prefill(flags, env):
    return {"tokens_per_s": 4000.0, "batch_overhead_s": 0.0}

def phase_seconds(flags, env):
    return {"starting": 1, "loading": 10, "kv_cache": 1, "autotune": 0, "cuda_graph": 1, "warmup": 1}
"""

PARAMS = {"--disable-radix-cache": {"type": "bool"}}
LOAD = {"input_len": 8, "output_len": 16, "concurrency": [8], "duration_s": 0.8, "warmup_s": 0.1}


def _winner(root: Path, **sections: object) -> bool:
    space = load_space(write_space(root, landscape=LANDSCAPE, params=PARAMS,
                                   baseline={"--disable-radix-cache": False}, load_test=LOAD, targets={},
                                   **sections))
    study = StudyRun(space=space, name="w", host=EmulatedHost(), storage=f"sqlite:///{root / 'studies.db'}",
                     seed=0, n_trials=2, remeasure=0, trials_dir=root / "trials").run()
    ranked = Ranking(discover(space)).ranked(views(study))
    assert len({t.params["--disable-radix-cache"] for t in views(study)}) == 2  # both were measured
    exported = CliRunner().invoke(app, ["study", "export", "w", "--format", "json", "-o", str(root / "w.json"),
                                        "--storage", f"sqlite:///{root / 'studies.db'}"])
    assert exported.exit_code == 0 and f"trial {ranked[0].number}: " in exported.output
    assert "tok/s, output throughput (tok/s)" in exported.output  # the export names the objective and unit
    return bool(ranked[0].params["--disable-radix-cache"])


def test_shared_prefix_traffic_keeps_the_radix_cache_random_prompts_drop_it(tmp_path: Path) -> None:
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        (tmp_path / "random").mkdir()
        (tmp_path / "shared").mkdir()
        assert _winner(tmp_path / "random") is True
        shared = {"kind": "shared_prefix", "groups": 2, "prompts_per_group": 16, "system_prompt_len": 800,
                  "question_len": 8}
        assert _winner(tmp_path / "shared", workload=shared) is False
    finally:
        os.chdir(old)


@pytest.fixture(autouse=True)
def _no_stray_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEARCH_EMULATOR_STATE_DIR", raising=False)
