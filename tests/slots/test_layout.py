"""GPUs a layout takes and SGLang's rules on it; the space check walks a space's layouts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from search.layout import Layout, gpus_needed
from search.space import Objective


@pytest.mark.parametrize(("args", "gpus"), [
    ([], 1),
    (["--tp-size", "2"], 2),
    (["--tensor-parallel-size=4", "--pp-size", "2"], 8),
    (["--tp-size", "2", "--dp-size", "2"], 4),  # replicas: each a whole tp group
    (["--tp-size", "8", "--dp-size", "8", "--enable-dp-attention"], 8),  # attention DP runs inside tp
    (["--tp-size", "4", "--attn-dp-size", "4"], 4),
])
def test_gpus_as_sglang_counts_them(args: list[str], gpus: int) -> None:
    assert gpus_needed(args) == gpus


@pytest.mark.parametrize(("args", "words"), [
    (["--tp-size", "4", "--enable-dp-attention"], "needs --dp-size > 1"),
    (["--tp-size", "2", "--dp-size", "4", "--enable-dp-attention"], "attention DP 4 must divide --tp-size 2"),
    (["--tp-size", "2", "--ep-size", "8"], "must be divisible by --ep-size 8"),
    (["--tp-size", "2", "--dp-size", "2", "--attn-dp-size", "2"], "not support replicas"),
])
def test_sglang_rules(args: list[str], words: str) -> None:
    assert any(words in problem for problem in Layout.of(args).problems())


def test_the_host_must_hold_the_layout() -> None:
    assert Layout.of(["--tp-size", "8"]).problems(8) == []
    assert "must divide the host's 8" in Layout.of(["--tp-size", "3"]).problems(8)[0]
    assert "takes 16 GPU(s)" in Layout.of(["--tp-size", "8", "--dp-size", "2"]).problems(8)[0]


def test_per_gpu_objective_names_its_unit() -> None:
    objective = Objective(metric="output_throughput_per_gpu")
    assert objective.level_key == "output_throughput" and objective.per_gpu
    assert objective.format(526.4) == "526 tok/s/GPU"


def _layout_space(path: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "sglang_version": "0.5.9",
        "launch": {"launcher": ["python3", "-m", "sglang.launch_server"], "model": "m", "tp": None,
                   "secret_env": []},
        "params": {"--tp-size": {"type": "categorical", "choices": [2, 4, 8]},
                   "--dp-size": {"type": "categorical", "choices": [1, 2]},
                   "--enable-dp-attention": {"type": "bool", "when": {"--dp-size": 2}}},
        "baseline": {"--tp-size": 8, "--dp-size": 1},
    }))
    return path


def test_space_check_reports_each_bad_layout_against_the_hosts_gpus(tmp_path: Path) -> None:
    space = _layout_space(tmp_path / "layout.yaml")
    done = subprocess.run([sys.executable, "-c", "from search.cli import main; main()", "space", "check", str(space),
                           "--gpu-count", "8"], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    lines = done.stdout.splitlines()
    def where(line: str) -> set[str]:
        return set(line.split(": ")[2].split())

    plain, attention = {"--tp-size=8", "--dp-size=2", "--enable-dp-attention=False"}, {"--enable-dp-attention=True"}
    assert any(where(line) == plain and "takes 16 GPU(s)" in line for line in lines), lines
    assert not any(attention <= where(line) and "--tp-size=8" in where(line) for line in lines), lines
    assert all("when:" in line for line in lines)
    without = subprocess.run([sys.executable, "-c", "from search.cli import main; main()", "space", "check",
                              str(space)], capture_output=True, text=True)
    assert without.returncode == 0, without.stdout  # no host given: every layout SGLang takes passes


def test_a_bad_gpus_list_is_one_line_and_exit_2(tmp_path: Path) -> None:
    space = _layout_space(tmp_path / "layout.yaml")
    done = subprocess.run([sys.executable, "-c", "from search.cli import main; main()", "study", "run", str(space),
                           "--study", "x", "--gpus", "0,a"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: --gpus '0,a': give distinct GPU indexes separated by commas, e.g. --gpus 0,1,2,3"]
