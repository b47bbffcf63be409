"""The ladder against the real emulator over real HTTP: metrics, early end, prune, abort."""

from __future__ import annotations

import threading

import pytest

from search.emulator.landscape import Landscape
from search.loadtest import LadderSpec, LevelResult, run_ladder
from search.manifests import load

from .server import SERVER_ARGS, Server


def modelled(concurrency: int) -> float:
    """The built-in landscape's output tok/s for the emulator's flags at this many streams."""
    flags = load().parse(SERVER_ARGS).values
    land = Landscape.load(None)
    return land.throughput(flags, {}, min(concurrency, land.max_running_requests(flags, {})))


@pytest.mark.timing
def test_metrics_match_the_landscape(emulator: Server) -> None:
    # Outputs long enough that prefill pauses barely dent the decode rate; a tight threshold keeps
    # the full 6 s window, longer than one request, so requests finish inside it.
    spec = LadderSpec(concurrency=(64, 16), input_len=64, output_len=64, duration_s=6.0, warmup_s=1.0,
                      converge_ci=1e-6)
    result = run_ladder(emulator.url, spec)
    assert result.aborted is None and [lv.max_concurrency for lv in result.levels] == [16, 64]  # ascending
    for lv in result.levels:
        rate = modelled(lv.max_concurrency)
        assert lv.output_throughput == pytest.approx(rate, rel=0.05)
        # Every stream decodes at rate / streams: ITL and TPOT follow from the model.
        assert lv.median_itl_ms == pytest.approx(1000 * lv.max_concurrency / rate, rel=0.15)
        assert lv.mean_tpot_ms == pytest.approx(1000 * lv.max_concurrency / rate, rel=0.15)
        assert lv.concurrency == pytest.approx(lv.max_concurrency, rel=0.05)
        assert lv.errors == {} and lv.completed > 0
        assert lv.median_ttft_ms <= lv.p90_ttft_ms <= lv.p99_ttft_ms  # type: ignore[operator]
        assert lv.median_e2e_latency_ms <= lv.p99_e2e_latency_ms  # type: ignore[operator]
        assert lv.total_throughput > lv.output_throughput
        assert lv.to_dict()["output_throughput"] == lv.output_throughput


@pytest.mark.timing
def test_converged_level_ends_early(emulator: Server) -> None:
    # A loose threshold so that a loaded test machine's jitter still converges well before 20 s.
    spec = LadderSpec(concurrency=(32,), input_len=32, output_len=32, duration_s=20.0, warmup_s=0.5,
                      converge_ci=0.08)
    lv = run_ladder(emulator.url, spec).levels[0]
    assert lv.ended_early and lv.converged
    assert lv.duration < 20.0
    assert lv.output_throughput_ci is not None and lv.output_throughput_ci < 0.08
    assert lv.output_throughput == pytest.approx(modelled(32), rel=0.1)


def test_on_level_false_prunes_the_rest(emulator: Server) -> None:
    seen: list[LevelResult] = []

    def on_level(level: LevelResult) -> bool:
        seen.append(level)
        return False

    spec = LadderSpec(concurrency=(4, 8), input_len=16, output_len=16, requests=8, duration_s=None)
    result = run_ladder(emulator.url, spec, on_level=on_level)
    assert result.pruned and result.levels == seen and len(seen) == 1 and seen[0].max_concurrency == 4


# The server's prompt_tokens per request for a 32-token prompt: token ids count exactly; chat's
# 32 one-token words gain the emulator's chat template (4 per message + 3), as SGLang's adds its own.
_PROMPT_TOKENS = {"completions": 32, "generate": 32, "chat": 32 + 4 + 3}


@pytest.mark.parametrize("api", ["completions", "chat", "generate"])
def test_requests_mode_counts_exact_tokens(emulator: Server, api: str) -> None:
    spec = LadderSpec(concurrency=(4,), input_len=32, output_len=16, requests=12, duration_s=None, api=api)
    lv = run_ladder(emulator.url, spec).levels[0]
    assert lv.errors == {} and lv.completed == 12
    assert lv.total_output_tokens == 12 * 16  # ignore_eos + max_tokens, counted by the server
    assert lv.total_input_tokens == 12 * _PROMPT_TOKENS[api]  # the server's count, not the setting
    assert 1.0 < lv.concurrency <= 4.0
    assert lv.output_throughput == pytest.approx(lv.total_output_tokens / lv.duration)


def test_should_abort_stops_the_ladder_at_once(emulator: Server) -> None:
    polls = 0

    def should_abort() -> str | None:
        nonlocal polls
        polls += 1
        return "server died (watcher)" if polls > 20 else None  # about 1 s in

    spec = LadderSpec(concurrency=(8, 16), input_len=16, output_len=16, duration_s=30.0, warmup_s=0.0)
    result = run_ladder(emulator.url, spec, should_abort=should_abort)
    assert result.aborted == "server died (watcher)" and result.aborted_at == 8 and result.levels == []


def test_server_killed_mid_ladder_aborts(own_emulator: Server) -> None:
    def on_level(level: LevelResult) -> bool:
        threading.Timer(1.0, own_emulator.kill).start()  # SIGKILL during the next level
        return True

    spec = LadderSpec(concurrency=(8, 16, 32), input_len=16, output_len=64, duration_s=2.0, warmup_s=0.2,
                      converge_ci=0.001)
    result = run_ladder(own_emulator.url, spec, on_level=on_level)
    assert [lv.max_concurrency for lv in result.levels] == [8]
    assert result.aborted_at == 16
    assert result.aborted is not None and "server died" in result.aborted
