"""The nvidia-smi parser on output captured from a real H200, and the telemetry built on it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from search import gpu
from search.errors import InfrastructureFault
from search.hosts.base import GpuSample

FIXTURES = Path(__file__).parent.parent / "fixtures" / "nvidia-smi"


def test_query_argv_matches_the_documented_query() -> None:
    assert gpu.query_argv(["python3", "-m", "search.emulator.nvidia_smi"]) == [
        "python3", "-m", "search.emulator.nvidia_smi",
        "--query-gpu=index,memory.used,memory.total,power.draw,power.limit,utilization.gpu",
        "--format=csv,noheader,nounits",
    ]


def test_idle_h200() -> None:
    [sample] = gpu.parse((FIXTURES / "h200-idle.csv").read_text())
    assert sample == GpuSample(0, 0.0, 143771.0, 81.04, 700.0, 0.0)
    assert gpu.busy([sample], [0]) == []


def test_h200_under_matmul_load() -> None:
    rounds = [gpu.parse(line) for line in (FIXTURES / "h200-matmul.csv").read_text().splitlines()]
    assert len(rounds) == 8
    loaded = rounds[2:]  # the first two rows were taken while the loop warmed up
    assert all(r[0].utilization_pct == 100.0 for r in loaded)
    assert all(r[0].memory_used_mib == 1139.0 for r in loaded)
    assert gpu.busy(rounds[-1], [0]) == ["GPU 0: 1139 MiB used"]
    window = gpu.summarize(loaded)
    assert window is not None and window.samples == 6
    assert window.power_limit_w == 700.0
    assert 690 < window.power_w < 700  # noqa: PLR2004 - the captured draw, near the limit
    assert window.record() == {"power_w": window.power_w, "power_limit_w": 700.0, "utilization_pct": 100.0}


def test_after_load_is_free_again() -> None:
    [sample] = gpu.parse((FIXTURES / "h200-after-load.csv").read_text())
    assert sample.memory_used_mib == 0 and sample.power_w == 124.85
    assert gpu.busy([sample], [0]) == []


def test_unreported_fields_are_none_but_memory_is_required() -> None:
    [sample] = gpu.parse("3, 12, 81559, [N/A], [Not Supported], [N/A]\n")
    assert sample == GpuSample(3, 12.0, 81559.0, None, None, None)
    assert gpu.summarize([[sample]]) == gpu.GpuWindow(1, None, None, None)
    with pytest.raises(InfrastructureFault, match="lacks the GPU index or memory"):
        gpu.parse("0, [N/A], 143771, 80, 700, 0")


def test_header_units_and_wrong_shapes_are_refused() -> None:
    with pytest.raises(InfrastructureFault, match="expected a number"):
        gpu.parse((FIXTURES / "h200-idle-units.csv").read_text())
    with pytest.raises(InfrastructureFault, match="has 10 fields, expected 6"):
        gpu.parse((FIXTURES / "h200-info-na.csv").read_text())


def test_missing_gpu_counts_as_busy() -> None:
    samples = gpu.parse("0, 0, 143771, 80, 700, 0\n1, 0, 143771, 80, 700, 0\n")
    assert gpu.busy(samples, [0, 1]) == []
    assert gpu.busy(samples, [1, 2]) == ["GPU 2: not reported by nvidia-smi (have [0, 1])"]


def test_telemetry_windows_per_level_and_survives_failed_samples() -> None:
    calls = 0
    level_two = threading.Event()

    def sample() -> list[GpuSample] | None:
        nonlocal calls
        calls += 1
        if calls % 3 == 0:
            raise OSError("connection dropped")
        power = 600.0 if level_two.is_set() else 250.0
        return [GpuSample(0, 1000, 143771, power, 600, 50), GpuSample(1, 1000, 143771, 0, 600, 0)]

    def wait_rounds(telemetry: gpu.Telemetry, n: int) -> int:
        start = telemetry.mark()
        while telemetry.mark() < start + n:
            threading.Event().wait(0.005)
        return start

    with gpu.Telemetry(sample, gpus=[0], interval=0.01) as telemetry:
        first = wait_rounds(telemetry, 3)
        window_one = telemetry.since(first)
        level_two.set()
        wait_rounds(telemetry, 2)  # let a sample taken before the switch land first
        second = wait_rounds(telemetry, 3)
        window_two = telemetry.since(second)
    assert window_one is not None and window_one.power_w == 250.0 and window_one.utilization_pct == 50.0
    assert window_two is not None and window_two.power_w == 600.0 and window_two.power_limit_w == 600.0


def test_emulator_stand_in_answers_the_same_query(tmp_path: Path) -> None:
    env = {**os.environ, "SEARCH_EMULATOR_STATE_DIR": str(tmp_path), "SEARCH_EMULATOR_GPUS": "3"}
    out = subprocess.run(gpu.query_argv([sys.executable, "-m", "search.emulator.nvidia_smi"]),
                         capture_output=True, text=True, env=env, check=True).stdout
    samples = gpu.parse(out)
    assert [s.index for s in samples] == [0, 1, 2]
    assert gpu.busy(samples, [0, 1, 2]) == []  # no ranks alive: free
    assert all(s.power_limit_w and s.power_w is not None and s.power_w < s.power_limit_w for s in samples)
