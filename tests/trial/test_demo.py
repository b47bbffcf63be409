"""The demo as a newcomer runs it: a real SGLang space played on the emulator, whose exported
winner starts real SGLang, measured in the seed's regime (no request ends inside a level)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from search.emulator.landscape import Landscape
from search.manifests import load
from tests.helpers import free_port

DEMO = Path(__file__).resolve().parents[2] / "spaces" / "demo.yaml"


def _search(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["search", *args], capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={**os.environ, "SEARCH_EMULATOR_TIME_SCALE": "0.002",
                               "SEARCH_EMULATOR_STATE_DIR": str(cwd / "state")})


def _demo_space(root: Path, targets: str = "256: 400") -> None:
    text = DEMO.read_text().replace("port: 30000", f"port: {free_port()}")
    (root / "demo.yaml").write_text(text.replace("  256: 400", f"  {targets}"))


@pytest.fixture(scope="module")
def demo_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo space's baseline, run as `scripts/demo.sh` runs a study, and its export."""
    root = tmp_path_factory.mktemp("demo")
    _demo_space(root)
    done = _search(root, "study", "run", "demo.yaml", "--study", "demo", "--n-trials", "1", "--remeasure", "0",
                   "--emulate")
    assert done.returncode == 0, done.stderr
    done = _search(root, "study", "export", "demo", "--format", "shell", "-o", "best.sh")
    assert done.returncode == 0, done.stderr
    return root


def _exported_argv(root: Path) -> list[str]:
    line = next(line for line in (root / "best.sh").read_text().splitlines() if line.startswith("exec "))
    command = (root / "best.sh").read_text().split(line, 1)[1]
    words = shlex.split(line.removeprefix("exec ").removesuffix("\\") + " " + command.replace("\\\n", " "))
    return words[words.index("-m") - 1:]


def test_the_export_starts_real_sglang_not_the_emulator(demo_study: Path) -> None:
    text = (demo_study / "best.sh").read_text()
    assert "SEARCH_EMULATOR" not in text and "search.emulator" not in text
    assert _exported_argv(demo_study)[:3] == ["python3", "-m", "sglang.launch_server"]


@pytest.mark.sglang
def test_the_real_0_5_23_parser_accepts_the_exported_command(demo_study: Path) -> None:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    values = parser.parse_args(_exported_argv(demo_study)[3:])
    assert (values.model_path, values.tp_size, values.quantization) == ("lukealonso/GLM-5-NVFP4", 8, "modelopt_fp4")
    assert values.max_running_requests == 64 and values.disable_flashinfer_autotune


def _modelled(trial: Path, streams: int) -> float:
    """The built-in landscape's output tok/s for the trial's launch profile at ``streams``."""
    profile = json.loads((trial / "profile.json").read_text())
    flags, env = load("0.5.23").parse(profile["args"]).values, profile["env"]
    land = Landscape.load(None)
    cap = flags["max_running_requests"] or land.max_running_requests(flags, env)
    return land.throughput(flags, env, min(streams, cap))


def test_levels_where_no_request_ends_still_give_the_modelled_objective(demo_study: Path) -> None:
    """256-token answers at 8-14 tok/s a stream outlive every 6 s level: the objective is the
    tokens each stream received, and it matches the built-in landscape's rate."""
    trial = demo_study / "trials" / "demo" / "0"
    levels = json.loads((trial / "loadtest.json").read_text())["levels"]
    for level in levels:
        assert level["completed"] == 0 and level["output_tokens_counted"] == "server"
        assert level["output_throughput"] == pytest.approx(_modelled(trial, level["max_concurrency"]), rel=0.05)
    result = json.loads((trial / "result.json").read_text())
    assert result["outcome"] == "completed"
    assert result["objective"] == pytest.approx(max(lv["output_throughput"] for lv in levels))


def test_a_target_above_the_true_rate_prunes_a_level_where_no_request_ends(tmp_path: Path) -> None:
    """The pruner reads the level's figure: with a target 20% above the baseline's true rate at
    64 streams, the trial is pruned there (an inflated reading, once up to 64x, would pass it)."""
    _demo_space(tmp_path, targets="64: 1.2e3")  # the baseline delivers ~880 tok/s at 64 streams
    done = _search(tmp_path, "study", "run", "demo.yaml", "--study", "t", "--n-trials", "1", "--remeasure", "0",
                   "--emulate")
    assert done.returncode == 0, done.stderr
    trial = tmp_path / "trials" / "t" / "0"
    result = json.loads((trial / "result.json").read_text())
    assert result["outcome"] == "pruned"
    [level] = result["levels"]
    assert level["max_concurrency"] == 64 and level["completed"] == 0
    assert level["output_throughput"] == pytest.approx(_modelled(trial, 64), rel=0.05) and _modelled(trial, 64) < 1.2e3
