"""A small space on the emulator: the lifecycle tests' landscape plus a secret the server echoes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lifecycle.conftest import LANDSCAPE, TIME_SCALE, free_port

SECRET = "s3cret-token-value-0042"

# The server prints the secret it was given (as a careless server might): artifacts must not.
ECHO_SECRET = '''
import os, sys
print("token seen by server:", os.environ.get("SEARCH_TEST_TOKEN"), file=sys.stderr, flush=True)
'''

SPACE = """
sglang_version: "0.5.23"
launch:
  model: test/model
  tp: 2
  host: 127.0.0.1
  port: {port}
  flags:
    --moe-runner-backend: flashinfer_cutlass
  secret_env: [SEARCH_TEST_TOKEN]
params:
  --max-running-requests:
    type: categorical
    choices: [8, 64]
  TEST_OUTCOME:
    type: categorical
    choices: [ok, autotune, kv_cache]
baseline:
  --max-running-requests: 64
  TEST_OUTCOME: ok
load_test:
  input_len: 16
  output_len: 16
  concurrency: [2, 8]
  duration_s: 1.0
  warmup_s: 0.2
slos:
  p99_ttft_ms: 5000
"""


@pytest.fixture
def space_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    landscape = tmp_path / "landscape.py"
    landscape.write_text(ECHO_SECRET + LANDSCAPE)
    monkeypatch.setenv("SEARCH_EMULATOR_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("SEARCH_EMULATOR_TIME_SCALE", TIME_SCALE)
    monkeypatch.setenv("SEARCH_EMULATOR_LANDSCAPE", str(landscape))
    monkeypatch.setenv("SEARCH_EMULATOR_GPUS", "4")
    monkeypatch.setenv("SEARCH_TEST_TOKEN", SECRET)
    path = tmp_path / "space.yaml"
    path.write_text(SPACE.format(port=free_port()))
    return path
