"""`search bench URL`: load-test a running SGLang server up a concurrency ladder."""

from __future__ import annotations

import json
import sys

import typer
from rich.console import Console
from rich.table import Table

from search.errors import BadInput, RunFailed
from search.loadtest import (
    LadderResult,
    LadderSpec,
    LevelResult,
    check_reachable,
    parse_concurrency,
    parse_duration,
    parse_goodput,
    parse_rates,
    run_ladder,
)
from search.loadtest.workload import SharedPrefix

_COLUMNS = (  # header, LevelResult key, format
    ("conc", "max_concurrency", "{:d}"),
    ("rate req/s", "request_rate", "{:g}"),
    ("achieved", "concurrency", "{:.1f}"),
    ("out tok/s", "output_throughput", "{:,.1f}"),
    ("total tok/s", "total_throughput", "{:,.1f}"),
    ("req/s", "request_throughput", "{:.2f}"),
    ("goodput req/s", "request_goodput", "{:.2f}"),
    ("TTFT p50/p99 ms", ("median_ttft_ms", "p99_ttft_ms"), "{:.0f}/{:.0f}"),
    ("ITL p50/p99 ms", ("median_itl_ms", "p99_itl_ms"), "{:.1f}/{:.1f}"),
    ("TPOT mean ms", "mean_tpot_ms", "{:.1f}"),
    ("E2E p50 ms", "median_e2e_latency_ms", "{:.0f}"),
    ("done", "completed", "{:d}"),
    ("errors", "errors", None),
    ("window s", "duration", "{:.1f}"),
    ("client", ("client_processes", "client_cpu"), "{:d}x {:.0%}"),
)


def _cell(level: LevelResult, key: str | tuple[str, ...], fmt: str | None) -> str:
    if key == "errors":
        return ", ".join(f"{k}:{n}" for k, n in level.errors.items()) or "0"
    values = [getattr(level, k) for k in (key if isinstance(key, tuple) else (key,))]
    if None in values:
        return "-"  # no sample in the window (e.g. no request finished in it)
    text = fmt.format(*values) if fmt else str(values[0])
    return text + (" (converged)" if key == "duration" and level.ended_early else "")


def _table(result: LadderResult) -> Table:
    table = Table(title="Load test (bench_serving metrics; steady-state window per level)")
    for header, _, _ in _COLUMNS:
        table.add_column(header, justify="right")
    for level in result.levels:
        table.add_row(*(_cell(level, key, fmt) for _, key, fmt in _COLUMNS))
    return table


def _workers(text: str) -> int | None:
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise BadInput(f"--workers: {text!r} is not a number of processes or auto") from None


def _shared_prefix(text: str | None) -> SharedPrefix | None:
    if text is None:
        return None
    try:
        groups, prompts, system, question = (int(part) for part in text.split(","))
    except ValueError:
        raise BadInput(f"--shared-prefix: {text!r} is not GROUPS,PROMPTS_PER_GROUP,SYSTEM_LEN,QUESTION_LEN, "
                       "e.g. 16,32,2048,128") from None
    return SharedPrefix(groups, prompts, system, question)


def bench(
    url: str = typer.Argument(..., help="Base URL of the server, e.g. http://127.0.0.1:30000"),
    concurrency: str = typer.Option("64,256,512,1024", help="Comma-separated concurrency levels, run ascending."),
    input_len: int = typer.Option(1024, help="Prompt length in tokens (random token ids)."),
    output_len: int = typer.Option(512, help="Output length in tokens (ignore_eos + max_tokens)."),
    duration: str | None = typer.Option(None, help="Measured window per level, e.g. 60s or 2m (default 60s); "
                                                    "a level ends sooner once its throughput has converged."),
    requests: int | None = typer.Option(None, help="Instead of --duration: exactly N requests per level, "
                                                   "counted as sglang.bench_serving --num-prompts N does."),
    warmup: str = typer.Option("10s", help="Uncounted warm-up per level (duration mode)."),
    api: str = typer.Option("completions", help="completions | chat | generate"),
    workers: str = typer.Option("auto", help="Client processes for the streams: N, or auto (one, and more "
                                             "for a level where it used a whole core)."),
    range_ratio: float = typer.Option(1.0, help="Random lengths uniform in [ratio x len, len] per request "
                                                "(bench_serving's --random-range-ratio)."),
    dataset: str | None = typer.Option(None, help="Replay a JSON/JSONL file: ShareGPT conversations, or one "
                                                  "request a line (prompt or messages, optional output_len)."),
    shared_prefix: str | None = typer.Option(None, help="GROUPS,PROMPTS_PER_GROUP,SYSTEM_LEN,QUESTION_LEN: "
                                                        "bench_serving's generated-shared-prefix (--output-len each)."),
    request_rate: str | None = typer.Option(None, help="Open-loop levels instead of --concurrency: requests/s, "
                                                       "e.g. 2,4,8 (Poisson arrivals)."),
    burstiness: float = typer.Option(1.0, help="Gamma arrivals' shape: 1 Poisson, <1 burstier, >1 steadier."),
    goodput: list[str] = typer.Option([], help="An SLO for goodput, KEY:MS with KEY ttft, tpot or e2el; repeat "
                                                "for several (bench_serving's --goodput)."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON instead of a table."),
) -> None:
    """Load-test a running server (SGLang or anything OpenAI-compatible) up a concurrency ladder."""
    prefix = _shared_prefix(shared_prefix)
    spec = LadderSpec(
        concurrency=parse_concurrency(concurrency),
        input_len=prefix.input_len if prefix else input_len,
        output_len=output_len,
        duration_s=parse_duration(duration) if duration else (None if requests is not None else 60.0),
        requests=requests,
        warmup_s=parse_duration(warmup, "--warmup", allow_zero=True),
        api=api,
        workers=_workers(workers),
        range_ratio=range_ratio,
        dataset=dataset,
        shared_prefix=prefix,
        request_rates=parse_rates(request_rate) if request_rate else (),
        burstiness=burstiness,
        goodput=parse_goodput(goodput),
    )
    check_reachable(url)
    err = Console(stderr=True)

    def on_level(level: LevelResult) -> bool:
        where = (f"rate {level.request_rate:g} req/s" if level.request_rate is not None
                 else f"concurrency {level.max_concurrency}")
        err.print(f"{where}: {level.output_throughput:,.1f} output tok/s"
                  + (" (converged early)" if level.ended_early else ""))
        return True

    result = run_ladder(url, spec, on_level=on_level)
    if json_out:
        json.dump(result.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif result.levels:
        out = Console()
        # Piped output would be cut to 80 columns: give the table room instead.
        (out if out.is_terminal else Console(width=200)).print(_table(result))
    if result.aborted:
        where = f"rate {result.aborted_at:g} req/s" if spec.open_loop else f"concurrency {result.aborted_at:g}"
        raise RunFailed(f"load test aborted at {where}: {result.aborted}")
