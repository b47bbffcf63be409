"""GPU state from ``nvidia-smi``: the query, its parser, the "free" check and load-test telemetry.

Every host asks the same question: the query below, as CSV without header or units, so one
parser serves a real driver, an SSH target and the emulator's stand-in alike. Telemetry is the
same query sampled once a second during the load test; each ladder level gets the mean power
against the limit and the mean utilization, which tells an idle-looking GPU (the seed run saw
250 W of 600 W) from a saturated one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from statistics import fmean

from search.background import Background
from search.errors import InfrastructureFault
from search.hosts.base import GpuSample

FIELDS = ("index", "memory.used", "memory.total", "power.draw", "power.limit", "utilization.gpu")
FORMAT = "csv,noheader,nounits"

# A GPU with no process on it shows a few MiB at most (0 on an H200); a CUDA context alone
# takes ~500 MiB or more (1139 MiB on the captured H200), so anything above this is a holder.
FREE_MEMORY_MIB = 256.0

# What nvidia-smi prints for a field the GPU or driver cannot report.
_MISSING = {"[N/A]", "[Not Supported]", "N/A", "[Unknown Error]", "[Insufficient Permissions]", "[GPU requires reset]"}


def query_argv(command: Sequence[str] = ("nvidia-smi",)) -> list[str]:
    """The argv asking ``command`` (``nvidia-smi`` or a stand-in) for :data:`FIELDS`."""
    return [*command, f"--query-gpu={','.join(FIELDS)}", f"--format={FORMAT}"]


def _number(text: str, field: str, line: str) -> float | None:
    if text in _MISSING:
        return None
    try:
        return float(text)
    except ValueError:
        raise InfrastructureFault(
            f"nvidia-smi gave {text!r} for {field} in {line!r}; expected a number "
            f"(is the GPU command a real nvidia-smi answering --format={FORMAT}?)"
        ) from None


def parse(text: str) -> list[GpuSample]:
    """Parse the query's output, one GPU a line; unreported power or utilization become None.

    Index and memory are required: without them no GPU can be judged free, so their absence
    (or a header line, or units) is an InfrastructureFault quoting the line.
    """
    samples = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(FIELDS):
            raise InfrastructureFault(
                f"nvidia-smi line {line!r} has {len(cells)} fields, expected {len(FIELDS)} ({','.join(FIELDS)})"
            )
        values = [_number(c, f, line) for c, f in zip(cells, FIELDS, strict=True)]
        index, used, total, power, limit, util = values
        if index is None or used is None or total is None:
            raise InfrastructureFault(f"nvidia-smi line {line!r} lacks the GPU index or memory; cannot check the GPU")
        samples.append(GpuSample(int(index), used, total, power, limit, util))
    return samples


def busy(samples: Iterable[GpuSample], gpus: Iterable[int]) -> list[str]:
    """Why each of ``gpus`` is not free, e.g. ``"GPU 3: 1139 MiB used"``; empty when all are free.

    A GPU missing from the samples counts as busy: a trial must not start on a GPU it cannot see.
    """
    by_index = {s.index: s for s in samples}
    reasons = []
    for gpu in gpus:
        sample = by_index.get(gpu)
        if sample is None:
            reasons.append(f"GPU {gpu}: not reported by nvidia-smi (have {sorted(by_index)})")
        elif sample.memory_used_mib > FREE_MEMORY_MIB:
            reasons.append(f"GPU {gpu}: {sample.memory_used_mib:.0f} MiB used")
    return reasons


@dataclass(frozen=True)
class GpuWindow:
    """Telemetry over one stretch of time (a ladder level): per-GPU means over the samples."""

    samples: int
    power_w: float | None
    power_limit_w: float | None
    utilization_pct: float | None

    def record(self) -> dict[str, float | None]:
        """The keys the study stores per level (``gpu`` user attribute), concurrency aside."""
        return {"power_w": self.power_w, "power_limit_w": self.power_limit_w, "utilization_pct": self.utilization_pct}


def summarize(rounds: Sequence[list[GpuSample]], gpus: Iterable[int] | None = None) -> GpuWindow | None:
    """Mean power, limit and utilization per GPU over ``rounds`` (one list per query); None if empty."""
    wanted = set(gpus) if gpus is not None else None
    picked = [s for r in rounds for s in r if wanted is None or s.index in wanted]
    if not picked:
        return None

    def mean(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return round(fmean(known), 2) if known else None

    return GpuWindow(
        samples=len(rounds),
        power_w=mean([s.power_w for s in picked]),
        power_limit_w=mean([s.power_limit_w for s in picked]),
        utilization_pct=mean([s.utilization_pct for s in picked]),
    )


class Telemetry(Background):
    """Samples ``sample()`` every ``interval`` seconds in a daemon thread while the load test runs.

    Usage: ``with Telemetry(host.gpu_samples, gpus) as t: ...; mark = t.mark(); <level>; t.since(mark)``.
    A failed or unknown sample (None, or an error from a flaky connection) is skipped, never
    fatal: telemetry explains a result, it must not be the reason a trial fails.
    """

    def __init__(
        self,
        sample: Callable[[], list[GpuSample] | None],
        gpus: Iterable[int] | None = None,
        interval: float = 1.0,
    ) -> None:
        self._sample = sample
        self._gpus = list(gpus) if gpus is not None else None
        self._interval = interval
        self._rounds: list[list[GpuSample]] = []
        self._lock = threading.Lock()
        super().__init__("gpu-telemetry")

    def _run(self) -> None:
        # The first sample one interval in: at the start nothing has loaded the GPUs yet.
        next_tick = time.monotonic() + self._interval
        while not self._stop.wait(max(0.0, next_tick - time.monotonic())):
            try:
                samples = self._sample()
            except Exception:  # noqa: BLE001 - see the class docstring: a missed sample is only a gap
                samples = None
            if samples:
                with self._lock:
                    self._rounds.append(samples)
            next_tick += self._interval

    def mark(self) -> int:
        """A point in the sample stream; pass it to :meth:`since` at the end of a level."""
        with self._lock:
            return len(self._rounds)

    def since(self, mark: int) -> GpuWindow | None:
        """Summary of the samples taken after ``mark``; None when none arrived."""
        with self._lock:
            rounds = self._rounds[mark:]
        return summarize(rounds, self._gpus)
