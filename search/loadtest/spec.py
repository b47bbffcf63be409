"""What a load test runs: the ladder of concurrency levels and the shape of every request.

Validated on construction so that a bad option fails in one line before any request is sent.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from search.errors import BadInput
from search.loadtest.workload import SharedPrefix

APIS = ("completions", "chat", "generate")
GOODPUT_SLOS = ("ttft", "tpot", "e2el")  # bench_serving's --goodput keys, in milliseconds
# Sane maxima, checked before anything is built: past them the client's own prompts and tasks
# would eat the machine (a 10^11-token prompt once grew the client by 130 MB/s). The server's
# context length, when it tells, bounds the shape further (ladder.check_context).
MAX_CONCURRENCY = 65_536
MAX_TOKENS = 1 << 24


@dataclass(frozen=True)
class LadderSpec:
    """One load test: closed-loop levels in ascending concurrency, or open-loop request rates.

    The requests are the workload's (``search.loadtest.workload``): random of ``input_len`` x
    ``output_len`` with ``range_ratio``, a ``dataset`` file, or a ``shared_prefix``. With
    ``request_rates`` each level sends requests at that rate (req/s), Poisson arrivals, or gamma
    with ``burstiness`` (bench_serving's and vLLM's: shape ``burstiness``, mean ``1 / rate``),
    whatever the server's speed; otherwise each of ``concurrency`` streams sends its next request
    when its last ends. ``goodput`` (``{"ttft": ms, "tpot": ms, "e2el": ms}``, any of them) adds
    bench_serving's goodput to every level.

    A level runs either for ``duration_s`` (after an uncounted warm-up of ``warmup_s``,
    ending early once the output throughput has converged to ``converge_ci``, the 95%
    confidence half-width relative to the mean) or, when ``requests`` is set, for exactly
    that many requests counted from the first send to the last end, as
    ``sglang.bench_serving --num-prompts N --max-concurrency C`` does.
    """

    concurrency: tuple[int, ...] = (64, 256, 512, 1024)
    input_len: int = 1024
    output_len: int = 512
    duration_s: float | None = 60.0
    requests: int | None = None
    warmup_s: float = 10.0
    api: str = "completions"
    converge_ci: float = 0.02
    max_error_rate: float = 0.05
    seed: int = 0
    model: str | None = None
    request_timeout_s: float = 600.0  # a stream silent this long counts as a "timeout" error
    # Processes the streams run in; None: one, and more for a level where it used a whole core.
    workers: int | None = None
    range_ratio: float = 1.0
    dataset: str | None = None
    shared_prefix: SharedPrefix | None = None
    request_rates: tuple[float, ...] = ()
    burstiness: float = 1.0
    goodput: dict[str, float] | None = None
    # The highest rate under the SLOs (``{"p99_ttft_ms": ms, "p99_itl_ms": ms}``): the rates climb
    # until one misses them, then this many more levels bisect between the last that met them and
    # the first that did not (see ladder.RateSearch).
    rate_slos: dict[str, float] | None = None
    rate_search_steps: int = 0
    # Open loop: send times (s from the level's start, rising) replayed instead of drawn gaps, so
    # two clients (or two runs) offer the very same arrivals; requests past its end are not sent.
    schedule: tuple[float, ...] | None = None
    # bench_serving's pacing: each gap is slept after its send (serving.py:1127-1129), so the client's
    # own delays stretch the arrivals as bench_serving's do; False keeps an absolute clock.
    sleep_after_send: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "concurrency", tuple(sorted(set(self.concurrency))))
        if not self.concurrency or min(self.concurrency) < 1:
            raise BadInput("--concurrency: every level must be a positive integer, e.g. 64,256,512,1024")
        if self.input_len < 1 or self.output_len < 1:
            raise BadInput("--input-len and --output-len must be at least 1 token")
        if max(self.concurrency) > MAX_CONCURRENCY:
            raise BadInput(f"--concurrency: {max(self.concurrency)} streams is over the {MAX_CONCURRENCY:,} "
                           "this client runs; use fewer")
        if max(self.input_len, self.output_len) > MAX_TOKENS:
            raise BadInput(f"--input-len / --output-len: at most {MAX_TOKENS:,} tokens "
                           f"(got {max(self.input_len, self.output_len):,})")
        if (self.duration_s is None) == (self.requests is None):
            raise BadInput("give exactly one of --duration and --requests")
        if self.duration_s is not None and self.duration_s <= 0:
            raise BadInput("--duration must be positive, e.g. 60s")
        if self.requests is not None and self.requests < 1:
            raise BadInput("--requests must be at least 1")
        if self.warmup_s < 0:
            raise BadInput("warm-up must not be negative")
        if self.api not in APIS:
            raise BadInput(f"--api must be one of {', '.join(APIS)}, not {self.api!r}")
        if not 0 < self.converge_ci < 1:
            raise BadInput("convergence threshold must be a fraction between 0 and 1, e.g. 0.02")
        if self.workers is not None and self.workers < 1:
            raise BadInput("--workers must be at least 1 (or auto)")
        if not 0 <= self.max_error_rate <= 1:
            raise BadInput("max error rate must be a fraction between 0 and 1")
        if not 0 < self.range_ratio <= 1:
            raise BadInput(f"--range-ratio must be in (0, 1], got {self.range_ratio}")
        if self.dataset is not None and self.shared_prefix is not None:
            raise BadInput("give one workload: a dataset or a shared prefix, not both")
        object.__setattr__(self, "request_rates", tuple(sorted(set(self.request_rates))))
        if self.request_rates and not all(0 < r < float("inf") for r in self.request_rates):
            raise BadInput("--request-rate: every level must be a positive number of requests/s, e.g. 2,4,8")
        if self.request_rates and self.workers not in (None, 1):
            raise BadInput("--request-rate levels run in one client process; drop --workers")
        if self.burstiness <= 0:
            raise BadInput(f"--burstiness must be positive (1: Poisson), got {self.burstiness}")
        times = self.schedule
        if times is not None and (not self.open_loop or list(times) != sorted(times) or (times and times[0] < 0)):
            raise BadInput("an arrival schedule needs request rates and send times that never go back")
        if self.rate_search_steps < 0:
            raise BadInput("rate search steps must not be negative")
        if self.rate_slos is not None and not (self.open_loop and self.rate_slos):
            raise BadInput("the highest rate under the SLOs needs request rates and at least one SLO")
        unknown = set(self.goodput or ()) - set(GOODPUT_SLOS)
        if unknown or any(v <= 0 for v in (self.goodput or {}).values()):
            raise BadInput(f"--goodput: give KEY:MS with KEY in {', '.join(GOODPUT_SLOS)} and a positive limit, "
                           "e.g. ttft:2000")

    @property
    def open_loop(self) -> bool:
        return bool(self.request_rates)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str, option: str = "--duration", allow_zero: bool = False) -> float:
    """``60s``, ``2m``, ``90`` -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min|h)?\s*", text)
    if not m or (float(m.group(1)) == 0 and not allow_zero):
        raise BadInput(f"{option}: {text!r} is not a {'' if allow_zero else 'positive '}duration; use e.g. 60s, 2m or 90")
    return float(m.group(1)) * _UNITS[m.group(2) or ""]


def parse_rates(text: str) -> tuple[float, ...]:
    """``2,4,8.5`` -> (2.0, 4.0, 8.5) requests/s."""
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise BadInput(f"--request-rate: {text!r} is not a comma-separated list of requests/s, e.g. 2,4,8") from None


def parse_goodput(pairs: list[str]) -> dict[str, float] | None:
    """``["ttft:2000", "tpot:50"]`` -> ``{"ttft": 2000.0, "tpot": 50.0}`` (bench_serving's --goodput)."""
    slos = {}
    for pair in pairs:
        name, _, value = pair.partition(":")
        try:
            slos[name] = float(value)
        except ValueError:
            raise BadInput(f"--goodput: {pair!r} is not KEY:MS with KEY in {', '.join(GOODPUT_SLOS)}") from None
    return slos or None


def parse_concurrency(text: str) -> tuple[int, ...]:
    """``64,256,512`` -> (64, 256, 512)."""
    try:
        levels = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise BadInput(f"--concurrency: {text!r} is not a comma-separated list of integers, e.g. 64,256") from None
    if min(levels) < 1:
        raise BadInput(f"--concurrency: {text!r} has a level below 1; every level must be a positive integer")
    return levels
