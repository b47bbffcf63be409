"""A value with a line break cannot inject keys into an exported `--config` YAML or commands into a
shell export: each export is read back as SGLang and bash read it."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from search.profile import LaunchProfile, render, to_sglang_config, to_shell
from search.space import Space, load_space
from tests.space.conftest import SPACES

HOSTILE = {
    "NCCL_DEBUG": "WARN\ndisable-radix-cache: true\n#",
    "A_CR": "x\rtp-size: 2",
    "A_NEL": "x\x85port: 1",
    "A_LINE_SEP": "x\u2028mem-fraction-static: 0.1",
    "A_QUOTES": "it's \"quoted\" \\ $HOME `id`",
    "A_ESC": "\x1b[31mred\ttab",
}


@pytest.fixture(scope="module")
def hostile() -> tuple[Space, LaunchProfile]:
    space = load_space(SPACES / "demo.yaml")
    launch = space.launch.model_copy(update={"env": {**space.launch.env, **HOSTILE}})
    space = space.model_copy(update={"launch": launch})
    return space, render(space, space.baseline)


def _bash_words(line: str) -> list[str]:
    """The words bash reads from one line of shell."""
    done = subprocess.run(["bash", "-c", f"set -- {line}\nprintf '%s\\0' \"$@\""], capture_output=True, check=True)
    return done.stdout.decode().split("\0")[:-1]


@pytest.mark.sglang
def test_sglang_config_export_reads_back_as_written(hostile: tuple[Space, LaunchProfile], tmp_path: Path) -> None:
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

    _, profile = hostile
    text = to_sglang_config(profile)
    data = yaml.safe_load(text)
    assert set(data) == {arg.removeprefix("--") for arg in profile.args if arg.startswith("--")}
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    path = tmp_path / "config.yaml"
    path.write_text(text)
    merged = ConfigArgumentMerger(parser).merge_config_with_args(["--config", str(path)])
    assert vars(parser.parse_args(merged)) == vars(parser.parse_args(profile.args))
    command = next(line for line in text.splitlines() if line.startswith("#   env "))
    words = _bash_words(command.removeprefix("#   "))
    assert words == ["env", *(f"{k}={v}" for k, v in profile.env.items()), *profile.launcher, "--config",
                     "THIS_FILE.yaml"]


def test_shell_export_runs_with_the_values_written(hostile: tuple[Space, LaunchProfile], tmp_path: Path) -> None:
    _, profile = hostile
    show = "import json, os, sys; print(json.dumps([dict(os.environ), sys.argv[1:]]))"
    profile.launcher = [sys.executable, "-c", show]
    script = tmp_path / "launch.sh"
    text = to_shell(profile)
    script.write_text(text)
    # one line per flag: no value spills onto a line of its own that a line-oriented reader would misread
    assert all(line.startswith(("#", "set -e", "exec env ", "  --")) for line in text.splitlines()), text
    env, argv = json.loads(subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True).stdout)
    assert {k: env[k] for k in HOSTILE} == HOSTILE
    assert argv == profile.args
