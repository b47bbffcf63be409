"""The correctness gate on a corrupting landscape, and `search bench` end to end on the emulator."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from search.cli import main
from search.correctness import PROMPTS, collect_answers, compare

from .server import Server, start_emulator
from .test_ladder_emulator import modelled

# A fast landscape (the gate is about answers, not speed); the corrupting one differs only there.
_FAST = '''
def startup(flags, env):
    return None

def throughput(flags, env, running):
    return 2000.0 * running

def corrupt(flags, env):
    return {corrupt}
'''


def _landscape(directory: Path, corrupt: bool) -> Path:
    path = directory / f"landscape_{corrupt}.py"
    path.write_text(_FAST.format(corrupt=corrupt))
    return path


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    state = tmp_path_factory.mktemp("fast-emulator")
    with start_emulator(state, _landscape(state, corrupt=False)) as server:
        yield server


@pytest.mark.parametrize("api", ["completions", "chat", "generate"])
def test_greedy_answers_are_a_stable_fingerprint(fast: Server, api: str) -> None:
    first = collect_answers(fast.url, api)
    assert len(first) == len(PROMPTS) and all(first)
    assert compare(first, collect_answers(fast.url, api)) == []


def test_corrupting_config_is_flagged(fast: Server, tmp_path: Path) -> None:
    baseline = collect_answers(fast.url)
    with start_emulator(tmp_path, _landscape(tmp_path, corrupt=True)) as corrupted:
        answers = collect_answers(corrupted.url)
    assert compare(baseline, answers) == list(range(len(PROMPTS)))


def test_bench_json_on_the_emulator(emulator: Server, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", emulator.url, "--concurrency", "8,4", "--input-len", "32", "--output-len", "16",
              "--requests", "16", "--json"])
    assert exc.value.code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["aborted"] is None
    assert [lv["max_concurrency"] for lv in out["levels"]] == [4, 8]
    for lv in out["levels"]:
        assert lv["completed"] == 16 and lv["total_output_tokens"] == 256 and lv["errors"] == {}
        assert lv["output_throughput"] > 0 and lv["p99_itl_ms"] >= lv["median_itl_ms"]


@pytest.mark.timing
def test_bench_json_matches_the_landscape(emulator: Server, capsys: pytest.CaptureFixture[str]) -> None:
    # What a user reads from `search bench --json`, loosely against the modelled rate.
    with pytest.raises(SystemExit) as exc:
        main(["bench", emulator.url, "--concurrency", "16,32", "--input-len", "64", "--output-len", "64",
              "--duration", "4s", "--warmup", "1s", "--json"])
    assert exc.value.code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["aborted"] is None and [lv["max_concurrency"] for lv in out["levels"]] == [16, 32]
    for lv in out["levels"]:
        rate = modelled(lv["max_concurrency"])
        assert lv["output_throughput"] == pytest.approx(rate, rel=0.1)
        assert lv["median_itl_ms"] == pytest.approx(1000 * lv["max_concurrency"] / rate, rel=0.2)
        assert lv["concurrency"] == pytest.approx(lv["max_concurrency"], rel=0.1)
        assert lv["errors"] == {}


def test_bench_table_on_the_emulator(emulator: Server, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", emulator.url, "--concurrency", "4", "--input-len", "16", "--output-len", "16",
              "--duration", "1s", "--warmup", "0s"])
    assert exc.value.code == 0
    captured = capsys.readouterr()
    assert "out tok/s" in captured.out and "concurrency 4:" in captured.err


def test_bench_exits_1_when_the_server_dies(own_emulator: Server, capsys: pytest.CaptureFixture[str]) -> None:
    threading.Timer(1.5, own_emulator.kill, args=(signal.SIGTERM,)).start()
    with pytest.raises(SystemExit) as exc:
        main(["bench", own_emulator.url, "--concurrency", "8", "--input-len", "16", "--output-len", "256",
              "--duration", "60s", "--warmup", "0s"])
    assert exc.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: load test aborted at concurrency 8: ")
