"""Shared fixtures: the shipped spaces and a writer for broken ones."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SPACES = ROOT / "spaces"
SEED_COMMAND = (Path(__file__).parents[1] / "fixtures" / "seed_command.txt").read_text()

MINIMAL = {
    "sglang_version": "0.5.9",
    "launch": {"model": "m", "tp": 2},
    "params": {
        "--max-running-requests": {"type": "categorical", "choices": [None, 64, 256]},
        "--disable-cuda-graph": {"type": "bool"},
        "--cuda-graph-max-bs": {"type": "int", "low": 16, "high": 256, "step": 16,
                                "when": {"--disable-cuda-graph": False}},
        "--mem-fraction-static": {"type": "float", "low": 0.8, "high": 0.9, "step": 0.01},
        "NCCL_MIN_NCHANNELS": {"type": "categorical", "choices": [None, 4, 8]},
    },
    "baseline": {"--max-running-requests": 64, "--disable-cuda-graph": False, "--cuda-graph-max-bs": 64,
                 "--mem-fraction-static": 0.85, "NCCL_MIN_NCHANNELS": 8},
}


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """Run `search ARGS...` in-process: (exit code, stdout, stderr)."""
    from search.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        with pytest.raises(SystemExit) as info:
            main(list(args))
        out = capsys.readouterr()
        return int(info.value.code or 0), out.out, out.err

    return run


@pytest.fixture
def write_space(tmp_path: Path) -> Callable[[dict], Path]:
    def write(data: dict) -> Path:
        path = tmp_path / "space.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write
