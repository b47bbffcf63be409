"""Against a minimal stub server: a failing server stops the ladder, a server without usage is counted."""

from __future__ import annotations

import pytest

from search.cli import main
from search.loadtest import LadderSpec, run_ladder

from .server import stub_server


def test_every_request_failing_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    # 10 requests are under the 20 the running check waits for: the level's end decides.
    with stub_server(fail_every=1) as url, pytest.raises(SystemExit) as exc:
        main(["bench", url, "--concurrency", "2,4", "--requests", "10", "--json"])
    assert exc.value.code == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: load test aborted at concurrency 2: 10 of 10 requests failed (http_500: 10), "
        "over the 5% threshold")


def test_errors_over_the_threshold_at_a_levels_end_abort() -> None:
    spec = LadderSpec(concurrency=(2, 4), input_len=8, output_len=4, requests=10, duration_s=None)
    with stub_server(fail_every=4) as url:  # POSTs 4 and 8 fail: 20% of 10
        result = run_ladder(url, spec)
    assert result.levels == [] and result.aborted_at == 2
    assert result.aborted == "2 of 10 requests failed (http_500: 2), over the 5% threshold"


def test_without_a_usage_chunk_tokens_are_counted_from_chunks() -> None:
    spec = LadderSpec(concurrency=(3,), input_len=8, output_len=5, requests=6, duration_s=None)
    with stub_server(usage=False) as url:
        lv = run_ladder(url, spec).levels[0]
    assert lv.errors == {} and lv.completed == 6
    assert lv.total_output_tokens == 6 * 5  # one token per content chunk
    assert lv.total_input_tokens == 6 * 8  # no usage: the prompt's length as sent
    assert lv.mean_tpot_ms is not None
