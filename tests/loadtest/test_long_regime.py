"""The seed's own regime: every request outlives the level, so none ends inside its window.

At 1,024 streams and ~3,700 tok/s a 1,024-token answer takes ~280 s, longer than a 180 s level.
The figures must come from what each stream received, measured against servers whose rate is
known exactly: tests/loadtest/clock_server.py (a fixed per-stream rate) and the emulator with a
flat landscape (a fixed total rate). Sizes fit 2 cores: a few thousand chunks a second.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from search.loadtest import LadderSpec, LevelResult, run_ladder

from .server import clock_server, start_emulator

STREAMS = 1024
OUTPUT_LEN = 1024  # at the rates below a request needs 128-1,000 s: none ends in a level


def _level(url: str, **kw: object) -> LevelResult:
    # A tight convergence threshold keeps the whole window: on a loaded 2-core box a server or
    # client stalled for a moment and catching up moves a 2 s window by several per cent.
    shape: dict[str, object] = {"concurrency": (STREAMS,), "input_len": 32, "output_len": OUTPUT_LEN,
                                "duration_s": 6.0, "warmup_s": 1.0, "converge_ci": 0.002, **kw}
    spec = LadderSpec(**shape)  # type: ignore[arg-type]
    result = run_ladder(url, spec)
    assert result.aborted is None, result.aborted
    return result.levels[0]


@pytest.mark.timing  # a rate against the model: read 4-5% low beside busy neighbours on three workers
@pytest.mark.parametrize(("api", "chunk_tokens", "workers", "lockstep"), [
    ("completions", 1, 1, False),
    ("completions", 4, 1, True),   # multi-token chunks of a decode batch streaming in step
    ("chat", 2, 2, False),          # two client processes
    ("generate", 3, 1, True),
])
def test_rate_and_latencies_are_right_when_no_request_ends(api: str, chunk_tokens: int, workers: int,
                                                           lockstep: bool) -> None:
    rate = 8.0  # tokens/s per stream: 8,192 tok/s in all, a request needs 128 s
    args = ["--per-stream-rate", str(rate), "--chunk-tokens", str(chunk_tokens), "--ttft", "0.3"]
    with clock_server(*args, *(["--lockstep"] if lockstep else [])) as url:
        lv = _level(url, api=api, workers=workers)
    assert lv.completed == 0 and lv.mean_e2e_latency_ms is None
    assert lv.output_throughput == pytest.approx(STREAMS * rate, rel=0.03)
    assert lv.output_tokens_counted == "server"
    assert lv.mean_tpot_ms == pytest.approx(1000 / rate, rel=0.03)
    # The mean, not the median: a loaded client reads two chunks of a stream together now and then
    # (gaps 0 and 2x instead of 1x and 1x), which moves the median but not the mean.
    assert lv.mean_itl_ms == pytest.approx(1000 * chunk_tokens / rate, rel=0.03)
    assert lv.mean_ttft_ms is not None and lv.mean_ttft_ms >= 300
    assert lv.concurrency == pytest.approx(STREAMS, rel=0.03)


@pytest.mark.timing  # a rate against the model
def test_a_window_does_not_open_on_chunks_read_late() -> None:
    """The client's loop is held (as a busy box holds it) while every stream's first token comes,
    then reads them late, with the warm-up ending on that backlog. Each stream's next chunk comes
    on time 1 s on, and a window opened on the backlog spread it over the short gap after it:
    11-12% high here, 4.6% in CI where the climb itself had left the client behind."""
    held: list[float] = []

    def hold() -> None:  # polled every tick of the client's loop, as the study's log check is
        held.append(time.perf_counter())
        if len(held) > 1 and held[-1] - held[0] >= 1.0 and held[-2] - held[0] < 1.0:
            time.sleep(max(0.0, held[0] + 2.9 - held[-1]))  # first tokens are due 2-2.3 s in

    with clock_server("--per-stream-rate", "8", "--chunk-tokens", "8", "--ttft", "1.5", "--lockstep") as url:
        spec = LadderSpec(concurrency=(STREAMS,), input_len=32, output_len=OUTPUT_LEN, duration_s=6.0,
                          warmup_s=1.0, converge_ci=0.002)
        lv = run_ladder(url, spec, should_abort=hold).levels[0]
    assert lv.output_throughput == pytest.approx(STREAMS * 8, rel=0.03)
    assert lv.mean_tpot_ms == pytest.approx(1000 / 8, rel=0.03)


@pytest.mark.timing  # a rate against the model: read 3.0% high beside busy neighbours (CI, 2026-12-06)
def test_a_cohort_start_is_not_taken_for_the_steady_state() -> None:
    """All streams start at once and their first tokens come over 3 s (a prefill queue), far
    past the 0.5 s warm-up; the window must measure the decode rate after the climb."""
    with clock_server("--per-stream-rate", "4", "--chunk-tokens", "2", "--ttft", "0.5",
                      "--ttft-step", str(3.0 / STREAMS), "--lockstep") as url:
        lv = _level(url, duration_s=8.0, warmup_s=0.5, converge_ci=0.05)
    assert lv.output_throughput == pytest.approx(STREAMS * 4, rel=0.03)
    assert lv.mean_tpot_ms == pytest.approx(1000 / 4, rel=0.03)


@pytest.mark.timing  # a rate against the model: read 3.3% high beside three workers (fresh-clone CI, 2026-12-06)
def test_a_server_that_queues_part_of_the_level_is_measured_once_the_rest_decode(tmp_path: Path) -> None:
    """A running cap below the level: 512 of 1,024 streams decode, the rest wait for a slot
    (for minutes at this length). The warm-up ends once the decoding count stops growing."""
    landscape = tmp_path / "capped.py"
    landscape.write_text("def startup(flags, env):\n    return None\n\n"
                         "def throughput(flags, env, running):\n    return 2000.0\n\n"
                         "def max_running_requests(flags, env):\n    return 512\n")
    with start_emulator(tmp_path, landscape) as server:
        lv = _level(server.url, input_len=16, duration_s=6.0, warmup_s=1.0)
    assert lv.output_throughput == pytest.approx(2000.0, rel=0.03)
    assert lv.mean_tpot_ms == pytest.approx(1000 * 512 / 2000.0, rel=0.03)


def test_a_server_without_running_counts_is_read_from_its_text() -> None:
    """Usage only at the end and 3 tokens a chunk: once requests finish, characters per token
    (here 4) turn the running requests' text into tokens; never one token a chunk."""
    with clock_server("--per-stream-rate", "32", "--chunk-tokens", "3", "--ttft", "0.1", "--no-running-usage") as url:
        lv = _level(url, concurrency=(128,), output_len=48, duration_s=6.0)
    assert lv.completed > 0
    assert lv.output_tokens_counted == "text"
    # The rate while decoding is 128 x 32 tok/s; one token a chunk would read a third of it. Streams
    # turn over every ~1.6 s (1.5 s of decode, TTFT, the client's round trip), and that duty cycle
    # lowers the average: 0.9 of the decode rate alone, 0.79 in CI beside two other workers.
    assert 0.6 * 128 * 32 < lv.output_throughput <= 1.03 * 128 * 32
    # The server's own TPOT: after the first token, 47 come in 16 chunks of 3 (the last of 2), one
    # chunk each 3/32 s: 1.5 s / 47, 2% above 1000/32 (a test that expected 1000/32 failed in CI at
    # 32.9 ms, 3% above the server's). Latencies of 1.5 s requests move with a loaded box by a few per cent.
    assert lv.mean_tpot_ms == pytest.approx(1000 * math.ceil(47 / 3) * (3 / 32) / 47, rel=0.05)


@pytest.mark.timing  # a rate against the model: read 3.8% high, then 7.7% low, beside three workers (CI, 2026-12-06)
def test_the_emulator_at_the_seed_shape_reads_its_flat_rate(tmp_path: Path) -> None:
    """1,024 streams x 1,024-token outputs on the emulator with a flat 3,000 tok/s landscape,
    the shape that once read 64x the truth. A stream decodes at most 30 tok/s, as a real decode
    step bounds it: a wholly flat rate gave the first request to finish prefill all 3,000 tok/s
    while the rest queued, and on a loaded box it ended inside the level (seen once in CI)."""
    landscape = tmp_path / "flat.py"
    landscape.write_text("def startup(flags, env):\n    return None\n\n"
                         "def throughput(flags, env, running):\n    return min(3000.0, 30.0 * running)\n\n"
                         "def max_running_requests(flags, env):\n    return 4096\n")
    with start_emulator(tmp_path, landscape) as server:
        lv = _level(server.url, input_len=16, duration_s=8.0)
    assert lv.completed == 0
    assert lv.output_throughput == pytest.approx(3000.0, rel=0.03)
    assert lv.mean_tpot_ms == pytest.approx(1000 * STREAMS / 3000.0, rel=0.03)


@pytest.mark.timing  # a rate against the model: skewed by busy neighbours
def test_a_cohort_that_turns_over_inside_the_level_is_measured_over_a_whole_cycle() -> None:
    """Requests shorter than the level, all started at once: 4 s of decoding after a 2 s TTFT.
    Bins from the cohort's first decoding agree closely (its 4 s hold the 10 bins the early end
    needs) but read the decode rate, 2,048 tok/s; the closed loop's rate counts the 2 s without
    tokens each cycle, 256 x 33 tokens every ~6 s. The window must span whole cycles: 12 s is
    1.9 of them, and a window that ended in the tokenless gap read 3-6% high."""
    with clock_server("--per-stream-rate", "8", "--chunk-tokens", "2", "--ttft", "2", "--lockstep") as url:
        lv = _level(url, concurrency=(256,), output_len=33, duration_s=12.0, warmup_s=0.5, converge_ci=0.05)
    assert lv.completed > 0 and lv.median_e2e_latency_ms is not None
    # A stream's cycle on the server's clock: its answer ends on a 0.25 s chunk tick, the client sends
    # the next, whose first token comes 2 s later, rounded up to a tick, and its last 4 s after that:
    # 6.25 s while the client re-sends within a tick. The first cohort's E2E (all the window holds when
    # it is one cycle) adds the client's connection setup: 0.3-0.5 s on a loaded box (CI read a window
    # of 0.93 of it). A window of 1.9 cycles, the bug this guards, is 6.0 s a cycle for two.
    cycles = round(lv.duration / (lv.median_e2e_latency_ms / 1000))
    assert cycles >= 1 and 6.25 * 0.99 <= lv.duration / cycles <= lv.median_e2e_latency_ms / 1000 * 1.02
    # Whole cycles hold one answer a stream each: 256 x 33 tokens a cycle. The bug read 3-6% high. A
    # client on a loaded box re-sends some streams late, whose answers then end past the window: that
    # reads low, never high (CI, alone with the timing tests, 2026-12-07: 5.9% low).
    expected = 256 * 33 * cycles / lv.duration
    assert 0.90 * expected <= lv.output_throughput <= 1.05 * expected
