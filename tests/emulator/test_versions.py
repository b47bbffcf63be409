"""Per SGLang version: the flags the emulator takes (its manifest's, no more, no less) and the
wording of the periodic Prefill/Decode lines (../shared/reference/sglang.md sections 1 and 2)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from search import manifests
from search.command import parse_command
from tests.emulator.conftest import client

SEED_COMMAND = parse_command((Path(__file__).parents[1] / "fixtures" / "seed_command.txt").read_text())


def _logged_dests(text: str) -> list[str]:
    """The keyword names of the logged `server_args=ServerArgs(...)` call, in order."""
    line = next(line for line in text.splitlines() if "] server_args=ServerArgs(" in line)
    call = ast.parse(line[line.index("ServerArgs("):], mode="eval").body
    assert isinstance(call, ast.Call)
    return [k.arg for k in call.keywords if k.arg]


@pytest.mark.parametrize("version", manifests.SHIPPED)
def test_server_args_hold_exactly_the_manifest_dests(start, small_landscape, version: str) -> None:
    server = start(["--model-path", "m"], SEARCH_EMULATOR_SGLANG_VERSION=version, **small_landscape)
    server.wait_for("] server_args=ServerArgs(")
    server.stop()
    dests = _logged_dests(server.text())
    assert len(dests) == len(set(dests))
    assert set(dests) == {f.dest for f in manifests.load(version).flags}


def test_seed_command_refused_on_0_5_8_and_0_5_23_accepted_on_0_5_9(start) -> None:
    env = {**SEED_COMMAND.env, "SEARCH_EMULATOR_TIME_SCALE": "0.001"}
    old = start(SEED_COMMAND.args, SEARCH_EMULATOR_SGLANG_VERSION="0.5.8.post1", **env)
    new = start(SEED_COMMAND.args, SEARCH_EMULATOR_SGLANG_VERSION="0.5.23", **env)
    seed = start(SEED_COMMAND.args, SEARCH_EMULATOR_SGLANG_VERSION="0.5.9", **env)
    assert old.wait_exit() == 2 and new.wait_exit() == 2
    assert ("error: argument --nsa-decode-backend: invalid choice: 'trtllm' (choose from 'flashmla_sparse', "
            "'flashmla_kv', 'flashmla_auto', 'fa3', 'tilelang', 'aiter')") in old.text()
    assert "error: unrecognized arguments: --nsa-decode-backend trtllm --nsa-prefill-backend trtllm" in new.text()
    seed.wait_for("] server_args=ServerArgs(")
    seed.stop()
    assert "model_path='lukealonso/GLM-5-NVFP4'" in seed.text() and "nsa_decode_backend='trtllm'" in seed.text()


# What each version's scheduler_metrics_mixin / metrics_reporter writes (the small landscape has
# graphs on; 0.5.9 prefill batches run without graphs unless piecewise ones are enabled, 0.5.23
# captures breakable prefill graphs by default).
NUMBER = r"\d+(?:\.\d+)?"
LINES = {
    "0.5.8.post1": (rf"Prefill batch, #new-seq: 1, #new-token: \d+, #cached-token: 0, token usage: {NUMBER}, "
                    rf"#running-req: \d+, #queue-req: \d+, $",
                    rf"Decode batch, #running-req: \d+, #token: \d+, token usage: {NUMBER}, cuda graph: True, "
                    rf"gen throughput \(token/s\): {NUMBER}, #queue-req: \d+, $"),
    "0.5.9": (rf"Prefill batch, #new-seq: 1, #new-token: \d+, #cached-token: 0, token usage: {NUMBER}, "
              rf"#running-req: \d+, #queue-req: \d+, input throughput \(token/s\): {NUMBER}, cuda graph: False$",
              rf"Decode batch, #running-req: \d+, #token: \d+, token usage: {NUMBER}, cuda graph: True, "
              rf"gen throughput \(token/s\): {NUMBER}, #queue-req: \d+$"),
    "0.5.23": (rf"Prefill batch, #new-seq: 1, #new-token: \d+, #cached-token: 0, token usage: {NUMBER}, "
               rf"#running-req: \d+, #queue-req: \d+, #pending-token: 0, cuda graph: True, "
               rf"input throughput \(token/s\): {NUMBER}$",
               rf"Decode batch, #running-req: \d+, #token: \d+, token usage: {NUMBER}, cuda graph: True, "
               rf"gen throughput \(token/s\): {NUMBER}, #queue-req: \d+$"),
}


@pytest.mark.parametrize("version", manifests.SHIPPED)
def test_prefill_and_decode_lines_in_the_version_wording(start, small_landscape, version: str) -> None:
    server = start(["--model-path", "m", "--decode-log-interval", "1"], SEARCH_EMULATOR_SGLANG_VERSION=version,
                   **small_landscape)
    server.wait_ready()
    with client(server) as c:
        c.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}})
    lines = [line.split("] ", 1)[1] for line in server.text().splitlines()
             if re.match(r"\[[^]]+\] (Prefill|Decode) batch", line)]
    prefill, decode = LINES[version]
    assert [line for line in lines if line.startswith("Prefill")] and [line for line in lines if line.startswith("Decode")]
    for line in lines:
        assert re.fullmatch(prefill if line.startswith("Prefill") else decode, line), (version, line)


@pytest.mark.parametrize(("version", "args", "autotunes"), [
    # 0.5.23 autotunes the FP4 GEMM of a modelopt_fp4 model (flashinfer_autotune.py:135; `auto` is
    # flashinfer_cutlass on SM120, fp4_utils.py:154), whatever the MoE backend; 0.5.9 only MoE runners.
    ("0.5.23", [], True),
    ("0.5.23", ["--fp4-gemm-backend", "marlin"], False),
    ("0.5.23", ["--disable-flashinfer-autotune"], False),
    ("0.5.9", [], False),
    ("0.5.9", ["--moe-runner-backend", "flashinfer_trtllm"], True),
])
def test_autotune_follows_each_versions_rule(tmp_path: Path, version: str, args: list[str], autotunes: bool) -> None:
    from search.emulator.config import Settings
    from search.emulator.landscape import Landscape
    from search.emulator.launch import parse_flags, plan

    path = tmp_path / "plain.py"  # no phase_seconds: SGLang's own rule decides
    path.write_text("def startup(flags, env):\n    return None\n\ndef throughput(flags, env, running):\n    return 1.0\n")
    settings = Settings.from_env({"SEARCH_EMULATOR_SGLANG_VERSION": version, "SEARCH_EMULATOR_STATE_DIR": str(tmp_path)})
    flags = parse_flags(version, ["--model-path", "m", *args])
    assert plan(settings, flags, {}, Landscape.load(path))["autotune"] is autotunes


@pytest.mark.parametrize(("value", "ms"), [("1", True), ("Yes", True), ("TRUE", True), ("0", False), ("n", False),
                                           ("", False), ("maybe", False)])
def test_sglang_log_ms_is_read_as_envbool(value: str, ms: bool) -> None:
    """environ.py EnvBool: true/1/yes/y and false/0/no/n in any case; other values keep the default."""
    from search.emulator.launch import env_bool

    assert env_bool({"SGLANG_LOG_MS": value}, "SGLANG_LOG_MS", False) is ms


@pytest.mark.parametrize(("version", "args", "autotunes"), [
    ("0.5.23", [], True),  # modelopt_fp4, --fp4-gemm-backend auto: the FP4 GEMM autotune
    ("0.5.23", ["--fp4-gemm-backend", "flashinfer_cudnn"], False),
    ("0.5.23", ["--disable-flashinfer-autotune"], False),
    ("0.5.9", [], False),
])
def test_seed_landscape_autotunes_the_fp4_gemm_on_0_5_23(tmp_path: Path, version: str, args: list[str],
                                                          autotunes: bool) -> None:
    """The built-in landscape follows 0.5.23's rule (flashinfer_autotune.py:135): the modelopt_fp4
    model's GEMM is autotuned even with a MoE backend that is not."""
    from search.emulator.config import Settings
    from search.emulator.landscape import Landscape
    from search.emulator.launch import parse_flags, plan

    settings = Settings.from_env({"SEARCH_EMULATOR_SGLANG_VERSION": version, "SEARCH_EMULATOR_STATE_DIR": str(tmp_path)})
    flags = parse_flags(version, ["--model-path", "m", "--tp", "8", "--moe-runner-backend", "triton", *args])
    the_plan = plan(settings, flags, {}, Landscape.load(None))
    assert the_plan["autotune"] is autotunes
    assert (the_plan["seconds"]["autotune"] > 0) is autotunes


@pytest.mark.parametrize(("version", "extra", "desc"), [
    ("0.5.23", None, "Multi-thread loading shards"),  # loader.py:613, default true
    ("0.5.23", '{"enable_multithread_load": false}', "Loading safetensors checkpoint shards"),
    ("0.5.9", None, "Loading safetensors checkpoint shards"),  # loader.py:479, default false
    ("0.5.9", '{"enable_multithread_load": true}', "Multi-thread loading shards"),
    ("0.5.8.post1", '{"enable_multithread_load": true}', "Multi-thread loading shards"),
])
def test_model_loader_extra_config_picks_the_loader_bar(tmp_path: Path, version: str, extra: str | None,
                                                        desc: str) -> None:
    from search.emulator.config import Settings
    from search.emulator.landscape import Landscape
    from search.emulator.launch import parse_flags, plan
    from search.emulator.logs import WORDING

    settings = Settings.from_env({"SEARCH_EMULATOR_SGLANG_VERSION": version, "SEARCH_EMULATOR_STATE_DIR": str(tmp_path)})
    args = ["--model-path", "m", "--tp", "8"] + (["--model-loader-extra-config", extra] if extra else [])
    the_plan = plan(settings, parse_flags(version, args), {}, Landscape.load(None))
    assert WORDING[version][the_plan["shards_desc"]] == desc


def test_skip_server_warmup_sends_no_warmup_and_fails_at_the_first_request(start, small_landscape) -> None:
    """http_server.py _wait_and_warmup: with --skip-server-warmup the server is ready without the
    GET /model_info and POST /generate; a forward that fails does so at the first request."""
    import httpx



    server = start(["--model-path", "m", "--skip-server-warmup"], **small_landscape)
    server.wait_ready()
    head = server.text().split("The server is fired up")[0]
    assert "GET /model_info" not in head and "POST /generate" not in head
    with client(server) as c:
        assert c.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}).status_code == 200
    failing = start(["--model-path", "m", "--tp", "2", "--skip-server-warmup"], **small_landscape,
                    EMULATOR_TEST_OUTCOME='{"phase": "warmup", "error": "RuntimeError: boom"}')
    failing.wait_ready()
    try:
        with client(failing) as c:
            c.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}})
    except httpx.HTTPError:
        pass
    assert failing.wait_exit() != 0
    assert "RuntimeError: boom" in failing.text()


def test_piecewise_capture_of_0_5_9_comes_after_decode_capture(start, small_landscape) -> None:
    """0.5.9 ModelRunner.initialize: init_device_graphs, then init_piecewise_cuda_graphs (opt-in)."""
    from search.logwatch import LogClassifier

    server = start(["--model-path", "m", "--enable-piecewise-cuda-graph"], SEARCH_EMULATOR_SGLANG_VERSION="0.5.9",
                   **small_landscape)
    server.wait_ready()
    text = server.text()
    assert text.index("Capture cuda graph end.") < text.index("Capture piecewise CUDA graph begin. avail mem=") \
        < text.index("Capturing num tokens (num_tokens=") < text.index("Capture piecewise CUDA graph end. Time elapsed:")
    head = text[:text.index("Capturing num tokens (")]
    classifier = LogClassifier("0.5.9")
    for line in head.splitlines():
        classifier.feed(line)
    assert classifier.phase == "cuda_graph" and classifier.failure is None
