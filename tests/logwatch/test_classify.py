"""The classifier on real SGLang text and on each version's wording (tests/fixtures/logs)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from search.errors import BadInput
from search.lifecycle import Failure
from search.logwatch import FAILURES, PHASES, LogClassifier, classify_file, describe, read_log, signature_version

FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs"
EXPECTED = yaml.safe_load((FIXTURES / "expected.yaml").read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_verdict(name: str) -> None:
    want = EXPECTED[name]
    classifier = read_log(FIXTURES / name)
    assert classifier.summary() == {k: want[k] for k in ("phase", "failure", "line", "progress")}
    if want["failure"]:
        assert classifier.failure.phase == want["failure_phase"]


def test_fixtures_cover_every_phase_family_and_failure_kind() -> None:
    kinds = {v["failure"] for v in EXPECTED.values()} - {None}
    # stall by timer is exercised in test_check_stall; every other kind has a real log
    assert kinds == set(FAILURES)
    assert {name.split("_")[0] for name in EXPECTED if name.startswith("versions/")} == {
        "versions/v0.5.8.post1", "versions/v0.5.9", "versions/v0.5.23"}


def test_each_version_family_reads_its_own_wording_only() -> None:
    assert classify_file(FIXTURES / "versions/v0.5.23_ready.log", "0.5.23")["phase"] == "ready"
    # 0.5.9 wording has no "Capture <role> decode CUDA graph begin" (0.5.23's
    # model_runner_components/cuda_graph_setup.py:759): that line is not a phase there
    line = ("[2026-03-01 09:00:40 TP0] Capture target decode CUDA graph begin. backend=full, "
            "num_tokens_per_req=1, avail mem=20.00 GB")
    c = LogClassifier("0.5.9")
    c.feed(line)
    assert c.phase == "starting"
    c = LogClassifier("0.5.23")
    c.feed(line)
    assert c.phase == "cuda_graph"
    with pytest.raises(BadInput, match="0.4.0"):
        LogClassifier("0.4.0")


def test_events_stream_in_order_with_progress() -> None:
    c = LogClassifier()
    events = [e for line in (FIXTURES / "versions/v0.5.8.post1_ready.log").open() for e in c.feed(line)]
    assert [e.name for e in events if e.kind == "phase"] == list(PHASES)
    assert [e.progress for e in events if e.kind == "progress"] == [0.0, 54.0, 100.0]
    assert not [e for e in events if e.kind == "failure"]
    assert set(c.phase_times) == set(PHASES)


@pytest.mark.parametrize(
    "line",
    [
        "[2026-02-19 05:48:17 TP2] Load weight begin. avail mem=90 GB",
        "[2026-02-19 05:48:17.123 DP0 TP3 EP3] Load weight begin. avail mem=90 GB",
        "\x1b[33m[2026-02-19 05:48:17] WARNING model_runner.py:12: Load weight begin. avail mem=90 GB\x1b[0m",
        "(SGLangEngine pid=7, ip=10.0.0.2) [2026-02-19 05:48:17 TP0] Load weight begin. [repeated 7x across cluster]",
        "[05:48:17 TP0] Load weight begin. avail mem=90 GB",
    ],
)
def test_prefix_variants(line: str) -> None:
    c = LogClassifier()
    c.feed(line)
    assert c.phase == "loading"
    assert c.message(line).startswith("Load weight begin.")


def test_tqdm_carriage_return_redraws_count() -> None:
    c = LogClassifier()
    c.feed("Loading safetensors checkpoint shards:  10% Completed | 8/83\r"
           "Loading safetensors checkpoint shards:  54% Completed | 45/83 [01:02<00:50,  1.2it/s]")
    assert (c.phase, c.progress) == ("loading", 54.0)


def test_failure_is_refined_by_the_more_informative_line() -> None:
    c = LogClassifier()
    first = c.feed("[2026-02-19 06:10:31] Received sigquit from a child process. It usually means the child failed.")
    assert [e.name for e in first] == ["starting", "crash"]
    c.feed("RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)")
    assert c.failure.name == "nccl_error" and c.failure.line.startswith("RuntimeError: NCCL error")
    # a later, weaker marker does not replace the evidence
    assert c.feed("[2026-02-19 06:10:32] Exit code: -9") == []
    assert c.failure.name == "nccl_error"


def test_kv_cache_pool_full_while_serving_is_not_a_failure() -> None:
    verdict = classify_file(FIXTURES / "versions/v0.5.23_ready.log")
    assert (verdict["phase"], verdict["failure"]) == ("ready", None)


def test_check_stall_per_phase_timeout() -> None:
    now = [1000.0]
    c = LogClassifier(clock=lambda: now[0])
    for line in (FIXTURES / "real/sglang9917_silent_after_loading.log").open():
        c.feed(line)
    timeouts = {"loading": 1800.0, "autotune": 900.0}
    assert c.check_stall(1000.0 + 1799, timeouts) is None
    stall = c.check_stall(1000.0 + 1801, timeouts)
    assert stall is not None and (stall.name, stall.phase) == ("stall", "loading")
    assert "no output for 1801 s" in stall.line and "100% Completed | 163/163" in stall.line
    assert c.failure is stall
    assert describe(stall).startswith("stalled at loading: no output for 1801 s")
    # a phase without a timeout never stalls; a ready server never stalls
    quiet = LogClassifier(clock=lambda: 0.0)
    quiet.feed("[2026-02-20 10:00:03 TP0] Init torch distributed begin.")
    assert quiet.check_stall(10**6, {"loading": 1.0}) is None


def test_describe_names_phase_and_exception() -> None:
    failure = read_log(FIXTURES / "versions/v0.5.9_autotune_ninja.log").failure
    text = describe(failure)
    assert text.startswith("crashed at autotune: CalledProcessError: Command '['ninja', '-v', '-C'")
    assert text.endswith("returned non-zero exit status 1.")
    short = describe(failure, width=80)
    assert len(short) < 120 and " ... " in short and short.endswith("exit status 1.")
    gpu = read_log(FIXTURES / "real/sglang4233_unbalanced_memory.log").failure
    assert describe(gpu).startswith("GPU busy") and "not the config's fault" in describe(gpu)


def test_advice_lines_after_a_failure_are_kept() -> None:
    """SGLang's "Possible solutions" after a graph-capture OOM (0.5.23 wording), frames and the
    failure line itself left out."""
    c = LogClassifier("0.5.23")
    for line in (FIXTURES / "versions" / "v0.5.23_cuda_graph_oom.log").read_text().splitlines():
        c.feed(line)
    assert c.failure is not None and c.failure.name == "oom"
    assert c.advice == [  # CUDA_GRAPH_CAPTURE_FAILED_MSG, 0.5.23 runner_backend_utils/__init__.py:14
        "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
        "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)",
        "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. (Not recommended. Huge performance loss)",
    ]
    quiet = LogClassifier()
    quiet.feed("[2026-03-01 09:00:00] server_args=ServerArgs(model_path='m') --tp 8")  # no failure yet
    assert quiet.advice == []


def test_advice_printed_by_every_rank_is_kept_once() -> None:
    """With TP > 1 each rank prints the same advice; how many do before the verdict is timing."""
    c = LogClassifier("0.5.23")
    c.feed("[2026-03-01 09:00:00 TP0] Scheduler hit an exception: torch.OutOfMemoryError: CUDA out of memory.")
    for rank in range(3):
        c.feed(f"[2026-03-01 09:00:01 TP{rank}] 1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)")
    assert c.failure is not None and c.failure.name == "oom"
    assert c.advice == ["1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)"]


@pytest.mark.parametrize(
    "frame",
    [
        '  File "/x/sglang/srt/model_loader/loader.py", line 10, in load_model',  # .pyc-only: no source
        '  File "<frozen runpy>", line 198, in _run_module_as_main',
        '  File "<string>", line 1, in <module>',
    ],
)
def test_exception_after_a_frame_without_source_is_not_skipped(frame: str) -> None:
    c = LogClassifier()
    c.feed("[2026-02-19 06:10:31 TP0] Scheduler hit an exception: Traceback (most recent call last):")
    c.feed(frame)
    c.feed("RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)")
    assert c.failure is not None and c.failure.name == "nccl_error"
    assert c.failure.line.startswith("RuntimeError: NCCL error")


def test_frame_source_is_skipped_but_the_next_frame_is_read() -> None:
    """Source lines sit deeper than their frame (or flush in a paste that lost indentation); a
    sourceless frame followed by another frame still gives that frame's phase."""
    c = LogClassifier()
    for line in [
        "[2026-02-19 06:10:31 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "<frozen runpy>", line 198, in _run_module_as_main',
        '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/model_executor/model_runner.py", line 934, in init_cuda_graphs',
        '    raise RuntimeError("CUDA out of memory while capturing")',  # source: not evidence
        "RuntimeError: CUDA error: an illegal memory access was encountered",
    ]:
        c.feed(line)
    assert (c.failure.name, c.failure.phase) == ("cuda_graph_error", "cuda_graph")
    flat = LogClassifier()
    for line in [
        'File "/sgl-workspace/sglang/python/sglang/srt/distributed/pynccl_wrapper.py", line 329, in NCCL_CHECK',
        'raise RuntimeError(f"NCCL error: {error_str}")',
    ]:
        flat.feed(line)
    assert flat.failure is None


def test_unbalanced_memory_warning_is_not_a_failure() -> None:
    """With SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=false SGLang warns and carries on; only the
    raised exception means a GPU is held by another process."""
    c = LogClassifier()
    c.feed("[2026-02-19 05:48:17 TP1] WARNING model_runner.py:512: The memory capacity is unbalanced. Some GPUs "
           "may be occupied by other processes. min_per_gpu_memory=70.12, local_gpu_memory=139.50, "
           "local_gpu_memory * 0.9=125.55")
    assert c.failure is None
    c.feed("RuntimeError: The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
           "min_per_gpu_memory=70.12, local_gpu_memory=139.50, local_gpu_memory * 0.9=125.55")
    assert c.failure is not None and c.failure.name == "gpu_busy"


def test_multithread_loader_progress() -> None:
    """SGLang's multithread loader names its bar differently (as in SGLang's own docs output)."""
    c = LogClassifier()
    for line in [
        "[2026-04-21 06:50:01] Load weight begin. avail mem=78.50 GB",
        "Multi-thread loading shards:   0% Completed | 0/4 [00:00<?, ?it/s]",
        "Multi-thread loading shards:  50% Completed | 2/4 [00:01<00:01,  1.17it/s]",
    ]:
        c.feed(line)
    assert (c.phase, c.progress) == ("loading", 50.0)
    assert LogClassifier().feed("Multi-thread loading shards:  25% Completed | 1/4 [00:00<00:02,  1.29it/s]")[-1].progress == 25.0


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("[2026-02-20 10:00:14] ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 30000): "
         "address already in use", "port_busy"),
        ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. "
         "port: 30005, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use", "port_busy"),
        ("RuntimeError: CUDA error: all CUDA-capable devices are busy or unavailable", "gpu_busy"),
        ("NotImplementedError: moe_runner_backend=flashinfer_mxfp4 requires SM90 or SM100.", "unsupported"),
        ("RuntimeError: No supported CUDA architectures found for major versions [9, 10].", "unsupported"),
    ],
)
def test_infrastructure_and_unsupported_texts(line: str, kind: str) -> None:
    c = LogClassifier()
    c.feed(line)
    assert c.failure is not None and c.failure.name == kind
    # a port or GPU held by another process is the host's fault: the study retries the config
    assert Failure.from_event(c.failure).infrastructure == kind.endswith("_busy")


def test_a_version_without_signatures_reads_with_every_wording(caplog: pytest.LogCaptureFixture) -> None:
    """A live manifest may name a release newer than the signature files: warn, do not refuse."""
    assert signature_version("0.5.23") == "0.5.23"
    assert signature_version(None) is None
    with caplog.at_level("WARNING", logger="search.logwatch"):
        assert signature_version("0.5.10") is None
    assert "no log signatures for SGLang 0.5.10" in caplog.text
    verdict = read_log(FIXTURES / "versions/v0.5.23_ready.log", signature_version("0.5.10")).summary()
    assert (verdict["phase"], verdict["failure"]) == ("ready", None)
