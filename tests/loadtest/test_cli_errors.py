"""`search bench` answers bad options and unreachable servers with one line and exit 2."""

from __future__ import annotations

import socket

import pytest

from search.cli import main


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(["bench", *argv])
    return int(exc.value.code), capsys.readouterr().err.strip()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when this returns: nothing listens there


def test_unreachable_url(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    code, err = _run([url, "--concurrency", "4", "--requests", "4"], capsys)
    assert code == 2
    assert err == f"error: cannot reach {url}: connection refused — is the server running?"


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--concurrency", "0"], "--concurrency: '0' has a level below 1"),
        (["--concurrency", "8,x"], "--concurrency: '8,x' is not a comma-separated list of integers"),
        (["--duration", "abc"], "--duration: 'abc' is not a positive duration"),
        (["--duration", "10s", "--requests", "5"], "give exactly one of --duration and --requests"),
        (["--requests", "0"], "--requests must be at least 1"),
        (["--api", "grpc"], "--api must be one of completions, chat, generate"),
        (["--workers", "many"], "--workers: 'many' is not a number of processes or auto"),
        (["--workers", "0"], "--workers must be at least 1 (or auto)"),
        # Huge values once hung the client at 100% CPU, growing 130 MB/s: refused before any work.
        (["--input-len", "100000000000"], "--input-len / --output-len: at most 16,777,216 tokens"),
        (["--concurrency", "100000000"], "--concurrency: 100000000 streams is over the 65,536"),
        (["--range-ratio", "0"], "--range-ratio must be in (0, 1], got 0.0"),
        (["--request-rate", "2,x"], "--request-rate: '2,x' is not a comma-separated list of requests/s"),
        (["--request-rate", "0"], "--request-rate: every level must be a positive number of requests/s"),
        (["--request-rate", "4", "--workers", "2"], "--request-rate levels run in one client process"),
        (["--burstiness", "0"], "--burstiness must be positive (1: Poisson)"),
        (["--goodput", "itl:5"], "--goodput: give KEY:MS with KEY in ttft, tpot, e2el"),
        (["--goodput", "ttft:fast"], "--goodput: 'ttft:fast' is not KEY:MS"),
        (["--shared-prefix", "1,2"], "--shared-prefix: '1,2' is not GROUPS,PROMPTS_PER_GROUP,SYSTEM_LEN,QUESTION_LEN"),
        (["--shared-prefix", "0,2,3,4"], "shared_prefix: groups must be at least 1"),
        (["--dataset", "x.jsonl", "--shared-prefix", "1,2,3,4"], "give one workload: a dataset or a shared prefix"),
    ],
)
def test_bad_option(option: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Options are checked before the URL is contacted: a closed port proves it.
    code, err = _run([f"http://127.0.0.1:{_closed_port()}", *option], capsys)
    assert code == 2
    assert err.startswith(f"error: {message}") and "\n" not in err
