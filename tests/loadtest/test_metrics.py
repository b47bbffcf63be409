"""Per-level metrics follow sglang.bench_serving's definitions on hand-built timelines."""

from __future__ import annotations

import pytest

from search.loadtest.client import Record
from search.loadtest.metrics import chunks_between, from_requests, from_window, relative_half_width


def _rec(send: float, chunks: list[float], tokens: int | None, error: str | None = None) -> Record:
    return Record(send=send, input_tokens=10, chunks=chunks, end=chunks[-1] if chunks else send + 1,
                  output_tokens=tokens, error=error)


def test_from_requests_uses_bench_serving_definitions() -> None:
    a = _rec(0.0, [1.0, 1.5, 2.0], 3)  # TTFT 1 s, ITL 0.5 s twice, TPOT (2-1)/(3-1) = 0.5 s
    b = _rec(1.0, [1.5, 2.5, 3.5, 4.0], 4)  # TTFT 0.5 s, ITL 1, 1, 0.5, TPOT 2.5/3
    failed = _rec(0.5, [], None, error="http_500")
    lv = from_requests(2, [a, b, failed])
    assert lv.duration == pytest.approx(4.0)  # first send 0.0 to last end 4.0 (the failure ends at 1.5)
    assert lv.completed == 2 and lv.errors == {"http_500": 1}
    assert lv.total_output_tokens == 7 and lv.output_throughput == pytest.approx(7 / 4)
    assert lv.total_input_tokens == 20 and lv.total_throughput == pytest.approx(27 / 4)
    assert lv.request_throughput == pytest.approx(0.5)
    assert lv.mean_ttft_ms == pytest.approx(750.0)
    assert lv.mean_itl_ms == pytest.approx((0.5 + 0.5 + 1 + 1 + 0.5) / 5 * 1000)
    assert lv.mean_tpot_ms == pytest.approx((0.5 + 2.5 / 3) / 2 * 1000)
    assert lv.mean_e2e_latency_ms == pytest.approx(2500.0)
    assert lv.concurrency == pytest.approx((2.0 + 3.0) / 4)  # sum of E2E / duration
    assert lv.max_concurrency == 2


def test_from_window_counts_only_tokens_that_arrived_in_the_window() -> None:
    # A long request still running at the window's end: its chunks inside [10, 20) count.
    running = Record(send=0.0, input_tokens=10, chunks=[float(t) for t in range(1, 30)], end=30.0,
                     error="cancelled")
    # A finished one whose usage says 2 tokens per chunk (--stream-interval 2).
    finished = _rec(9.0, [9.5, 12.0, 15.0], 6)
    lv = from_window(2, [running, finished], t0=10.0, t1=20.0)
    assert lv.duration == pytest.approx(10.0)
    # running: chunks 10..19 -> 10 chunks at the learnt 2 tokens/chunk; finished: 2 chunks x 2.
    assert lv.total_output_tokens == 24
    assert lv.output_throughput == pytest.approx(2.4)
    assert lv.completed == 1 and lv.errors == {}  # a request cut at the level's end is no error
    assert lv.concurrency == pytest.approx((10.0 + 5.0) / 10.0)  # time-averaged in flight
    assert lv.mean_ttft_ms is None  # no first token fell inside the window: no sample, not 0


def test_convergence_statistics() -> None:
    recs = [_rec(0.0, [0.1, 0.2, 1.1], 3)]
    assert chunks_between(recs, 0.0, 1.0) == 2
    assert relative_half_width([100] * 10) == 0.0
    assert relative_half_width([100]) == float("inf")
    assert 0.02 < relative_half_width([90, 110] * 5) < 0.1
