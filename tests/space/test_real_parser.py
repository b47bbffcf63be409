"""The real-parser proof: every argv we render parses under SGLang's parser into the values we meant.

Spaces for 0.5.23 go through the installed sglang's own `ServerArgs.add_cli_args` (and its
`--config` merger for the YAML export); the 0.5.9 space goes through the shipped 0.5.9 manifest.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import optuna
import pytest

from search.manifests import load
from search.profile import LaunchProfile, render, to_sglang_config
from search.space import Space, is_flag, load_space
from tests.space.conftest import SPACES

SAMPLES = 40


def _configs(space: Space) -> list[dict[str, Any]]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=7))
    sampled = [space.suggest(study.ask()) for _ in range(SAMPLES)]
    return [space.baseline, *sampled]


def _assert_meant(space: Space, config: dict[str, Any], values: dict[str, Any],
                  dest_default: Callable[[str], tuple[str, Any]]) -> None:
    """Every flag, fixed or searched, parsed into the value the space means; absent ones into SGLang's default."""
    fixed = [(option, value) for _, option, value in space.launch.options()] + list(space.launch.flags.items())
    active = space.active(config)
    for name, value in fixed + [(n, v) for n, v in active.items() if is_flag(n)]:
        dest, default = dest_default(name)
        meant = default if value is None else value
        assert values[dest] == meant and type(values[dest]) is type(meant), (name, value, values[dest])
    for name in space.params:  # inactive or absent flags keep SGLang's default
        if is_flag(name) and name not in active:
            dest, default = dest_default(name)
            assert values[dest] == default, name
    launch = space.launch
    assert (values["model_path"], values["host"], values["port"], values["quantization"]) == (
        launch.model, launch.host, launch.port, launch.quantization)


def _assert_env(space: Space, config: dict[str, Any], profile: LaunchProfile) -> None:
    """The environment is the fixed one plus the active env params (unset when null); secrets only named."""
    meant = {name: str(value) for name, value in space.launch.env.items()}
    meant.update({name: str(value) for name, value in space.active(config).items()
                  if not is_flag(name) and value is not None})
    assert profile.env == meant
    assert profile.secret_env == space.launch.secret_env


@pytest.fixture(scope="module")
def real_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser


def _real_dest_default(parser: argparse.ArgumentParser) -> Callable[[str], tuple[str, Any]]:
    actions = parser._option_string_actions  # the parser's own table of option -> action

    def lookup(name: str) -> tuple[str, Any]:
        return actions[name].dest, actions[name].default

    return lookup


@pytest.mark.sglang
def test_demo_space_argv_parses_under_real_sglang(real_parser: argparse.ArgumentParser) -> None:
    import sglang

    space = load_space(SPACES / "demo.yaml")
    assert sglang.__version__ == space.sglang_version == "0.5.23"
    seen = set()
    assert space.launch.flags and space.launch.quantization and space.launch.env  # every fixed kind is proved
    for config in _configs(space):
        profile = render(space, config)
        values = vars(real_parser.parse_args(profile.args))
        _assert_meant(space, config, values, _real_dest_default(real_parser))
        _assert_env(space, config, profile)
        assert values["tp_size"] == space.launch.tp
        seen.add(tuple(sorted(space.active(config))))
    assert len(seen) > 1  # both sides of the CUDA-graph condition were rendered


@pytest.mark.sglang
def test_demo_sglang_config_merges_like_the_argv(real_parser: argparse.ArgumentParser, tmp_path) -> None:
    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

    space = load_space(SPACES / "demo.yaml")
    for i, config in enumerate(_configs(space)[:10]):
        profile = render(space, config)
        path = tmp_path / f"profile{i}.yaml"
        path.write_text(to_sglang_config(profile))
        merged = ConfigArgumentMerger(real_parser).merge_config_with_args(["--config", str(path)])
        assert vars(real_parser.parse_args(merged)) == vars(real_parser.parse_args(profile.args))


@pytest.mark.sglang
def test_seed_command_tp_abbreviation_under_real_sglang(real_parser: argparse.ArgumentParser) -> None:
    from search.command import parse_command
    from tests.space.conftest import SEED_COMMAND

    args = parse_command(SEED_COMMAND.replace("--nsa-decode-backend trtllm", "")
                         .replace("--nsa-prefill-backend trtllm", "")).args
    values = vars(real_parser.parse_args(args))
    assert values["tp_size"] == 8 and values["model_path"] == "lukealonso/GLM-5-NVFP4"


def test_glm5_space_argv_parses_under_the_0_5_9_manifest() -> None:
    space = load_space(SPACES / "glm5-nvfp4-8gpu.yaml")
    manifest = load(space.sglang_version)

    def lookup(name: str) -> tuple[str, Any]:
        flag = manifest.flag(name)
        return flag.dest, flag.default

    for config in _configs(space):
        profile = render(space, config)
        values = manifest.parse(profile.args).values
        _assert_meant(space, config, values, lookup)
        _assert_env(space, config, profile)
        assert values["tensor_parallel_size"] == 8
