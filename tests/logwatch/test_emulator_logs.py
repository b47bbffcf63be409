"""Cross-check: every outcome the emulator can produce reads back as that outcome in the log watcher.

The emulator writes SGLang's log for each version's wording; `search.logwatch` must classify
each one as the phase and failure that happened. A disagreement means one of the two drifted
from SGLang (../shared/reference/sglang.md): the test names the case so it can be settled from
the reference. Runs the real emulator (subprocesses, real log files) on the built-in seed
landscape and on a small landscape written here that can fail in any phase on demand.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from search.emulator import gpu_state
from search.logwatch import read_log
from tests.emulator.conftest import SMALL_LANDSCAPE, Server, start  # noqa: F401  (start is a fixture)

VERSIONS = ("0.5.8.post1", "0.5.9", "0.5.23")
SCALE = "0.005"

# A landscape that does whatever XCHECK_OUTCOME says ("clean", "crash:PHASE", "hang:PHASE"); its
# autotune phase always runs, so every phase can fail.
LANDSCAPE = '''
ERRORS = {
    "loading": "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)",
    "kv_cache": "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
                "Current value: self.server_args.mem_fraction_static=0.95",
    "autotune": "RuntimeError: CUDA error: an illegal memory access was encountered",
    "cuda_graph": "Exception: Capture cuda graph failed: CUDA error: an illegal memory access was encountered",
    "warmup": "RuntimeError: CUDA error: an illegal memory access was encountered",
}

def startup(flags, env):
    kind, _, phase = env.get("XCHECK_OUTCOME", "clean").partition(":")
    if kind == "crash":
        return {"phase": phase, "error": ERRORS[phase]}
    if kind == "hang":
        return {"phase": phase, "hang": True}
    return None

def throughput(flags, env, running):
    return 40.0 * running

def phase_seconds(flags, env):
    return {"starting": 20, "loading": 100, "kv_cache": 20, "autotune": 40, "cuda_graph": 40, "warmup": 20}
'''

# outcome -> (failure kind, phase it happened in)
SMALL = {
    "crash:loading": ("nccl_error", "loading"),
    "crash:kv_cache": ("oom", "kv_cache"),
    "crash:autotune": ("autotune_error", "autotune"),
    "crash:cuda_graph": ("cuda_graph_error", "cuda_graph"),
    "crash:warmup": ("crash", "warmup"),
}
HANGS = {"hang:loading": "loading", "hang:kv_cache": "kv_cache", "hang:cuda_graph": "cuda_graph"}

# The seed landscape's outcomes (seed.md): flags -> (failure kind or None, phase). TP 4 holds the
# weights as TP 8 does, with half the processes.
TP4 = ["--model-path", "m", "--tp", "4"]
SEED = {
    "baseline": (TP4, None, "ready"),
    "tuned": ([*TP4, "--moe-runner-backend", "flashinfer_cutlass", "--disable-cuda-graph",
               "--mem-fraction-static", "0.92"], None, "ready"),
    "allreduce_fusion": ([*TP4, "--enable-flashinfer-allreduce-fusion"], "unsupported", "cuda_graph"),
    "graph_oom": ([*TP4, "--mem-fraction-static", "0.95"], "oom", "cuda_graph"),
    "ninja": ([*TP4, "--moe-runner-backend", "flashinfer_cutlass", "--fp8-gemm-backend", "flashinfer_trtllm"],
              "autotune_error", "autotune"),
    "trtllm": ([*TP4, "--moe-runner-backend", "flashinfer_trtllm"], "unsupported", "autotune"),
    "mxfp4": ([*TP4, "--moe-runner-backend", "flashinfer_mxfp4"], "unsupported", "autotune"),
    "kv_memory": ([*TP4, "--mem-fraction-static", "0.3"], "oom", "kv_cache"),
    "weights_oom": (["--model-path", "m", "--tp", "2"], "oom", "loading"),
    "trtllm_untuned": ([*TP4, "--moe-runner-backend", "flashinfer_trtllm", "--disable-flashinfer-autotune"],
                       "unsupported", "warmup"),
    "warmup_oom": ([*TP4, "--disable-cuda-graph", "--mem-fraction-static", "0.97"], "oom", "warmup"),
}


def _verdict(server: Server, version: str) -> tuple[str | None, str | None]:
    """(failure kind, phase): the failure's phase, or the phase reached when nothing failed."""
    log = read_log(server.log_path, version)
    return (log.failure.name, log.failure.phase) if log.failure else (None, log.phase)


def _settle(server: Server, needle: str) -> None:
    """A hung server: its last line is out; give it time to (wrongly) go on, then stop it."""
    server.wait_for(needle)
    time.sleep(0.5)
    assert server.proc.poll() is None, server.text()[-2000:]
    server.stop()


@pytest.fixture
def landscape(tmp_path: Path) -> str:
    path = tmp_path / "xcheck.py"
    path.write_text(LANDSCAPE)
    return str(path)


@pytest.mark.parametrize("version", VERSIONS)
def test_small_landscape_every_startup_outcome(start, landscape: str, version: str) -> None:  # noqa: F811
    env = {"SEARCH_EMULATOR_SGLANG_VERSION": version, "SEARCH_EMULATOR_LANDSCAPE": landscape,
           "SEARCH_EMULATOR_TIME_SCALE": SCALE}
    args = ["--model-path", "m", "--tp", "2"]
    crashes = {o: start(args, XCHECK_OUTCOME=o, **env) for o in SMALL}
    hangs = {o: start(args, XCHECK_OUTCOME=o, **env) for o in HANGS}
    clean = start(args, **env)
    clean.wait_ready()
    assert _verdict(clean, version) == (None, "ready")
    for outcome, server in crashes.items():
        assert server.wait_exit() != 0
        assert _verdict(server, version) == SMALL[outcome], (outcome, server.text()[-3000:])
    last = {"loading": "Load weight begin", "kv_cache": "Load weight end", "cuda_graph": "graph begin"}
    for outcome, server in hangs.items():
        _settle(server, last[HANGS[outcome]])
        assert _verdict(server, version) == (None, HANGS[outcome]), (outcome, server.text()[-3000:])


@pytest.mark.parametrize("version", VERSIONS)
def test_gpu_held_by_another_process_reads_gpu_busy(start, landscape: str, tmp_path: Path,  # noqa: F811
                                                    version: str) -> None:
    state = tmp_path / "held"
    fd = gpu_state.try_lock(state, 1)  # as a previous server's orphan would
    assert fd is not None
    try:
        server = start(["--model-path", "m", "--tp", "2"], SEARCH_EMULATOR_STATE_DIR=str(state),
                       SEARCH_EMULATOR_SGLANG_VERSION=version, SEARCH_EMULATOR_LANDSCAPE=landscape)
        assert server.wait_exit() != 0
    finally:
        os.close(fd)
    assert _verdict(server, version) == ("gpu_busy", "starting"), server.text()[-2000:]


def _stream_forever(url: str) -> None:
    try:
        httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 10**6, "ignore_eos": True},
                   timeout=60)
    except httpx.HTTPError:
        pass  # the server died under it, as meant


@pytest.mark.parametrize("version", VERSIONS)
def test_rank_killed_while_serving_reads_as_a_death_while_serving(start, landscape: str,  # noqa: F811
                                                                  version: str) -> None:
    server = start(["--model-path", "m", "--tp", "2"], SEARCH_EMULATOR_SGLANG_VERSION=version,
                   SEARCH_EMULATOR_LANDSCAPE=landscape, SEARCH_EMULATOR_TIME_SCALE=SCALE)
    server.wait_ready()
    busy = threading.Thread(target=_stream_forever, args=(server.url,), daemon=True)
    busy.start()
    time.sleep(0.3)
    os.kill(json.loads((server.state / "gpu1.json").read_text())["pid"], signal.SIGKILL)
    assert server.wait_exit() != 0
    busy.join(10)
    text = server.text()
    assert "SIGQUIT received. signum=None, frame=None. It usually means one child failed." in text
    if version == "0.5.23":  # SubprocessWatchdog
        assert "Subprocess scheduler_1 (pid=" in text and "crashed with exit code -9." in text
        assert _verdict(server, version) == ("crash", "ready")
    else:  # no watchdog on children: the batch stalls until the scheduler watchdog fires on TP0
        assert "TP0] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)" in text
        assert _verdict(server, version) == ("stall", "ready")


@pytest.mark.parametrize("version", VERSIONS)
def test_rank_killed_during_startup_reads_as_a_crash(start, landscape: str, version: str) -> None:  # noqa: F811
    server = start(["--model-path", "m", "--tp", "2"], SEARCH_EMULATOR_SGLANG_VERSION=version,
                   SEARCH_EMULATOR_LANDSCAPE=landscape, XCHECK_OUTCOME="hang:kv_cache")
    server.wait_for("Load weight end")
    os.kill(json.loads((server.state / "gpu1.json").read_text())["pid"], signal.SIGKILL)
    assert server.wait_exit() == 1
    text = server.text()
    if version == "0.5.23":
        assert "RuntimeError: Rank 1 scheduler died during initialization (exit code: -9)." in text
    else:
        assert "] Rank 1 scheduler is dead. Please check if there are relevant logs." in text
        assert "] Exit code: -9" in text
    assert _verdict(server, version) == ("crash", "kv_cache"), text[-2000:]


@pytest.mark.parametrize("version", VERSIONS)
def test_seed_landscape_every_outcome(start, version: str) -> None:  # noqa: F811
    env = {"SEARCH_EMULATOR_SGLANG_VERSION": version, "SEARCH_EMULATOR_TIME_SCALE": "0.002"}
    servers = {name: start(args, **env) for name, (args, _, _) in SEED.items()}
    hang = start([*SEED["tuned"][0]], NCCL_NVLS_ENABLE="1", **env)
    for name, server in servers.items():
        _, kind, phase = SEED[name]
        if kind is None:
            server.wait_ready()
        else:
            assert server.wait_exit() != 0, name
        assert _verdict(server, version) == (kind, phase), (name, server.text()[-3000:])
    _settle(hang, "TP3] Load weight begin")
    assert _verdict(hang, version) == (None, "loading")


NAN_LANDSCAPE = SMALL_LANDSCAPE + "\n\ndef corrupt(flags, env):\n    return True\n"


@pytest.mark.parametrize(("version", "args", "env", "warned"), [
    # 0.5.23 sanitizes and warns once per rank with SGLANG_SANITIZE_NAN_LOGITS (utils/async_probe.py:41)
    ("0.5.23", [], {"SGLANG_SANITIZE_NAN_LOGITS": "1"}, "NaN detected in sampler: next_token_logits; values were "
                                                      "sanitized before sampling."),
    ("0.5.23", [], {}, None),  # off by default: NaN flows on silently
    ("0.5.9", ["--enable-nan-detection"], {}, "Detected errors during sampling! NaN in the logits."),
    ("0.5.9", [], {}, None),
])
def test_nan_logits_are_warned_as_the_version_does_and_the_server_serves_on(
        start, tmp_path: Path, version: str, args: list[str], env: dict[str, str], warned: str | None) -> None:  # noqa: F811
    path = tmp_path / "nan.py"
    path.write_text(NAN_LANDSCAPE)
    server = start(["--model-path", "m", "--tp", "2", *args], SEARCH_EMULATOR_SGLANG_VERSION=version,
                   SEARCH_EMULATOR_LANDSCAPE=str(path), SEARCH_EMULATOR_TIME_SCALE="0.01", **env)
    server.wait_ready()
    with httpx.Client(base_url=server.url, timeout=30) as c:
        assert c.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 4}}).status_code == 200
    assert server.proc.poll() is None
    lines = [line for line in server.text().splitlines() if "NaN" in line]
    if warned is None:
        assert not lines and _verdict(server, version) == (None, "ready")
        return
    assert lines and all(warned in line for line in lines)
    if version == "0.5.23":  # once per rank (TP0, TP1)
        assert sorted(line.split("]")[0].split()[-1] for line in lines) == ["TP0", "TP1"]
    assert _verdict(server, version)[0] == "nan"
