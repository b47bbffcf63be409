"""check_space against shipped manifests: each problem kind, all reported at once; the seed command."""

from __future__ import annotations

import copy
import sys

import pytest

from search.command import check_command
from search.manifests import load
from search.space import load_space, parse_space
from search.space_check import check_space
from tests.space.conftest import MINIMAL, SEED_COMMAND, SPACES


def _lines(data: dict, version: str = "0.5.9") -> tuple[list[str], list[str]]:
    report = check_space(parse_space(data, "s.yaml"), load(version))
    return [str(p) for p in report.errors], [str(p) for p in report.warnings]


def test_minimal_space_is_valid() -> None:
    assert _lines(copy.deepcopy(MINIMAL)) == ([], [])


def test_every_problem_kind_is_reported_together() -> None:
    data = copy.deepcopy(MINIMAL)
    data["launch"]["flags"] = {"--no-such-flag": 1, "--moe-runner-backend": "warp_drive", "--api-key": "sk-1"}
    data["launch"]["env"] = {"1BAD": "x", "HF_TOKEN": "hf_secret"}
    data["params"].update({
        "--max-prefill-tokens": {"type": "float", "low": 1.5, "high": 9.5},          # float on an int flag
        "--enable-metrics": {"type": "categorical", "choices": [True]},               # switch not bool
        "--chunked-prefill-size": {"type": "bool"},                                  # bool on a valued flag
        "--schedule-policy": {"type": "categorical", "choices": ["fcfs", "lifo"]},   # outside choices
        "BAD-NAME": {"type": "categorical", "choices": [1]},                          # invalid env name
        "--stream-interval": {"type": "int", "low": 1, "high": 4, "when": {"--nope": 1}},
        "--decode-log-interval": {"type": "int", "low": 1, "high": 4,
                                  "when": {"--max-running-requests": 99}},            # impossible value
    })
    data["baseline"]["--max-running-requests"] = 100                                  # outside choices
    data["baseline"]["--unknown"] = 1
    data["targets"] = {128: 500}
    errors, _ = _lines(data)
    text = "\n".join(errors)
    expected = [
        "s.yaml: launch.flags.--no-such-flag: unknown flag --no-such-flag in SGLang 0.5.9",
        "s.yaml: launch.flags.--moe-runner-backend: 'warp_drive' is not a choice of --moe-runner-backend (allowed: auto,",
        "s.yaml: launch.flags.--api-key: a secret value would be written into every rendered profile",
        "s.yaml: launch.env.1BAD: '1BAD' is not a valid env var name",
        "s.yaml: launch.env.HF_TOKEN: a secret value is written in the space file (allowed: list HF_TOKEN in launch.secret_env",
        "s.yaml: params.--max-prefill-tokens: type float but --max-prefill-tokens takes int (allowed: type int)",
        "s.yaml: params.--enable-metrics: --enable-metrics is a store_true switch; use type: bool (allowed: bool)",
        "s.yaml: params.--chunked-prefill-size: type bool needs a store_true flag; --chunked-prefill-size is int",
        "s.yaml: params.--schedule-policy.choices[1]: 'lifo' is not a choice of --schedule-policy (allowed: ",
        "s.yaml: params.BAD-NAME: 'BAD-NAME' is neither a flag (--name) nor a valid env var name",
        "s.yaml: params.--stream-interval.when.--nope: condition names unknown param --nope",
        "s.yaml: params.--decode-log-interval.when.--max-running-requests: --max-running-requests can never be 99",
        "s.yaml: baseline.--max-running-requests: 100 is outside the param (allowed: null (flag omitted), 64, 256)",
        "s.yaml: baseline.--unknown: not a param of this space",
        "s.yaml: targets.128: not a level of load_test.concurrency (allowed: 64, 256, 512, 1024)",
    ]
    for line in expected:
        assert line in text, line
    assert len(errors) >= len(expected)


def test_baseline_condition_violations_and_missing_params() -> None:
    data = copy.deepcopy(MINIMAL)
    data["baseline"]["--disable-cuda-graph"] = True     # --cuda-graph-max-bs now inactive but set
    del data["baseline"]["NCCL_MIN_NCHANNELS"]
    errors, _ = _lines(data)
    assert ("s.yaml: baseline.--cuda-graph-max-bs: set although its condition fails "
            "(allowed: only when --disable-cuda-graph=False)") in errors
    assert "s.yaml: baseline.NCCL_MIN_NCHANNELS: missing: the param applies here (allowed: null (flag omitted), 4, 8)" in errors


def test_condition_cycle_and_duplicate_dest() -> None:
    data = copy.deepcopy(MINIMAL)
    data["params"]["--max-running-requests"]["when"] = {"--cuda-graph-max-bs": 16}
    data["params"]["--cuda-graph-max-bs"]["when"] = {"--max-running-requests": 64}
    data["params"]["--tp-size"] = {"type": "int", "low": 1, "high": 8}   # fixed by launch.tp already
    del data["baseline"]
    errors, _ = _lines(data)
    assert any("when: conditions form a cycle" in e for e in errors)
    assert any(e.startswith("s.yaml: params.--tp-size: --tp-size sets tensor_parallel_size, already set by launch (--tp-size)")
               for e in errors)


def test_deprecated_flags_warn_with_replacement_on_0_5_23() -> None:
    data = copy.deepcopy(MINIMAL)
    data["sglang_version"] = "0.5.23"
    data["params"]["--cuda-graph-max-bs-decode"] = data["params"].pop("--cuda-graph-max-bs")
    data["baseline"]["--cuda-graph-max-bs-decode"] = data["baseline"].pop("--cuda-graph-max-bs")
    errors, warnings = _lines(data, "0.5.23")
    assert errors == []
    assert warnings == ["s.yaml: params.--disable-cuda-graph: --disable-cuda-graph is deprecated in SGLang 0.5.23; "
                        "use --cuda-graph-backend-{decode,prefill}=disabled instead"]


@pytest.mark.parametrize("name", ["glm5-nvfp4-8gpu.yaml", "demo.yaml"])
def test_shipped_spaces_pass_on_their_version(name: str) -> None:
    space = load_space(SPACES / name)
    report = check_space(space, load(space.sglang_version))
    assert report.problems == []


def test_seed_command_on_the_three_versions() -> None:
    assert check_command(SEED_COMMAND, load("0.5.9")).problems == []

    old = check_command(SEED_COMMAND, load("0.5.8.post1"))
    assert [str(p) for p in old.errors][0] == (
        "<command>: --nsa-decode-backend: 'trtllm' is not a choice of --nsa-decode-backend "
        "(allowed: flashmla_sparse, flashmla_kv, flashmla_auto, fa3, tilelang, aiter)")

    new = check_command(SEED_COMMAND, load("0.5.23"))
    errors = [str(p) for p in new.errors]
    assert errors[0].startswith("<command>: --nsa-decode-backend: unknown flag --nsa-decode-backend in SGLang 0.5.23")
    assert errors[1].startswith("<command>: --nsa-prefill-backend: unknown flag --nsa-prefill-backend in SGLang 0.5.23")
    assert len(errors) == 2
    assert [str(p) for p in new.warnings] == [
        "<command>: --enable-flashinfer-allreduce-fusion: --enable-flashinfer-allreduce-fusion is deprecated in "
        "SGLang 0.5.23; use --flashinfer-allreduce-fusion-backend=auto instead",
        "<command>: --disable-cuda-graph: --disable-cuda-graph is deprecated in SGLang 0.5.23; "
        "use --cuda-graph-backend-{decode,prefill}=disabled instead",
    ]


def test_cli_exit_codes_and_lines(cli, write_space) -> None:
    code, _, err = cli("space", "check", str(SPACES / "glm5-nvfp4-8gpu.yaml"))
    assert code == 0 and "valid for SGLang 0.5.9" in err
    code, out, err = cli("space", "check", "--command", SEED_COMMAND, "--sglang-version", "0.5.23")
    assert code == 2
    assert "<command>: --nsa-decode-backend: unknown flag" in out
    assert "warning: <command>: --disable-cuda-graph: --disable-cuda-graph is deprecated" in out
    assert err.startswith("error: launch command: 2 error(s) for SGLang 0.5.23 (2 warning(s))")
    assert cli("space", "check", "--command", SEED_COMMAND, "--sglang-version", "0.5.9")[0] == 0
    broken = write_space({"sglang_version": "0.5.9", "launch": {"model": "m", "tp": 0}})
    code, out, err = cli("space", "check", str(broken))
    assert code == 2 and out == f"{broken}: launch.tp: Input should be greater than 0\n"
    assert cli("space", "check")[0] == 2  # neither a space nor --command


@pytest.mark.sglang
def test_cli_live_python_builds_the_manifest_from_installed_sglang(cli) -> None:
    code, out, err = cli("space", "check", str(SPACES / "demo.yaml"), "--python", sys.executable)
    assert code == 0, out + err
    assert "valid for SGLang 0.5.23" in err


def test_check_reports_schema_and_manifest_problems_in_one_run(cli, write_space) -> None:
    data = copy.deepcopy(MINIMAL)
    data["launch"].update({"tp": 0, "quantization": "notaquant", "flags": {"--no-such-flag": 1}})
    data["params"]["--cuda-graph-max-bs"]["low"] = 512  # broken: the baseline and a condition lean on it
    data["params"]["--stream-interval"] = {"type": "int", "low": 1, "high": 4, "when": {"--cuda-graph-max-bs": 64}}
    data["params"]["--x"] = {"type": "floaty"}
    data["params"]["--schedule-policy"] = {"type": "categorical", "choices": ["fcfs", "lifo"]}
    data["load_test"] = {"api": "grpc", "concurrency": [8, 4]}
    data["targets"] = {4: 100}  # a level of the broken ladder: not checked against the default one
    path = write_space(data)
    code, out, err = cli("space", "check", str(path))
    assert code == 2
    quantizations = ", ".join(load("0.5.9").flag("--quantization").choices)
    assert out.splitlines() == [
        f"{path}: launch.tp: Input should be greater than 0",
        f"{path}: params.--cuda-graph-max-bs: empty range: low 512 > high 256 (allowed: low <= high, e.g. low: 256, high: 512)",
        f"{path}: params.--x: unknown param type 'floaty' (allowed: int, float, categorical, bool)",
        f"{path}: load_test.api: unknown value 'grpc' (allowed: 'completions', 'chat' or 'generate')",
        f"{path}: load_test.concurrency: concurrency must rise strictly, got [8, 4]",
        f"{path}: launch.quantization: 'notaquant' is not a choice of --quantization (allowed: {quantizations})",
        f"{path}: launch.flags.--no-such-flag: unknown flag --no-such-flag in SGLang 0.5.9",
        f"{path}: params.--schedule-policy.choices[1]: 'lifo' is not a choice of --schedule-policy (allowed: "
        + ", ".join(load("0.5.9").flag("--schedule-policy").choices) + ")",
    ]
    assert err == f"error: {path}: 8 error(s) for SGLang 0.5.9 (0 warning(s))\n"


def test_missing_required_keys_still_check_the_rest(cli, write_space) -> None:
    path = write_space({"launch": {"tp": 2}, "params": {"--no-such-flag": {"type": "bool"}}})
    code, out, _ = cli("space", "check", str(path))
    assert code == 2
    assert out.splitlines() == [f"{path}: sglang_version: required key missing",
                                f"{path}: launch.model: required key missing",
                                f"{path}: params.--no-such-flag: unknown flag --no-such-flag in SGLang 0.5.23"]


@pytest.mark.parametrize("with_baseline", [True, False])
def test_fixed_launch_values_are_checked_under_their_own_key(with_baseline: bool) -> None:
    data = copy.deepcopy(MINIMAL)
    data["launch"]["quantization"] = "notaquant"
    if not with_baseline:
        del data["baseline"]
    errors, _ = _lines(data)
    assert len(errors) == 1, errors
    assert errors[0].startswith("s.yaml: launch.quantization: 'notaquant' is not a choice of --quantization (allowed: ")
    data["launch"]["quantization"] = "modelopt_fp4"
    assert _lines(data) == ([], [])


def test_searched_secrets_are_errors_that_say_use_the_environment() -> None:
    data = copy.deepcopy(MINIMAL)
    data["params"]["HF_TOKEN"] = {"type": "categorical", "choices": ["hf_secretvalue"]}
    data["params"]["--api-key"] = {"type": "categorical", "choices": ["topsecret"]}
    data["baseline"].update({"HF_TOKEN": "hf_secretvalue", "--api-key": "topsecret"})
    errors, _ = _lines(data)
    written = "a secret is never searched: its values would be written into every rendered profile and log"
    assert errors == [
        f"s.yaml: params.HF_TOKEN: {written} (allowed: drop it from params and baseline; "
        "export HF_TOKEN in your environment and list it in launch.secret_env)",
        f"s.yaml: params.--api-key: {written} (allowed: drop it from params and baseline; "
        "a flag's value is on the command line, so keep secret flags out of the space)",
    ]


def test_runs_check_the_space_before_starting_anything(cli, write_space, tmp_path) -> None:
    data = copy.deepcopy(MINIMAL)
    data["sglang_version"] = "0.5.23"
    data["params"]["--cuda-graph-max-bs-decode"] = data["params"].pop("--cuda-graph-max-bs")
    data["baseline"]["--cuda-graph-max-bs-decode"] = data["baseline"].pop("--cuda-graph-max-bs")
    data["params"]["--no-such-flag"] = {"type": "bool"}
    data["baseline"]["--no-such-flag"] = False
    path = write_space(data)
    storage = tmp_path / "studies.db"
    for run in (["trial", "run", str(path), "--emulate", "--trials-dir", str(tmp_path / "trials")],
                ["study", "run", str(path), "--study", "s", "--emulate", "--storage", f"sqlite:///{storage}",
                 "--trials-dir", str(tmp_path / "trials")]):
        code, out, err = cli(*run)
        assert code == 2 and out == ""
        assert err.splitlines() == [
            f"{path}: params.--no-such-flag: unknown flag --no-such-flag in SGLang 0.5.23",
            f"warning: {path}: params.--disable-cuda-graph: --disable-cuda-graph is deprecated in SGLang 0.5.23; "
            "use --cuda-graph-backend-{decode,prefill}=disabled instead",
            f"error: {path}: 1 error(s) for SGLang 0.5.23; nothing was started "
            f"(`search space check {path}` checks it again)",
        ]
    assert not (tmp_path / "trials").exists() and not storage.exists()
