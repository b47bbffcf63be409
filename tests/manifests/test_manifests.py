"""Manifests: shipped data vs SGLang's real parser, the rebuilt parser, and live dumps."""

from __future__ import annotations

import argparse
import json
import logging
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from search.errors import BadInput
from search.manifests import SHIPPED, ManifestError, live, load

SEED_COMMAND = Path(__file__).parents[1] / "fixtures" / "seed_command.txt"  # from shared/seeds/000_*.txt
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def seed_argv() -> list[str]:
    """The seed run's launch command, as argv after `-m sglang.launch_server`."""
    words = shlex.split(SEED_COMMAND.read_text().replace("\\\n", " "))
    return words[words.index("sglang.launch_server") + 1 : words.index(">")]


MODEL = ["--model-path", "m"]  # required by 0.5.23
SEED_WITHOUT_NSA = [a for a in seed_argv() if not a.startswith("--nsa") and a != "trtllm"]


def normal(value: Any) -> Any:
    """Parsed values as JSON would carry them (tuples -> lists)."""
    return json.loads(json.dumps(value, default=repr))


# ---------------------------------------------------------------- shipped data, no sglang needed


def test_every_shipped_version_loads_with_the_reference_flag_count() -> None:
    counts = {v: len(load(v).flags) for v in SHIPPED}
    # The reference counts the parser's actions without argparse's own -h.
    assert counts == {"0.5.8.post1": 328, "0.5.9": 331, "0.5.23": 531}
    assert all(load(v).version == v for v in SHIPPED)
    assert load("0.5.23") is load("0.5.23")  # cached


def test_unknown_version_names_the_shipped_ones() -> None:
    with pytest.raises(BadInput, match=r"0\.5\.8\.post1, 0\.5\.9, 0\.5\.23.*--python"):
        load("0.4.0")


def test_flag_lookup_by_option_prefix_and_dest() -> None:
    m = load("0.5.23")
    tp = m.flag("--tp-size")
    assert tp is not None and tp.dest == "tp_size" and "--tensor-parallel-size" in tp.options
    assert m.flag("--tp") is tp  # unique prefix, as argparse allows
    assert m.flag("tp_size") is tp
    assert tp.takes_value and not m.flag("--disable-cuda-graph").takes_value
    assert m.flag("--monokernel-backend").takes_value  # DeprecatedStoreConstAction with a value
    assert m.flag("--cuda-graph") is None  # ambiguous prefix
    assert m.flag("--nsa-decode-backend") is None  # removed in 0.5.23
    assert load("0.5.9").flag("--nsa-decode-backend").choices[-1] == "trtllm"


def test_defaults_cover_every_dest_and_are_copies() -> None:
    m = load("0.5.23")
    defaults = m.defaults()
    assert {f.dest for f in m.flags} <= set(defaults)
    assert defaults["tp_size"] == 1 and defaults["schedule_policy"] == "fcfs"
    defaults["allowed_media_domains"].append("x")
    assert m.defaults()["allowed_media_domains"] == []


def test_seed_command_parses_on_059() -> None:
    result = load("0.5.9").parse(seed_argv())
    assert result.values["tensor_parallel_size"] == 8  # 0.5.9's dest; 0.5.23 renamed it tp_size
    assert result.values["nsa_decode_backend"] == "trtllm"
    assert result.values["disable_cuda_graph"] is True
    assert result.values["max_running_requests"] is None  # default filled
    assert result.warnings == []


def test_seed_command_fails_on_058_with_argparse_invalid_choice() -> None:
    with pytest.raises(ManifestError) as err:
        load("0.5.8.post1").parse(seed_argv())
    assert str(err.value) == (
        "argument --nsa-decode-backend: invalid choice: 'trtllm' (choose from 'flashmla_sparse', "
        "'flashmla_kv', 'flashmla_auto', 'fa3', 'tilelang', 'aiter')"
    )
    assert isinstance(err.value, BadInput)


def test_seed_command_fails_on_0523_and_its_deprecated_flags_warn() -> None:
    m = load("0.5.23")
    with pytest.raises(ManifestError, match=r"^unrecognized arguments: --nsa-decode-backend trtllm "
                       r"--nsa-prefill-backend trtllm$"):
        m.parse(seed_argv())
    result = m.parse(SEED_WITHOUT_NSA)
    assert result.values["disable_cuda_graph"] is True
    assert result.values["enable_flashinfer_allreduce_fusion"] is True
    assert result.warnings == [
        "--enable-flashinfer-allreduce-fusion is deprecated. "
        "Please use --flashinfer-allreduce-fusion-backend=auto instead.",
        "'--disable-cuda-graph' is deprecated and will be removed in a future release. "
        "Use '--cuda-graph-backend-{decode,prefill}=disabled' instead.",
    ]
    assert m.flag("--disable-cuda-graph").replacement == "--cuda-graph-backend-{decode,prefill}=disabled"
    assert m.flag("--enable-flashinfer-allreduce-fusion").replacement == "--flashinfer-allreduce-fusion-backend=auto"


def test_parse_does_not_leak_warnings_between_calls() -> None:
    m = load("0.5.23")
    assert m.parse([*MODEL, "--disable-cuda-graph"]).warnings
    assert m.parse([*MODEL, "--tp", "2"]).warnings == []


def test_rebuilt_parser_exits_2_with_argparse_message_and_logs_deprecations(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    parser = load("0.5.23").parser()
    with caplog.at_level(logging.WARNING, logger="search.manifests"):
        ns = parser.parse_args([*MODEL, "--disable-cuda-graph", "--monokernel-backend", "amd"])
    assert ns.disable_cuda_graph is True and ns.enable_amd_monokernel is True
    assert "'--monokernel-backend' is deprecated" in caplog.text
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args([*MODEL, "--schedule-policy", "nope"])
    assert exit_.value.code == 2
    assert "argument --schedule-policy: invalid choice: 'nope'" in capsys.readouterr().err


def test_custom_converters_convert_and_reject_like_sglang() -> None:
    m = load("0.5.23")
    hri = next(f for f in m.flags if f.type == "human_readable_int")
    assert m.parse([*MODEL, hri.options[0], "25.6k"]).values[hri.dest] == 25600
    with pytest.raises(ManifestError, match="Decimals are not allowed with IEC suffixes like 'Ki'"):
        m.parse([*MODEL, hri.options[0], "1.5Ki"])
    cfg = m.parse([*MODEL, "--cuda-graph-config", '{"decode": {"max_bs": 64}}']).values["cuda_graph_config"]
    assert cfg == {"decode": {"max_bs": 64}}
    with pytest.raises(ManifestError, match=r"unknown key 'nope', expected one of \('backend', 'max_bs', 'bs'\)"):
        m.parse([*MODEL, "--cuda-graph-config", '{"decode": {"nope": 1}}'])


# ---------------------------------------------------------------- against the real sglang 0.5.23


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise ValueError(message)


@pytest.fixture(scope="module")
def real_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = _RaisingParser()
    ServerArgs.add_cli_args(parser)
    return parser


def _real_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]


def _choices(choices: Any) -> Any:
    if choices is None:
        return None
    return sorted(choices, key=repr) if isinstance(choices, (set, frozenset)) else list(choices)


@pytest.mark.sglang
def test_shipped_0523_manifest_matches_the_real_parser_flag_for_flag(real_parser) -> None:
    import sglang

    manifest = load("0.5.23")
    actions = _real_actions(real_parser)
    assert sglang.__version__ == manifest.version
    assert len(actions) == len(manifest.flags)
    expected_kind = {
        argparse._StoreAction: "store",
        argparse._StoreTrueAction: "store_true",
        argparse.BooleanOptionalAction: "boolean_optional",
    }
    for action, flag in zip(actions, manifest.flags, strict=True):
        where = action.option_strings[0]
        assert tuple(action.option_strings) == flag.options, where
        assert action.dest == flag.dest, where
        assert action.nargs == flag.nargs, where
        assert normal(action.default) == flag.default, where
        assert normal(_choices(action.choices)) == normal(flag.choices and list(flag.choices)), where
        assert bool(action.required) == flag.required, where
        kind = expected_kind.get(type(action), type(action).__name__)
        if kind in expected_kind.values():
            assert flag.kind == kind, where
        else:  # SGLang's own actions: DeprecatedStoreTrueAction -> deprecated_store_true, ...
            snake = re.sub(r"(?<!^)(?=[A-Z])", "_", kind.removesuffix("Action")).lower()
            assert flag.kind == snake.replace("lo_r_a", "lora"), where
        if action.type is not None:
            assert flag.type is not None, where


@pytest.mark.sglang
def test_rebuilt_parser_has_the_real_parsers_actions(real_parser) -> None:
    rebuilt = load("0.5.23").parser()
    real = {tuple(a.option_strings): a for a in _real_actions(real_parser)}
    ours = {tuple(a.option_strings): a for a in rebuilt._actions if not isinstance(a, argparse._HelpAction)}
    assert real.keys() == ours.keys()
    for key, a in real.items():
        b = ours[key]
        assert (a.dest, a.nargs, a.const, a.metavar, a.help) == (b.dest, b.nargs, b.const, b.metavar, b.help), key
        assert getattr(a.type, "__name__", None) == getattr(b.type, "__name__", None), key


ARGVS = [
    [],
    ["--model-path", "m", "--tp", "8", "--mem-fraction-static", "0.9", "--max-running-requests", "256"],
    ["--model", "m", "--tensor-parallel-size", "4", "--schedule-policy", "lpm", "--enable-metrics"],
    [*MODEL, "--moe-runner-backend", "flashinfer_cutlass", "--cuda-graph-backend-decode", "disabled"],
    [*MODEL, "--cuda-graph-bs-decode", "1", "2", "4", "8", "--cuda-graph-max-bs-decode", "64"],
    [*MODEL, "--cuda-graph-config", '{"decode": {"backend": "full", "max_bs": 32}}'],
    [*MODEL, "--cuda-graph-config", '{"decode": {"tc_compiler": "x"}}'],
    [*MODEL, "--cuda-graph-backend-decode", "tc_piecewise"],
    [*MODEL, "--json-model-override-args", '{"a": 1}', "--lora-paths", "a", '{"lora_name": "b", "lora_path": "c"}'],
    [*MODEL, "--stream-interval", "4", "--chunked-prefill-size", "8192"],
    [*MODEL, "--no-enable-tf32-matmul", "--enable-fused-qk-norm-rope"],
    [*MODEL, "--tp", "eight"],
    [*MODEL, "--schedule-policy", "nope"],
    [*MODEL, "--max-prefill-tokens"],
    [*MODEL, "--fp8-gemm-backend", "cutlass", "--flashinfer-allreduce-fusion-backend", "mnnvl"],
    [*MODEL, "--monokernel-backend", "amd"],
    [*MODEL, "--monokernel-backend", "nvidia"],
    [*MODEL, "--enable-dp-attention", "--dp-size", "2"],
    [*MODEL, "--disable-cuda-graph", "--enable-flashinfer-allreduce-fusion"],
    [*MODEL, "--nsa-decode-backend", "trtllm"],
    [*MODEL, "--t", "2"],
    [*MODEL, "--tp-size=2", "--port=9000"],
    seed_argv(),
    SEED_WITHOUT_NSA,
]


def _real_parse(parser: argparse.ArgumentParser, argv: list[str], caplog) -> tuple[str, Any, list[str]]:
    caplog.clear()
    try:
        ns = parser.parse_args(argv)
    except ValueError as err:
        return "error", str(err), []
    warnings = [_ANSI.sub("", r.getMessage()) for r in caplog.records if "deprecated" in r.getMessage()]
    return "ok", normal(vars(ns)), warnings


@pytest.mark.sglang
def test_rebuilt_parser_agrees_with_the_real_parser(real_parser, caplog: pytest.LogCaptureFixture) -> None:
    manifest = load("0.5.23")
    for argv in ARGVS:
        with caplog.at_level(logging.WARNING):
            status, real, real_warnings = _real_parse(real_parser, argv, caplog)
        try:
            result = manifest.parse(argv)
        except ManifestError as err:
            assert (status, real) == ("error", str(err)), argv
            continue
        assert status == "ok", (argv, real)
        assert normal(result.values) == real, argv
        # The real parser warns for action-level deprecations; help-only ones warn after parsing.
        action_warnings = [w for w in result.warnings if w.startswith("'")]
        assert action_warnings == real_warnings, argv


# ---------------------------------------------------------------- live()


@pytest.mark.sglang
def test_live_on_this_python_equals_the_shipped_0523_manifest() -> None:
    assert live(sys.executable) == load("0.5.23")


def test_live_through_a_runner_uses_its_output() -> None:
    seen: list[tuple[list[str], str]] = []
    shipped = Path(__file__).resolve().parents[2] / "search" / "manifests" / "sglang-0.5.9.json"

    def remote(argv: list[str], stdin: str) -> str:
        seen.append((argv, stdin))
        return shipped.read_text()

    assert live("/opt/remote/python3", run=remote) == load("0.5.9")
    assert seen[0][0] == ["/opt/remote/python3", "-"]
    assert "ServerArgs.add_cli_args" in seen[0][1] and "import search" not in seen[0][1]
    with pytest.raises(BadInput, match="did not print a flag manifest"):
        live("/opt/remote/python3", run=lambda argv, stdin: "bash: python3: command not found\n")


def test_live_on_a_missing_python_is_a_clear_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"not found: give --python"):
        live(str(tmp_path / "nope" / "python3"))


def test_live_on_a_python_without_sglang_is_a_clear_bad_input(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    with pytest.raises(BadInput, match=r"cannot build SGLang's parser \(cannot import sglang.*install sglang"):
        live(str(tmp_path / "venv" / "bin" / "python"))
