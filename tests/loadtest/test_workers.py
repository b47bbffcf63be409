"""Streams spread over worker processes: the same measurement as one process, and more processes
once one is the bottleneck."""

from __future__ import annotations

import pytest

from search.loadtest import LadderSpec, ladder, run_ladder

from .server import Server
from .test_ladder_emulator import modelled


def test_requests_over_two_workers_count_exactly(emulator: Server) -> None:
    spec = LadderSpec(concurrency=(6,), input_len=32, output_len=16, requests=13, duration_s=None, workers=2,
                      api="chat")
    lv = run_ladder(emulator.url, spec).levels[0]
    assert lv.client_processes == 2 and lv.client_cpu is not None
    assert lv.errors == {} and lv.completed == 13  # 7 + 6 requests, mirrored whole
    assert lv.total_output_tokens == 13 * 16
    assert lv.total_input_tokens == 13 * (32 + 4 + 3)  # the server's prompt_tokens (chat template) came through
    assert lv.median_itl_ms is not None and lv.median_ttft_ms is not None  # per-chunk times came through


def test_window_over_two_workers_measures_the_modelled_rate(emulator: Server) -> None:
    spec = LadderSpec(concurrency=(16, 32), input_len=64, output_len=64, duration_s=4.0, warmup_s=1.0,
                      converge_ci=0.001, workers=2)
    result = run_ladder(emulator.url, spec)
    assert result.aborted is None
    for lv in result.levels:
        assert lv.client_processes == 2 and lv.errors == {}
        assert lv.output_throughput == pytest.approx(modelled(lv.max_concurrency), rel=0.1)
        assert lv.concurrency == pytest.approx(lv.max_concurrency, rel=0.1)


def test_a_busy_client_measures_the_level_again_over_more_processes(
        emulator: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Auto (the default): a level where the client used more than CLIENT_BUSY of a core is run
    again with twice the processes, up to MAX_WORKERS; here every level counts as busy."""
    monkeypatch.setattr(ladder, "CLIENT_BUSY", 0.0)
    monkeypatch.setattr(ladder, "MAX_WORKERS", 2)
    spec = LadderSpec(concurrency=(4, 8), input_len=16, output_len=16, requests=8, duration_s=None)
    result = run_ladder(emulator.url, spec)
    assert [lv.client_processes for lv in result.levels] == [2, 2]
    assert all(lv.completed == 8 for lv in result.levels)


def test_workers_must_be_positive() -> None:
    from search.errors import BadInput
    with pytest.raises(BadInput, match="--workers must be at least 1"):
        LadderSpec(workers=0)
