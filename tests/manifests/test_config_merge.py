"""`--config FILE.yaml` is inlined exactly as SGLang's own ConfigArgumentMerger does it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from search import manifests

CASES = [
    "model-path: m\ntp-size: 2\nenable-metrics: false\ntrust-remote-code: true\n",
    "model-path: m\ncuda-graph-bs-decode: [1, 2, 4]\ncuda-graph-backend-decode: disabled\nmax-running-requests: 64\n",
    "model-path: m\ncuda-graph-config: {decode: {backend: disabled}}\n",
    "model-path: m\ndisable-cuda-graph: true\n",  # a deprecated store_true: SGLang refuses it in a file
    "- not\n- a mapping\n",
]


def _real_merge(argv: list[str]) -> list[str] | str:
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    try:
        return ConfigArgumentMerger(parser).merge_config_with_args(argv)
    except ValueError as exc:
        return str(exc)


def _ours(argv: list[str]) -> list[str] | str:
    try:
        return manifests.load("0.5.23").expand_config(argv)
    except manifests.ManifestError as exc:
        return str(exc)


@pytest.mark.sglang
@pytest.mark.parametrize("body", CASES)
def test_config_file_merges_like_sglang(tmp_path: Path, body: str) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(body)
    argv = ["--port", "31000", "--config", str(config), "--tp-size", "4"]
    assert _ours(argv) == _real_merge(argv)


def test_command_line_wins_over_the_file(tmp_path: Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text("model-path: m\nmax-running-requests: 64\ndisable-cuda-graph: true\n")
    values = manifests.load("0.5.9").parse(["--config", str(config), "--max-running-requests", "1024"]).values
    assert (values["model_path"], values["max_running_requests"], values["disable_cuda_graph"]) == ("m", 1024, True)


def test_a_config_that_is_not_yaml_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "server.json"
    config.write_text("{}")
    with pytest.raises(manifests.ManifestError, match="Config file must be YAML format, got: .json"):
        manifests.load().parse(["--config", str(config)])
