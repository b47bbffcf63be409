"""Flags, startup log and failures of the emulator, read from its real log and exit code."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time

import httpx
import pytest

from search.emulator import gpu_state
from tests.emulator.conftest import TUNED, client
from tests.helpers import MARKER_ENV, marker_pids


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
    """Real 0.5.23 order and wording (search/emulator/templates.yaml holds each line's source):
    bootstrap.py's init parallel and memory baseline, the multi-thread loader, the KV pool, the
    eager runner's autotune inside init_cuda_graphs, prefill then decode capture, the scheduler's
    summary, uvicorn, the warmup request and _freeze_gc_after_server_warmup."""
    server = start([*TUNED[:-3], "--enable-metrics"], SGLANG_LOG_MS="1")  # graphs on, cutlass autotunes natively
    server.wait_ready()
    text = server.text()
    _order(text, ["server_args=ServerArgs(", "TP0] Init parallel begin.", "TP0] Init parallel ends. elapsed=",
                  "TP0] Memory baseline taken. mem usage=", "TP0] Load weight begin.",
                  "Multi-thread loading shards: 100% Completed | 83/83", "Load weight end. elapsed=",
                  "quant=modelopt_fp4, avail mem=", "KV Cache is allocated. dtype: torch.bfloat16, #tokens:",
                  "Memory pool end.", "Running FlashInfer autotune with cache: ",
                  " - INFO - autotuner.py:1048 - flashinfer.jit: [Autotuner]: Autotuning process starts ...",
                  "FlashInfer autotune completed.", "Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[",
                  "Capturing prefill shape (num_tokens=", "Capture target prefill CUDA graph end. elapsed=",
                  "Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1,", "Capturing batches (bs=",
                  "Capture target decode CUDA graph end. bs=[1, 2, 4, 8,", "max_total_num_tokens=", "Started server process",
                  "Uvicorn running on", "#pending-token: 0", "The server is fired up and ready to roll!"])
    assert all(f"TP{r}] Load weight end." in text for r in range(8))
    assert "Capture cuda graph bs" not in text and "Init torch distributed" not in text
    assert "Using KV cache dtype" not in text  # gone in 0.5.23
    assert text.count("Multi-thread loading shards:") == 85  # tqdm draws 0/83 first and 83/83 again at close
    for request in ('"GET /model_info HTTP/1.1" 200', '"POST /generate HTTP/1.1" 200', '"POST /freeze_gc HTTP/1.1" 200'):
        assert request in text
    assert any(line.startswith("[") and line[20] == "." for line in text.splitlines() if "TP3]" in line)
    # uvicorn's own format has no milliseconds, whatever SGLANG_LOG_MS says
    assert all(re.match(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] INFO: ", line)
               for line in text.splitlines() if "Uvicorn running on" in line)


def test_startup_log_wording_0_5_9_and_deprecated_flag_warns(start) -> None:
    server = start(TUNED, SEARCH_EMULATOR_SGLANG_VERSION="0.5.9")
    server.wait_ready()
    text = server.text()
    _order(text, ["Init torch distributed ends. elapsed=", "Load weight end. elapsed=", "dtype=torch.bfloat16",
                  "Running FlashInfer autotune...", "FlashInfer autotune completed.", "max_total_num_tokens="])
    assert "cuda graph begin" not in text  # --disable-cuda-graph
    new = start(TUNED)  # 0.5.23: --disable-cuda-graph is deprecated but works
    new.wait_ready()
    assert "'--disable-cuda-graph' is deprecated" in new.text() and "CUDA graph begin" not in new.text()
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
    _crashes(fusion, "decode CUDA graph begin", "Exception: Capture cuda graph failed: No supported CUDA architectures "
                                         "found for major versions [9, 10].")
    _crashes(oom, "decode CUDA graph begin", "Exception: Capture cuda graph failed: CUDA out of memory.")
    # FlashInfer's JIT refuses the SM100-only trtllm-gen MoE kernels on SM120 (compilation_context.py:163)
    _crashes(ninja, "Running FlashInfer autotune", "RuntimeError: No supported CUDA architectures found for major "
                                                   "versions [10].")
    _crashes(mxfp4, "Running FlashInfer autotune", "RuntimeError: No supported CUDA architectures found for major "
                                                   "versions [10].")
    _crashes(kv, "Load weight end", "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.")


def test_hang_stops_logging_and_never_gets_ready(start) -> None:
    server = start(TUNED, NCCL_NVLS_ENABLE="1")
    server.wait_for("TP7] Load weight begin.")
    time.sleep(1.5)  # the whole startup takes well under a second at this time scale
    text = server.text()
    assert server.proc.poll() is None and "loading shards" not in text and "fired up" not in text
    assert server.text() == text  # silent


def test_warmup_failure_after_uvicorn(start) -> None:
    server = start([*TUNED, "--mem-fraction-static", "0.97"])
    _crashes(server, "Uvicorn running on", "torch.OutOfMemoryError: CUDA out of memory.",
             "SIGQUIT received. signum=None, frame=None. It usually means one child failed.")


def test_taken_port_fails_the_warmup_and_kills_the_ranks(start) -> None:
    """uvicorn cannot bind, so SGLang's warmup thread (joined at lifespan shutdown) never reaches
    /model_info: after its tries it logs so and SIGKILLs its process tree, ranks first."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        marker = f"taken-port-{port}"
        server = start(["--model-path", "m", "--tp", "4", "--port", str(port)], SEARCH_EMULATOR_TIME_SCALE="0.001",
                       **{MARKER_ENV: marker})
        assert server.wait_exit() == -signal.SIGKILL
    text = server.text()
    bind = text.index(f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): "
                      "address already in use")
    failed = text.index("] Initialization failed. warmup error: Traceback (most recent call last):")
    assert bind < text.index("INFO:     Waiting for application shutdown.") < failed
    assert "Application shutdown complete." not in text
    assert f"HTTPConnectionPool(host='127.0.0.1', port={port}): Max retries exceeded with url: /model_info" in text
    assert not marker_pids(marker)  # the ranks went with it


def test_no_http_while_loading_then_health_200_when_ready(start) -> None:
    """SGLang starts uvicorn only once every scheduler reported ready (http_server.launch_server),
    so a server hung in loading answers nothing at all, not 503; 503 is for the warmup (below)."""
    server = start(TUNED, NCCL_NVLS_ENABLE="1")
    server.wait_for("TP7] Load weight begin")
    with client(server) as c:
        for path in ("/health", "/health_generate", "/model_info"):
            with pytest.raises(httpx.ConnectError):
                c.get(path)
    assert server.proc.poll() is None
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


def test_graph_outcome_with_graphs_off_is_refused_not_ignored(start, small_landscape) -> None:
    """A landscape that crashes or hangs a config in graph capture while the flags turn decode graphs
    off (SGLang would never capture) is told so; the flags resolve with SGLang's precedence."""
    crash = json.dumps({"phase": "cuda_graph", "error": "Exception: Capture cuda graph failed: boom"})
    hang = json.dumps({"phase": "cuda_graph", "hang": True})
    off = (["--disable-cuda-graph"], ["--cuda-graph-backend-decode", "disabled"],
           ["--cuda-graph-config", '{"decode": {"backend": "disabled"}}'])
    refused = [start(["--model-path", "m", *flags], EMULATOR_TEST_OUTCOME=outcome, **small_landscape)
               for flags in off for outcome in (crash, hang)]
    # The per-phase backend flag beats --disable-cuda-graph, the JSON config beats both.
    backend = start(["--model-path", "m", "--tp", "2", "--disable-cuda-graph", "--cuda-graph-backend-decode", "full"],
                    EMULATOR_TEST_OUTCOME=crash, **small_landscape)
    config = start(["--model-path", "m", "--tp", "2", "--cuda-graph-backend-decode", "disabled",
                    "--cuda-graph-config", '{"decode": {"backend": "breakable"}}'],
                   EMULATOR_TEST_OUTCOME=crash, **small_landscape)
    for server in refused:
        assert server.wait_exit() == 2
        text = server.text()
        assert "startup() puts a" in text and "in phase 'cuda_graph', but these flags turn decode CUDA graphs off" \
            in text and "server_args=" not in text, text[-2000:]
    _crashes(backend, "Capture target decode CUDA graph begin. backend=full,", "Capture cuda graph failed: boom")
    _crashes(config, "Capture target decode CUDA graph begin. backend=breakable,", "Capture cuda graph failed: boom")


def test_loading_crash_comes_part_way_through_the_shards(start, small_landscape) -> None:
    error = "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"
    server = start(["--model-path", "m", "--tp", "2"], EMULATOR_TEST_OUTCOME=json.dumps({"phase": "loading",
                   "error": error}), SEARCH_EMULATOR_SGLANG_VERSION="0.5.9", **small_landscape)
    _crashes(server, "Load weight begin", error)
    text = server.text()
    before = text[:text.index("Scheduler hit an exception")]
    loaded = [int(n) for n in re.findall(r"Loading safetensors checkpoint shards: +\d+% Completed \| (\d+)/83", before)]
    assert loaded and 0 < max(loaded) <= 41, loaded  # some shards, then the failure half-way
    assert "Load weight end" not in text


def test_memory_balance_check_as_sglang_does_it(start, small_landscape, tmp_path) -> None:
    """GPU 1 is held by another process with 90,000 MiB. SGLang all-reduces the least free memory
    and every rank with more than 1/0.9 of it raises: the rank on the free GPU, not the one on the
    occupied GPU, which goes on and runs out of memory loading. With the check off (here through
    0.5.9's verbatim copy of the old variable SGL_DISABLE_... onto SGLANG_ENABLE_...) the text is
    logged and the start goes on; one GPU is never checked."""
    state = tmp_path / "held"
    fd = gpu_state.try_lock(state, 1)
    assert fd is not None
    gpu_state.write(state, gpu_state.GpuState(index=1, pid=os.getpid(), memory_used_mib=90000))
    shared = {**small_landscape, "SEARCH_EMULATOR_STATE_DIR": str(state)}
    try:
        # One after another: each reads the state its predecessor's ranks left on GPU 0.
        checked = start(["--model-path", "m", "--tp", "2"], **shared)
        assert checked.wait_exit() != 0
        warned = start(["--model-path", "m", "--tp", "2"], SEARCH_EMULATOR_SGLANG_VERSION="0.5.9",
                       SGL_DISABLE_TP_MEMORY_INBALANCE_CHECK="false", **shared)
        assert warned.wait_exit() != 0
        single = start(["--model-path", "m", "--base-gpu-id", "1"], **shared)
        assert single.wait_exit() != 0
    finally:
        os.close(fd)
    least, local = (97887 - 90000) / 1024, (97887 - 2) / 1024
    values = f"local_gpu_memory={local!r}, local_gpu_memory * 0.9={local * 0.9!r}"
    unbalanced = "The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
    text = checked.text()
    raised = re.findall(r"TP(\d)\] Scheduler hit an exception: Traceback[^[]*?RuntimeError: The memory capacity "
                        r"is unbalanced", text)
    assert raised == ["0"], text[-3000:]
    _order(text, ["in _check_tp_memory_balance", f"RuntimeError: {unbalanced}pre_model_load_memory={least!r}, {values}",
                  "Received sigquit from a child process."])
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.30 GiB. GPU 1 has a total capacity of "
           "95.59 GiB of which ")
    text = warned.text()
    assert f"TP0] {unbalanced}min_per_gpu_memory={least!r}, {values}\n" in text
    _order(text, ["TP1] Load weight begin. avail mem=7.12", "TP1] Scheduler hit an exception", oom,
                  f"Process {os.getpid()} has 87.89 GiB memory in use."])
    assert "TP0] Scheduler hit an exception" not in text and "TP1] The memory capacity" not in text
    text = single.text()
    assert "unbalanced" not in text and "Tried to allocate 2.59 GiB. GPU 1 has" in text, text[-2000:]


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_progress_bars_are_written_as_tqdm_writes_them(start, small_landscape, version: str) -> None:
    """tqdm to a file that is no terminal: each redraw starts with a carriage return, the line ends
    when the bar closes. SGLang's shard BAR_FORMAT ended in a newline up to 0.5.9 (one line per
    redraw and an empty one at the end); 0.5.23 dropped it. Read raw: no line splitting here."""
    server = start(["--model-path", "m"], SEARCH_EMULATOR_SGLANG_VERSION=version, **small_landscape)
    server.wait_ready()
    raw = server.log_path.read_bytes().decode()
    begin = raw.index("\n", raw.index("] Load weight begin.")) + 1
    shards = raw[begin:raw.index("\n[", begin) + 1]  # up to the next log line (tp 1: one writer)
    # each version's default loader: weight_utils.py's desc (templates.yaml `shards_desc`)
    desc = "Loading safetensors checkpoint shards:" if version == "0.5.9" else "Multi-thread loading shards:"
    if version == "0.5.9":
        assert shards.endswith("\n\n") and shards.count("\n") == 86
        draws = shards[:-1].split("\n")[:-1]
        assert all(d.startswith("\r") for d in draws)
        draws = [d[1:] for d in draws]
    else:
        assert shards.endswith("\n") and shards.count("\n") == 1 and shards.startswith("\r")
        draws = shards[1:-1].split("\r")
    assert len(draws) == 85
    assert draws[0] == f"{desc}   0% Completed | 0/83 [00:00<?, ?it/s]"
    assert draws[1] == f"{desc}   1% Completed | 1/83 [00:00<00:01, 50.00it/s]"
    assert draws[-1] == draws[-2] == f"{desc} 100% Completed | 83/83 [00:01<00:00, 50.00it/s]"

    start_at = raw.index("\r  0%|          | 0/4 [00:00<?, ?it/s]")
    end_at = raw.index("\n", start_at)
    assert raw[end_at + 1] == "["  # the bar's only newline is its close; a log line follows
    draws = raw[start_at + 1:end_at].split("\r")
    assert len(draws) == 10  # the empty bar, then per batch size: its description, its update; the close
    mem = r"avail_mem=-?\d+\.\d\d GB"  # the built-in GLM-5 weights overfill one GPU: tp 1 reads negative
    for i, (bs, done) in enumerate([(8, 0), (8, 1), (4, 1), (4, 2), (2, 2), (2, 3), (1, 3), (1, 4), (1, 4)], start=1):
        bar = "█" * (10 * done // 4) + ("▌" if done % 2 else "")
        rate = r"\?it/s" if done == 0 else r"100\.00it/s"
        left = "?" if done == 0 else "00:00"
        assert re.fullmatch(rf"Capturing batches \(bs={bs} {mem}\): +{100 * done // 4}%\|{bar} *\| {done}/4 "
                            rf"\[00:00<{re.escape(left)}, {rate}\]", draws[i]), (i, draws[i])
