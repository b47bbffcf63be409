"""Workloads, open-loop rates and goodput, measured against a server of known behaviour.

tests/loadtest/clock_server.py records every request body it receives (``--record``), so each
workload is checked on what the server really got; its TTFT grows by a known step per arrival,
so exactly a known number of requests meet a TTFT SLO.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest

from search.cli import main
from search.errors import BadInput
from search.loadtest import LadderSpec, LevelResult, run_ladder
from search.loadtest.client import Prompts
from search.loadtest.streams import Arrivals, make_session
from search.loadtest.workload import SharedPrefix

from .server import clock_server


def _run(url: str, **kw: object) -> LevelResult:
    shape: dict[str, object] = {"concurrency": (16,), "input_len": 64, "output_len": 8, "requests": 64,
                                "duration_s": None, **kw}
    result = run_ladder(url, LadderSpec(**shape))  # type: ignore[arg-type]
    assert result.aborted is None, result.aborted
    return result.levels[0]


def _bodies(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@contextlib.contextmanager
def _recording(where: Path) -> Iterator[tuple[str, Path]]:
    """A fast clock server that records what it receives: (its URL, the file of request bodies)."""
    where.mkdir(parents=True, exist_ok=True)
    log = where / "requests.jsonl"
    with clock_server("--per-stream-rate", "400", "--ttft", "0.01", "--record", str(log)) as url:
        yield url, log


def test_random_range_ratio_draws_lengths_as_bench_serving(tmp_path: Path) -> None:
    with _recording(tmp_path) as (url, log):
        lv = _run(url, input_len=200, output_len=40, range_ratio=0.5, requests=200, concurrency=(32,))
    bodies = _bodies(log)
    inputs = [len(b["prompt"]) for b in bodies]  # type: ignore[arg-type]
    outputs = [b["max_tokens"] for b in bodies]
    assert len(bodies) == 200 and min(inputs) >= 100 and max(inputs) <= 200
    assert min(outputs) >= 20 and max(outputs) <= 40  # type: ignore[type-var]
    assert statistics.mean(inputs) == pytest.approx(150, rel=0.06)  # uniform in [100, 200]
    assert len(set(inputs)) > 50  # spread, not a few fixed shapes
    assert lv.total_input_tokens == sum(inputs) and lv.total_output_tokens == sum(outputs)  # type: ignore[arg-type]


def test_shared_prefix_sends_groups_that_share_their_system_prompt(tmp_path: Path) -> None:
    with _recording(tmp_path) as (url, log):
        lv = _run(url, shared_prefix=SharedPrefix(4, 8, 48, 16), input_len=64, requests=32)
    prompts = [b["prompt"] for b in _bodies(log)]
    assert len(prompts) == 32 and all(len(p) == 64 for p in prompts)  # type: ignore[arg-type]
    groups: dict[tuple[int, ...], int] = {}
    for p in prompts:
        key = tuple(p[:48])  # type: ignore[index]
        groups[key] = groups.get(key, 0) + 1
    assert sorted(groups.values()) == [8, 8, 8, 8]  # 4 system prompts, 8 questions each
    assert len({tuple(p[48:]) for p in prompts}) == 32  # type: ignore[index]
    assert lv.total_input_tokens == 32 * 64


def test_a_dataset_is_replayed_shuffled_by_seed_with_its_output_lengths(tmp_path: Path) -> None:
    data = tmp_path / "log.jsonl"
    lines = [{"prompt": f"question {i} " + "word " * i, "output_len": 2 + i % 5} for i in range(20)]
    data.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    orders = []
    for seed in (0, 0, 1):
        with _recording(tmp_path / str(len(orders))) as (url, log):
            lv = _run(url, dataset=str(data), requests=20, concurrency=(1,), seed=seed)
        bodies = _bodies(log)
        orders.append([b["prompt"] for b in bodies])
        assert sorted(b["prompt"] for b in bodies) == sorted(x["prompt"] for x in lines)
        assert {b["prompt"]: b["max_tokens"] for b in bodies} == {x["prompt"]: x["output_len"] for x in lines}
        assert lv.total_output_tokens == sum(x["output_len"] for x in lines)  # type: ignore[misc]
        # the server's usage, not an estimate, gives the prompt's tokens: here its words
        assert lv.total_input_tokens == sum(len(str(x["prompt"]).split()) for x in lines)
    assert orders[0] == orders[1] != orders[2]


def test_sharegpt_conversations_and_chat_messages(tmp_path: Path) -> None:
    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps([
        {"conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "x" * 40}]},
        {"conversations": [{"from": "human", "value": "alone"}]},  # no reply: skipped, as bench_serving does
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "why"}],
         "output_len": 3},
    ]))
    with _recording(tmp_path) as (url, log):
        _run(url, dataset=str(data), requests=2, concurrency=(1,), api="chat")
    bodies = sorted(_bodies(log), key=lambda b: int(b["max_tokens"]))  # type: ignore[call-overload]
    assert [b["max_tokens"] for b in bodies] == [3, 10]  # a reply of 40 characters asks 10 tokens
    assert bodies[0]["messages"][0] == {"role": "system", "content": "be brief"}  # type: ignore[index]
    assert bodies[1]["messages"] == [{"role": "user", "content": "hi there"}]


def test_a_bad_dataset_is_one_clear_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": 1}\n')
    with clock_server("--per-stream-rate", "100") as url, pytest.raises(BadInput, match=r"entry 2: an entry needs"):
        _run(url, dataset=str(bad))
    with pytest.raises(BadInput, match="range-ratio"):
        LadderSpec(range_ratio=0.0)


@pytest.mark.parametrize("burstiness", [1.0, 4.0])
def test_open_loop_sends_at_the_rate_with_gamma_gaps(tmp_path: Path, burstiness: float) -> None:
    """Gaps of mean 1/rate whose spread is gamma's: coefficient of variation 1/sqrt(burstiness)."""
    with _recording(tmp_path) as (url, log):
        result = run_ladder(url, LadderSpec(request_rates=(100.0,), burstiness=burstiness, requests=400,
                                            duration_s=None, input_len=16, output_len=4))
    assert result.aborted is None and len(_bodies(log)) == 400
    lv = result.levels[0]
    assert lv.request_rate == 100.0 and lv.max_concurrency == 0
    # 400 gaps: the mean within 3 standard errors of the gamma's
    assert lv.request_throughput == pytest.approx(100.0, rel=3 / (400 * burstiness) ** 0.5)
    assert lv.completed == 400


def test_open_loop_gap_spread_follows_burstiness(tmp_path: Path) -> None:
    """Gaps as sent (before network jitter): coefficient of variation 1/sqrt(burstiness)."""
    async def sends(url: str, spec: LadderSpec) -> list[float]:
        async with make_session(spec) as session:
            src = Arrivals(session, url, spec, Prompts(spec, "clock", random.Random(0)), 50.0, 300, random.Random(7))
            while not src.done():
                await asyncio.sleep(0.05)
            await src.close()
            return [r.send for r in src.records]

    cvs = []
    for burstiness in (1.0, 4.0):
        spec = LadderSpec(request_rates=(50.0,), burstiness=burstiness, requests=300, duration_s=None,
                          input_len=8, output_len=2)
        with _recording(tmp_path / str(burstiness)) as (url, _):
            times = asyncio.run(sends(url, spec))
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        cvs.append(statistics.stdev(gaps) / statistics.mean(gaps))
    assert cvs[0] == pytest.approx(1.0, abs=0.2) and cvs[1] == pytest.approx(0.5, abs=0.12)


def test_open_loop_replays_a_schedule_of_send_times(tmp_path: Path) -> None:
    """Given send times (another client's draw, a trace), the level sends at them, in order, and no
    more requests than it has; the gaps as sent are the schedule's (no gamma draw)."""
    schedule = (0.0, 0.0, 0.05, 0.2, 0.2, 0.3)
    spec = LadderSpec(request_rates=(20.0,), requests=10, duration_s=None, input_len=8, output_len=2,
                      schedule=schedule)

    async def sends(url: str) -> list[float]:
        async with make_session(spec) as session:
            src = Arrivals(session, url, spec, Prompts(spec, "clock", random.Random(0)), 20.0, 10, random.Random(7))
            while len(src.records) < len(schedule) or not all(r.end for r in src.records):
                await asyncio.sleep(0.05)
            await src.close()
            return [r.send for r in src.records]

    with _recording(tmp_path) as (url, log):
        times = asyncio.run(sends(url))
    assert len(times) == len(schedule) == len(_bodies(log))
    offsets = [t - times[0] for t in times]
    assert offsets == sorted(offsets) and offsets[3] >= 0.2 and offsets[2] < offsets[3]
    with pytest.raises(BadInput, match="arrival schedule"):
        LadderSpec(request_rates=(1.0,), schedule=(0.5, 0.1))


@pytest.mark.timing  # a rate against the model: skewed by busy neighbours
def test_goodput_counts_the_requests_that_meet_every_slo(tmp_path: Path) -> None:
    """The k-th arrival's TTFT at the server is 50 + 100k ms: with a 1,045 ms TTFT SLO exactly 10 of 40
    meet it. The client's own delays only add to what it reads, so the SLO sits just under the 11th
    arrival's 1,050 ms and leaves the 10th 95 ms of them (at 25 ms it read 9 of 40 on a slow box)."""
    with clock_server("--per-stream-rate", "200", "--ttft", "0.05", "--ttft-step", "0.1") as url:
        lv = _run(url, concurrency=(40,), requests=40, output_len=4, goodput={"ttft": 1045.0})
    with clock_server("--per-stream-rate", "200", "--ttft", "0.05") as url:
        loose = _run(url, concurrency=(40,), requests=40, output_len=4,
                     goodput={"ttft": 60_000.0, "tpot": 1.0})  # 5 ms per token: none meets 1 ms TPOT
    assert lv.slo_attainment == pytest.approx(10 / 40)
    assert lv.slo_attainment_by_metric == {"ttft": lv.slo_attainment}  # one SLO: its share is the whole
    assert lv.request_goodput == pytest.approx(10 / lv.duration)
    assert loose.slo_attainment == 0.0 and loose.request_goodput == 0.0
    assert loose.slo_attainment_by_metric == {"ttft": 1.0, "tpot": 0.0}  # each SLO alone, as bench_serving's
    assert _run_without_slos(tmp_path).request_goodput is None


def test_search_bench_replays_a_dataset_at_a_rate_and_reports_goodput(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "log.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i} a b c", "output_len": 4}) + "\n" for i in range(10)))
    with _recording(tmp_path) as (url, log):
        try:
            main(["bench", url, "--dataset", str(data), "--request-rate", "40", "--requests", "20",
                  "--goodput", "ttft:5000", "--goodput", "e2el:10000", "--json"])
        except SystemExit as exc:
            assert exc.code in (0, None), capsys.readouterr().err
    level = json.loads(capsys.readouterr().out)["levels"][0]
    assert level["request_rate"] == 40.0 and level["completed"] == 20 and level["slo_attainment"] == 1.0
    assert level["request_goodput"] == pytest.approx(level["request_throughput"])
    assert level["total_output_tokens"] == 80 and len(_bodies(log)) == 20


def _run_without_slos(tmp_path: Path) -> LevelResult:
    with clock_server("--per-stream-rate", "200") as url:
        return _run(url, requests=8, concurrency=(4,))
