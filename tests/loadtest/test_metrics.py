"""Per-level metrics follow sglang.bench_serving's definitions on hand-built timelines."""

from __future__ import annotations

import pytest

from search.loadtest.client import Record
from search.loadtest.metrics import (
    from_requests,
    from_window,
    relative_half_width,
    request_cycle_s,
    tokens_between,
)


def _rec(send: float, chunks: list[float], tokens: int | None, error: str | None = None) -> Record:
    """A finished request whose chunks carried equal shares of its ``tokens`` (server counts)."""
    per = (tokens or 0) // max(len(chunks), 1)
    return Record(send=send, input_tokens=10, chunks=chunks, counts=[per * (i + 1) for i in range(len(chunks))],
                  end=chunks[-1] if chunks else send + 1, output_tokens=tokens, error=error)


def _running(send: float, chunks: list[float], counts: list[int], exact: bool = True) -> Record:
    return Record(send=send, input_tokens=10, chunks=chunks, counts=counts, exact=exact, end=30.0,
                  error="cancelled")


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
    # A long request still running at the window's end, 3 tokens a chunk by the server's
    # running count: its chunks inside [10, 20) count, whatever the finished requests did.
    running = _running(0.0, [float(t) for t in range(1, 30)], [3 * t for t in range(1, 30)])
    # A finished one whose chunks carried 2 tokens each (--stream-interval 2): the chunk at 12.0
    # was made over 9.5..12.0, so 4/5 of its tokens fall inside, and all of the one at 15.0.
    finished = _rec(9.0, [9.5, 12.0, 15.0], 6)
    lv = from_window(2, [running, finished], t0=10.0, t1=20.0)
    assert lv.duration == pytest.approx(10.0)
    assert lv.output_throughput == pytest.approx((10 * 3 + 2 * 0.8 + 2) / 10)
    assert lv.output_tokens_counted == "server"
    assert lv.completed == 1 and lv.errors == {}  # a request cut at the level's end is no error
    assert lv.concurrency == pytest.approx((10.0 + 5.0) / 10.0)  # time-averaged in flight
    # No first token fell inside the window: TTFT is that of the level's requests before it.
    assert not lv.ttft_in_window and lv.mean_ttft_ms == pytest.approx((1.0 + 0.5) / 2 * 1000)
    # TPOT per request, its decoding time inside over the tokens it received then: running
    # 10 s for 30 tokens, finished 5 s (to its last chunk at 15.0) for 3.6.
    assert lv.mean_tpot_ms == pytest.approx((10 / 30 + 5 / 3.6) / 2 * 1000)


def test_a_finished_request_s_chunking_does_not_weigh_the_running_ones() -> None:
    """The cause of a 51x reading: one early request ended with 256 tokens in 5 chunks (it ran
    alone at the whole server's rate); its 51 tokens a chunk were applied to every running
    request's one-token chunks. Running requests count what their own chunks brought."""
    early = _rec(0.0, [0.1, 0.2, 0.3, 0.4, 0.5], 255)
    streams = [_running(0.0, [1.0 + t for t in range(20)], list(range(1, 21))) for _ in range(100)]
    lv = from_window(101, [early, *streams], t0=5.0, t1=15.0)
    assert lv.total_output_tokens == 100 * 10
    assert lv.completed == 0 and lv.mean_e2e_latency_ms is None


def test_without_running_counts_text_is_turned_into_tokens_by_the_finished_requests_ratio() -> None:
    # A server that gives no usage per chunk: records count characters (4 per token here).
    finished = Record(send=0.0, input_tokens=10, chunks=[1.0, 2.0], counts=[20, 40], exact=False, end=2.0,
                      output_tokens=10)
    running = _running(0.0, [float(t) for t in range(1, 30)], [12 * t for t in range(1, 30)], exact=False)
    lv = from_window(2, [finished, running], t0=10.0, t1=20.0)
    assert lv.total_output_tokens == 10 * 12 / 4
    assert lv.output_tokens_counted == "text"
    # With no request finished there is no ratio: a chunk counts as one token, and it says so.
    alone = from_window(1, [running], t0=10.0, t1=20.0)
    assert alone.total_output_tokens == 10 and alone.output_tokens_counted == "chunks"


def test_a_record_switches_to_characters_at_its_first_chunk_without_a_count() -> None:
    r = Record(send=0.0, input_tokens=1)
    r.add_chunk(1.0, 2, 5)
    r.add_chunk(2.0, None, 7)
    r.add_chunk(3.0, 9, 3)  # a count after the switch is not trusted: the record is characters now
    assert not r.exact and r.counts == [0, 7, 10]


def test_a_window_s_edges_between_a_cohort_s_chunks_do_not_move_its_count() -> None:
    """Streams decoding in step (one batch, 4 tokens a chunk every second): a 3.5 s window
    holds 3 or 4 of their chunk times depending on where it starts; what it received is 14 a
    stream wherever it falls."""
    streams = [_running(0.0, [1.0 + t for t in range(20)], [4 * (t + 1) for t in range(20)]) for _ in range(8)]
    for t0 in (5.0, 5.2, 5.5, 5.9):
        assert from_window(8, streams, t0=t0, t1=t0 + 3.5).total_output_tokens == 8 * 14


def test_convergence_statistics() -> None:
    recs = [_rec(0.0, [0.1, 0.2, 1.1], 3)]
    assert tokens_between(recs, 0.0, 1.0) == pytest.approx(2 + 0.8 / 0.9)  # the third, made over 0.2..1.1, in part
    assert relative_half_width([100] * 10) == 0.0
    assert relative_half_width([100]) == float("inf")
    assert 0.02 < relative_half_width([90, 110] * 5) < 0.1


def test_a_request_cycle_comes_from_ended_requests_else_running_streams_own_rates() -> None:
    ended = _rec(0.0, [1.0, 2.0, 3.0], 3)  # send to end: 3 s
    # Running, asked for 11 tokens: first token 2 s after its send, then 2 tokens a second,
    # so its remaining 10 tokens after the first take 5 s: 7 s in all.
    running = Record(send=0.0, input_tokens=10, chunks=[2.0, 3.0, 4.0], counts=[1, 3, 5])
    waiting = Record(send=0.0, input_tokens=10)  # no token yet: says nothing of the cycle
    assert request_cycle_s([running], output_len=11) == pytest.approx(7.0)
    # Once any has ended, the ended ones alone: a projection from a few chunks is a guess.
    assert request_cycle_s([ended, running, waiting], output_len=11) == pytest.approx(3.0)
    assert request_cycle_s([ended, _rec(0.0, [2.0, 4.0], 2), running], output_len=11) == pytest.approx(3.5)
    assert request_cycle_s([waiting], output_len=11) is None
