"""Against a minimal stub server: a failing server stops the ladder, a server without usage is counted."""

from __future__ import annotations

import pytest

from search.cli import main
from search.loadtest import LadderSpec, run_ladder

from .server import stub_server


@pytest.mark.parametrize(("levels", "where"), [(["--concurrency", "2,4"], "concurrency 2"),
                                               (["--request-rate", "50,100"], "rate 50 req/s")])
def test_every_request_failing_exits_1(levels: list[str], where: str, capsys: pytest.CaptureFixture[str]) -> None:
    # 10 requests are under the 20 the running check waits for: the level's end decides.
    with stub_server(fail_every=1) as url, pytest.raises(SystemExit) as exc:
        main(["bench", url, *levels, "--requests", "10", "--json"])
    assert exc.value.code == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: load test aborted at {where}: 10 of 10 requests failed (http_500: 10), "
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


def test_a_server_that_never_answers_fails_the_level(capsys: pytest.CaptureFixture[str]) -> None:
    """It takes every request and sends nothing: no measurement of zero, a failure (exit 1)."""
    with stub_server(silent=True) as url, pytest.raises(SystemExit) as exc:
        main(["bench", url, "--concurrency", "4", "--duration", "1s", "--warmup", "0.5s"])
    assert exc.value.code == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: load test aborted at concurrency 4: no request finished or streamed within the level")


def test_usage_counts_over_what_the_request_allows_are_bad_responses() -> None:
    """A server claiming 999,999,999 tokens for a 4-token request was once read as 22 billion tok/s."""
    spec = LadderSpec(concurrency=(2,), input_len=8, output_len=4, requests=6, duration_s=None)
    with stub_server(claimed_tokens=999_999_999) as url:
        result = run_ladder(url, spec)
    assert result.levels == [] and result.aborted is not None
    assert result.aborted.startswith("6 of 6 requests failed (implausible_usage: 6)")


def test_a_shape_longer_than_the_server_s_context_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with stub_server() as url, pytest.raises(SystemExit) as exc:
        main(["bench", url, "--input-len", "4000", "--output-len", "512", "--requests", "4"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: --input-len 4000 + --output-len 512 exceeds the context length 4096 of the model "
                   f"at {url}; use a shorter shape")
