"""Rendering and exports: argv shape, shell quoting, SGLang config YAML, JSON, secrets never written."""

from __future__ import annotations

import copy
import json
import os
import subprocess

import pytest
import yaml

from search.command import config_from_command, parse_command
from search.errors import BadInput
from search.manifests import load
from search.profile import flag_tokens, from_json, is_secret, render, to_json, to_sglang_config, to_shell
from search.space import load_space, parse_space
from search.space_check import check_space
from tests.space.conftest import MINIMAL, SEED_COMMAND, SPACES

SECRET = "hf_do_not_leak_123"


def _space(**launch):
    data = copy.deepcopy(MINIMAL)
    data["launch"].update(launch)
    return parse_space(data)


def test_render_fixed_part_then_active_params() -> None:
    space = _space(flags={"--trust-remote-code": True, "--served-model-name": "my model"}, env={"A": 1})
    config = {"--max-running-requests": None, "--disable-cuda-graph": True, "--cuda-graph-max-bs": 32,
              "--mem-fraction-static": 0.85, "NCCL_MIN_NCHANNELS": 8}
    profile = render(space, config)
    assert profile.args == ["--model-path", "m", "--tp-size", "2", "--host", "127.0.0.1", "--port", "30000",
                            "--trust-remote-code", "--served-model-name", "my model",
                            "--disable-cuda-graph", "--mem-fraction-static", "0.85"]
    assert profile.env == {"A": "1", "NCCL_MIN_NCHANNELS": "8"}
    assert profile.argv[:3] == ["python3", "-m", "sglang.launch_server"]
    assert profile.secret_env == ["HF_TOKEN"]
    off = render(space, {**config, "--disable-cuda-graph": False, "NCCL_MIN_NCHANNELS": None})
    assert "--disable-cuda-graph" not in off.args and "--cuda-graph-max-bs" in off.args
    assert "NCCL_MIN_NCHANNELS" not in off.env


def test_url_for_wildcard_host() -> None:
    assert render(_space(host="0.0.0.0", port=8000), {}).url == "http://127.0.0.1:8000"


def test_shell_script_quotes_and_runs(tmp_path) -> None:
    space = _space(launcher=["printf", "[%s]\\n"], flags={"--served-model-name": "it's $HOME; rm -rf /"}, env={"Q": "a b"})
    script = tmp_path / "launch.sh"
    profile = render(space, {"NCCL_MIN_NCHANNELS": 4})
    script.write_text(to_shell(profile))
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, env={"PATH": os.environ["PATH"]},
                         timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "".join(f"[{a}]\n" for a in profile.args)  # every argument arrived whole
    assert "[it's $HOME; rm -rf /]\n" in out.stdout


def test_secrets_are_referenced_never_written(tmp_path) -> None:
    space = _space(launcher=["printenv", "HF_TOKEN"], env={"MY_API_KEY": SECRET}, secret_env=["HF_TOKEN"])
    profile = render(space, {})
    assert profile.secret_env == ["HF_TOKEN", "MY_API_KEY"] and "MY_API_KEY" not in profile.env
    for text in (to_shell(profile), to_sglang_config(profile), to_json(profile)):
        assert SECRET not in text
    shell = to_shell(profile)
    assert '${HF_TOKEN+"HF_TOKEN=${HF_TOKEN}"}' in shell
    script = tmp_path / "s.sh"
    script.write_text(shell)
    base = {"PATH": os.environ["PATH"]}
    passed = subprocess.run(["bash", str(script)], capture_output=True, text=True, env={**base, "HF_TOKEN": "t0k"})
    assert passed.stdout.strip() == "t0k"  # taken from the caller's environment at start
    unset = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=base)
    assert unset.returncode != 0 and unset.stdout == ""  # not set to an empty string when absent


def test_secret_flag_value_refuses_to_render() -> None:
    with pytest.raises(BadInput, match="secret values are never written"):
        render(_space(flags={"--api-key": SECRET}), {})


@pytest.mark.parametrize("name", ["HF_TOKEN", "--api-key"])
def test_a_searched_secret_refuses_to_render(name: str, cli, write_space) -> None:
    data = copy.deepcopy(MINIMAL)
    data["params"][name] = {"type": "categorical", "choices": [SECRET]}
    data["baseline"][name] = SECRET
    space = parse_space(data, "s.yaml")
    with pytest.raises(BadInput, match=f"secret values are never written, so this space does not render: "
                                       f"s.yaml: params.{name}: a secret is never searched"):
        render(space, space.baseline)
    path = write_space(data)
    for fmt in ("shell", "sglang-config", "json"):
        code, out, err = cli("space", "render", str(path), "--baseline", "--format", fmt)
        assert code == 2 and out == "" and SECRET not in err


@pytest.mark.parametrize("name", ["HF_TOKEN", "OPENAI_API_KEY", "PGPASSWORD", "AWS_SECRET_ACCESS_KEY", "--api-key",
                                  "--admin-api-key", "--ssl-keyfile-password"])
def test_credential_names_are_secret(name: str) -> None:
    assert is_secret(name)


@pytest.mark.parametrize("option, value", [("--max-total-tokens", 100000), ("--tokenizer-path", "/models/tok"),
                                           ("--bucket-time-to-first-token", [0.1, 0.5]),
                                           ("--kt-max-deferred-experts-per-token", 2)])
def test_counts_paths_and_units_named_token_are_not_secret(option: str, value: object) -> None:
    space = _space(flags={option: value})
    assert not is_secret(option)
    assert check_space(space, load("0.5.9")).problems == []
    assert render(space, {}).args[8:] == flag_tokens(option, value)


def test_sglang_config_yaml_shape() -> None:
    space = _space(flags={"--trust-remote-code": True, "--enable-metrics": False, "--cuda-graph-bs": [1, 2, 4],
                          "--served-model-name": "true", "--json-model-override-args": '{"a": 1}'})
    data = yaml.safe_load(to_sglang_config(render(space, {"--mem-fraction-static": 0.85})))
    assert data == {"model-path": "m", "tp-size": 2, "host": "127.0.0.1", "port": 30000,
                    "trust-remote-code": True, "cuda-graph-bs": [1, 2, 4], "served-model-name": "true",
                    "json-model-override-args": '{"a": 1}', "mem-fraction-static": 0.85}


def test_json_round_trip() -> None:
    profile = render(load_space(SPACES / "glm5-nvfp4-8gpu.yaml"), {})
    assert from_json(to_json(profile)) == profile
    with pytest.raises(BadInput, match="not a launch profile JSON"):
        from_json('{"args": 1}')


def test_parse_command_forms() -> None:
    command = parse_command(SEED_COMMAND)
    assert command.env == {"NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "5", "NCCL_MIN_NCHANNELS": "8"}
    assert command.launcher == ["python3", "-u", "-m", "sglang.launch_server"]
    assert command.args[:2] == ["--model", "lukealonso/GLM-5-NVFP4"] and command.args[-1] == "8000"
    eq = parse_command("env A='x y' python -m sglang.launch_server --tp=4 --model-path 'a b'")
    assert eq.env == {"A": "x y"} and eq.args == ["--tp=4", "--model-path", "a b"]
    with pytest.raises(BadInput, match="no `python -m sglang.launch_server`"):
        parse_command("python3 train.py --tp 8")


def test_config_from_seed_command_onto_the_glm5_space() -> None:
    space = load_space(SPACES / "glm5-nvfp4-8gpu.yaml")
    config = config_from_command(space, SEED_COMMAND)
    assert config == {"--max-running-requests": None, "--disable-cuda-graph": True,
                      "--moe-runner-backend": "flashinfer_cutlass", "--disable-flashinfer-autotune": False,
                      "--enable-flashinfer-allreduce-fusion": True, "--mem-fraction-static": 0.92,
                      "NCCL_MIN_NCHANNELS": 8, "NCCL_P2P_LEVEL": "5"}
    assert space.config_problems(config, "c") == []


def test_config_from_command_names_every_misfit() -> None:
    space = load_space(SPACES / "glm5-nvfp4-8gpu.yaml")
    text = (SEED_COMMAND.replace("0.92", "0.5").replace("--trust-remote-code", "--enable-metrics")
            .replace("NCCL_IB_DISABLE=1", "NCCL_IB_DISABLE=0 FOO=1").replace("glm-5 ", "other "))
    with pytest.raises(BadInput) as info:
        config_from_command(space, text)
    message = str(info.value)
    assert message.startswith(f"the launch command does not fit {space.source}: ")
    for part in ("--enable-metrics: set in the command but not in the space",
                 "--served-model-name: 'other' in the command but 'glm-5' in the space",
                 "NCCL_IB_DISABLE: '0' in the command but '1' in the space",
                 "FOO: set in the command but not in the space",
                 "--mem-fraction-static: 0.5 is outside the param (allowed: float 0.8..0.94 step 0.01)"):
        assert part in message, part


def test_config_from_command_reports_parser_errors() -> None:
    space = load_space(SPACES / "glm5-nvfp4-8gpu.yaml")
    rejected = "SGLang 0.5.9 rejects the launch command: argument --tensor-parallel-size/--tp-size: invalid int value: .eight."
    with pytest.raises(BadInput, match=rejected):
        config_from_command(space, "python -m sglang.launch_server --model m --tp eight")


def test_render_cli_writes_profile(cli, tmp_path) -> None:
    out = tmp_path / "p.json"
    code, _, err = cli("space", "render", str(SPACES / "demo.yaml"), "--baseline",
                       "--set", "--max-running-requests=null", "--format", "json", "-o", str(out))
    assert code == 0, err
    profile = json.loads(out.read_text())
    assert "--max-running-requests" not in profile["args"] and "--disable-flashinfer-autotune" in profile["args"]
    code, _, err = cli("space", "render", str(SPACES / "demo.yaml"), "--set", "--mem-fraction-static=2")
    assert code == 2 and "--set.--mem-fraction-static: 2 is outside the param" in err
