"""Flags, startup log and failures of the emulator, read from its real log and exit code."""

from __future__ import annotations

import re
import time

from tests.emulator.conftest import TUNED, client


def test_unknown_flag_and_bad_choice_exit_2_with_argparse_message(start) -> None:
    unknown = start(["--model-path", "m", "--no-such-flag", "1"])
    assert unknown.wait_exit() == 2
    assert "usage: " in unknown.text() and "error: unrecognized arguments: --no-such-flag 1" in unknown.text()
    bad = start(["--model-path", "m", "--moe-runner-backend", "nope"])
    assert bad.wait_exit() == 2
    assert "argument --moe-runner-backend: invalid choice: 'nope'" in bad.text()


def test_nsa_flags_parse_on_0_5_9_but_not_0_5_23(start) -> None:
    args = [*TUNED, "--nsa-decode-backend", "trtllm"]
    assert start(args).wait_exit() == 2
    old = start(args, SEARCH_EMULATOR_SGLANG_VERSION="0.5.9")
    old.wait_ready()


def _order(text: str, needles: list[str]) -> None:
    """Each needle occurs after the previous one."""
    at = 0
    for needle in needles:
        found = text.find(needle, at)
        assert found >= 0, f"{needle!r} missing after position {at}:\n{text[at:at + 2000]}"
        at = found + len(needle)


def test_startup_log_order_0_5_23(start) -> None:
    server = start([*TUNED[:-3], "--enable-metrics"], SGLANG_LOG_MS="1")  # graphs on, cutlass autotunes natively
    server.wait_ready()
    text = server.text()
    _order(text, ["server_args=ServerArgs(", "TP0] Init torch distributed begin.", "TP0] Load weight begin.",
                  "Loading safetensors checkpoint shards: 100% Completed | 83/83", "Load weight end. elapsed=",
                  "KV Cache is allocated. #tokens:", "Memory pool end.", "Running FlashInfer autotune with cache: ",
                  "FlashInfer autotune completed.", "Capture target decode cuda graph begin.",
                  "Capture target decode cuda graph end. bs=[1, 2, 4, 8,", "max_total_num_tokens=", "Started server process",
                  "Uvicorn running on", "#pending-token: 0",
                  "The server is fired up and ready to roll!"])
    assert all(f"TP{r}] Load weight end." in text for r in range(8))
    assert "Capture cuda graph bs" not in text  # 0.5.23 puts the sizes into the end line
    assert text.count("Loading safetensors checkpoint shards:") == 83
    assert '"GET /model_info HTTP/1.1" 200' in text and '"POST /generate HTTP/1.1" 200' in text
    assert any(line.startswith("[") and line[20] == "." for line in text.splitlines() if "TP3]" in line)


def test_startup_log_wording_0_5_9_and_deprecated_flag_warns(start) -> None:
    server = start(TUNED, SEARCH_EMULATOR_SGLANG_VERSION="0.5.9")
    server.wait_ready()
    text = server.text()
    _order(text, ["Init torch distributed ends. elapsed=", "Load weight end. elapsed=", "dtype=torch.bfloat16",
                  "Running FlashInfer autotune...", "FlashInfer autotune completed.", "max_total_num_tokens="])
    assert "cuda graph begin" not in text  # --disable-cuda-graph
    new = start(TUNED)  # 0.5.23: --disable-cuda-graph is deprecated but works
    new.wait_ready()
    assert "'--disable-cuda-graph' is deprecated" in new.text() and "cuda graph begin" not in new.text()
    old = start(["--model-path", "m", "--tp", "8"], SEARCH_EMULATOR_SGLANG_VERSION="0.5.8.post1")
    old.wait_ready()
    assert "Init torch distributed ends. mem usage=" in old.text() and "Running FlashInfer autotune" not in old.text()
    assert "Capture cuda graph begin. This can take up to several minutes." in old.text()


def _crashes(server, phase_line: str, error: str,
             sigquit: str = "Received sigquit from a child process. It usually means the child failed.") -> None:
    assert server.wait_exit() != 0
    text = server.text()
    _order(text, [phase_line, "] Scheduler hit an exception: Traceback (most recent call last):", error, sigquit])
    assert re.search(r" TP\d\] Scheduler hit an exception", text)
    assert "fired up" not in text


def test_each_failure_kind(start) -> None:
    fusion = start(["--model-path", "m", "--tp", "8", "--enable-flashinfer-allreduce-fusion"])
    oom = start(["--model-path", "m", "--tp", "8", "--mem-fraction-static", "0.95"])
    ninja = start(["--model-path", "m", "--tp", "8", "--moe-runner-backend", "flashinfer_trtllm"])
    mxfp4 = start(["--model-path", "m", "--tp", "8", "--moe-runner-backend", "flashinfer_mxfp4"])
    kv = start(["--model-path", "m", "--tp", "8", "--mem-fraction-static", "0.3"])
    _crashes(fusion, "cuda graph begin", "Exception: Capture cuda graph failed: No supported CUDA architectures "
                                         "found for major versions [9, 10].")
    _crashes(oom, "cuda graph begin", "Exception: Capture cuda graph failed: CUDA out of memory.")
    _crashes(ninja, "Running FlashInfer autotune", "subprocess.CalledProcessError: Command '['ninja', '-v'")
    _crashes(mxfp4, "Running FlashInfer autotune", "does not support SM120")
    _crashes(kv, "Load weight end", "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.")


def test_hang_stops_logging_and_never_gets_ready(start) -> None:
    server = start(TUNED, NCCL_NVLS_ENABLE="1")
    server.wait_for("TP7] Load weight begin.")
    time.sleep(1.5)  # the whole startup takes well under a second at this time scale
    text = server.text()
    assert server.proc.poll() is None and "Loading safetensors" not in text and "fired up" not in text
    assert server.text() == text  # silent


def test_warmup_failure_after_uvicorn(start) -> None:
    server = start([*TUNED, "--mem-fraction-static", "0.97"])
    _crashes(server, "Uvicorn running on", "torch.OutOfMemoryError: CUDA out of memory.",
             "SIGQUIT received. signum=None, frame=None. It usually means one child failed.")


def test_health_is_503_until_ready(start) -> None:
    server = start(TUNED, NCCL_NVLS_ENABLE="1")
    server.wait_for("Load weight begin")
    ok = start(TUNED)
    ok.wait_ready()
    with client(ok) as c:
        assert c.get("/health").status_code == 200 and c.get("/health_generate").status_code == 200


def test_health_503_while_warmup_runs_and_single_gpu_lines_carry_no_rank_tag(start, tmp_path) -> None:
    landscape = tmp_path / "warmup_hang.py"
    landscape.write_text("def startup(flags, env):\n    return {'phase': 'warmup', 'hang': True}\n\n"
                         "def throughput(flags, env, running):\n    return 10.0 * running\n")
    server = start(["--model-path", "m", "--tp", "1"], SEARCH_EMULATOR_LANDSCAPE=str(landscape))
    server.wait_for("Uvicorn running on")
    with client(server) as c:
        deadline = time.monotonic() + 10
        while "GET /model_info" not in server.text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.get("/model_info").status_code == 200  # uvicorn is up: not a readiness signal
        assert c.get("/health").status_code == 503 and c.get("/health_generate").status_code == 503
        info = c.get("/server_info").json()
        assert info["internal_states"][0].keys() >= {"last_gen_throughput", "memory_usage",
                                                      "effective_max_running_requests_per_dp"}
        assert info["version"] == "0.5.23" and info["max_total_num_tokens"] > 0
        model = c.get("/v1/models").json()
        assert model["object"] == "list" and model["data"][0]["id"] == "m"
        assert model["data"][0]["object"] == "model" and model["data"][0]["max_model_len"] > 0
    text = server.text()
    assert "] Load weight end." in text and " TP0]" not in text  # SGLang tags TPn only when tp > 1
