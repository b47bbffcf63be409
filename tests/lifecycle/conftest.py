"""Real emulator servers for lifecycle tests: a free port, a private state dir, a tiny landscape.

The landscape below is the issue-3 interface; ``TEST_OUTCOME`` in the server's environment
picks the startup outcome ("ok", "<phase>:hang", "<phase>" for that phase's crash text, or
"graph_oom" for SGLang's graph-capture OOM with its advice lines), so
one file covers every outcome and each test says which one it wants.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from search.profile import LaunchProfile
from tests.helpers import free_port

LANDSCAPE = '''
# Real texts (search/emulator/templates.yaml names their source): PyTorch's OOM, 0.5.9's KV-pool
# check, FlashInfer's ninja failure and its JIT's refusal of SM100-only kernels.
ERRORS = {
    "loading": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.25 GiB. GPU 0 has a total capacity of 95.59 GiB",
    "kv_cache": "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: self.server_args.mem_fraction_static=0.5",
    "autotune": "RuntimeError: Ninja build failed. Ninja output:\\nninja: build stopped: subcommand failed.",
    "cuda_graph": "Exception: Capture cuda graph failed: No supported CUDA architectures found for major versions [9, 10].",
    "warmup": "RuntimeError: No supported CUDA architectures found for major versions [10].",
}

# 0.5.23's graph-capture failure (runner/decode_cuda_graph_runner.py:603 with
# runner_backend_utils/__init__.py:14 CUDA_GRAPH_CAPTURE_FAILED_MSG)
GRAPH_OOM = """Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 448.00 MiB.
Possible solutions:
1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)
2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)
3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. (Not recommended. Huge performance loss)
Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose 
"""

def startup(flags, env):
    outcome = env.get("TEST_OUTCOME", "ok")
    if outcome == "ok":
        return None
    if outcome == "graph_oom":
        return {"phase": "cuda_graph", "error": GRAPH_OOM}
    phase, _, hang = outcome.partition(":")
    return {"phase": phase, "hang": True} if hang else {"phase": phase, "error": ERRORS[phase]}

def throughput(flags, env, running):
    return 400.0 * min(running, 64)  # 400 tok/s per stream: greedy prompts answer in 0.1 s

def phase_seconds(flags, env):
    return {"starting": 20, "loading": 60, "kv_cache": 20, "autotune": 20, "cuda_graph": 20, "warmup": 10}
'''  # noqa: E501, W291  (a landscape file's text: SGLang's own lines, its trailing space included)

TIME_SCALE = "0.01"  # the whole startup above takes about 1.5 s



@pytest.fixture
def landscape(tmp_path: Path) -> Path:
    path = tmp_path / "landscape.py"
    path.write_text(LANDSCAPE)
    return path


@pytest.fixture
def make_profile(tmp_path: Path, landscape: Path) -> Callable[..., LaunchProfile]:
    """``make_profile(outcome, tp=2, args=[...], env={...})``: an emulator profile on a free port."""

    def make(outcome: str = "ok", *, tp: int = 2, args: list[str] | None = None,
             env: dict[str, str] | None = None) -> LaunchProfile:
        port = free_port()
        return LaunchProfile(
            launcher=["python3", "-m", "sglang.launch_server"],
            args=["--model-path", "test/model", "--tp-size", str(tp), "--host", "127.0.0.1", "--port", str(port),
                  "--moe-runner-backend", "flashinfer_cutlass", *(args or [])],
            env={
                "SEARCH_EMULATOR_STATE_DIR": str(tmp_path / "state"),
                "SEARCH_EMULATOR_TIME_SCALE": TIME_SCALE,
                "SEARCH_EMULATOR_LANDSCAPE": str(landscape),
                "SEARCH_EMULATOR_GPUS": "4",
                "TEST_OUTCOME": outcome,
                **(env or {}),
            },
            secret_env=[],
            host="127.0.0.1",
            port=port,
            sglang_version="0.5.23",
        )

    return make


@pytest.fixture
def marker() -> str:
    return f"test-{uuid.uuid4().hex}"


@pytest.fixture
def script_profile(tmp_path: Path) -> Callable[..., LaunchProfile]:
    """``script_profile(source, *args)``: a profile whose server is the Python script ``source``,
    run with its free port and ``args``: a real process writing what SGLang writes, for the
    outcomes the emulator does not model (a hang before loading, a bar slower than its phase's
    timeout, children that leave the process group)."""

    def make(source: str, *args: str) -> LaunchProfile:
        port = free_port()
        script = tmp_path / f"server_{port}.py"
        script.write_text(source)
        return LaunchProfile(launcher=[sys.executable, str(script)], args=[str(port), *args], env={},
                             secret_env=[], host="127.0.0.1", port=port, sglang_version="0.5.9")

    return make
