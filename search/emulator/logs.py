"""SGLang's log lines: the `[time TPn]` prefix and each version's wording.

Wording is data: templates.yaml next to this file holds every text with the real source file and
line of each version that prints it (tests/fidelity checks them against the real wheels).
"""

from __future__ import annotations

import sys
import time
from functools import cache
from pathlib import Path
from typing import Any, TextIO

import yaml

VERSIONS = ("0.5.8.post1", "0.5.9", "0.5.23")
TEMPLATES = Path(__file__).with_name("templates.yaml")
# libyaml's C loader (bundled in PyYAML's wheels): every rank process reads both data files at
# start, ~0.25 s with the pure-Python loader on a 2-core box against ~0.03 s.
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _variant_versions(variant: dict[str, Any]) -> list[str]:
    """The SGLang versions a variant serves: those its `at` names, and its `versions`."""
    return [str(v) for v in variant.get("at", {}) if str(v) in VERSIONS] + [str(v) for v in variant.get("versions", ())]


@cache
def templates() -> dict[str, list[dict[str, Any]]]:
    """templates.yaml: key -> variants ({text, at, ...})."""
    return yaml.load(TEMPLATES.read_text(encoding="utf-8"), Loader=_LOADER)


@cache
def _variants(version: str) -> dict[str, dict[str, Any]]:
    return {key: variant for key, variants in templates().items() for variant in variants
            if version in _variant_versions(variant)}


def _wording(version: str) -> dict[str, str]:
    """key -> the text as printed: "<raise>: <text>" for a text raised as an exception."""
    return {key: (f"{v['raise']}: {v['text']}" if v.get("raise") else v["text"]) for key, v in _variants(version).items()}


WORDING = {version: _wording(version) for version in VERSIONS}


def failure_text(flags: dict[str, Any], key: str, *, raised: bool = True, **values: object) -> str:
    """A failure text as the SGLang version of `flags` words it, "<Exception>: " first unless not
    `raised` (the message inside another one). For landscapes, which see flags, not the version:
    only 0.5.23 has `cuda_graph_backend_decode`; 0.5.8.post1's failure texts are 0.5.9's."""
    variant = _variants("0.5.23" if "cuda_graph_backend_decode" in flags else "0.5.9")[key]
    text = variant["text"].format(**values)
    return f"{variant['raise']}: {text}" if raised and variant.get("raise") else text


_SITE = "/usr/local/lib/python3.12/dist-packages"
# Traceback frames per version and failing step (frames.yaml: the real call chains).
FRAMES: dict[str, dict[str, list[list[Any]]]] = yaml.load(
    Path(__file__).with_name("frames.yaml").read_text(encoding="utf-8"), Loader=_LOADER)
# tqdm's bar for a file without a known width: 10 cells of Unicode eighths.
_BAR_CELLS = 10
_BAR_CHARS = " \u258f\u258e\u258d\u258c\u258b\u258a\u2589\u2588"


def _family(version: str) -> str:
    """The shipped version whose wording `version` has: itself, else the nearest older family."""
    if version in WORDING:
        return version
    return "0.5.23" if tuple(int(p) for p in version.split(".")[:3] if p.isdigit()) >= (0, 5, 23) else "0.5.9"


def wording(version: str) -> dict[str, str]:
    """Templates of the version, or of the nearest older shipped one for an unknown patch level."""
    return WORDING[_family(version)]


class Logger:
    """Writes `[YYYY-MM-DD HH:MM:SS{.mmm}{ TPn}] message` lines as SGLang's basicConfig does (stderr).

    `rank` None is the main process (no tag); SGLang tags scheduler lines `TPn` only when
    tp_size > 1, so callers pass None for a single-GPU server's rank too. Warnings share the
    format (basicConfig's has no level), so `raw` writes them too.
    """

    def __init__(self, version: str, rank: int | None, ms: bool, stream: TextIO = sys.stderr) -> None:
        family = _family(version)
        self.version = family
        self.words = WORDING[family]
        self.frames = FRAMES[family]
        self.tag = f" TP{rank}" if rank is not None else ""
        self.ms = ms
        self.stream = stream

    def prefix(self) -> str:
        now = time.time()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
        if self.ms:
            stamp += f".{int(now % 1 * 1000):03d}"
        return f"[{stamp}{self.tag}] "

    def raw(self, message: str) -> None:
        self.stream.write(self.prefix() + message + "\n")
        self.stream.flush()

    def flashinfer(self, key: str) -> None:
        """A FlashInfer INFO line: its own handler's format (no SGLang prefix, logging's asctime
        with milliseconds), naming the file and line the version's FlashInfer logs it from."""
        path, line = str(next(iter(_variants(self.version)[key]["at"].values()))).rsplit(":", 1)
        now = time.time()
        asctime = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now % 1 * 1000):03d}"
        self.stream.write(self.words["flashinfer_format"].format(
            asctime=asctime, level="INFO", file=path.rsplit("/", 1)[-1], line=line, message=self.words[key]) + "\n")
        self.stream.flush()

    def warn_at(self, key: str, **values: object) -> None:
        """A warning logged before SGLang's log format is set (a deprecated flag):
        `[time] WARNING <file>:<line>: <text>`, the file and line of the version's logging call."""
        variant = _variants(self.version).get(key)
        if variant is not None:
            path = str(next(iter(variant["at"].values()))).rsplit(":", 1)[0]
            self.raw(f"WARNING {path.rsplit('/', 1)[-1]}:{variant['call_line']}: " + variant["text"].format(**values))

    def say(self, key: str, **values: object) -> None:
        """Log the version's line for `key`; a line the version does not have is skipped."""
        template = self.words.get(key)
        if template is not None:
            self.raw(template.format(**values))

    def bar(self, key: str, total: int, seconds: float, desc: str = "") -> "Bar":
        """A tqdm bar in the version's format (`shards_bar`, `graph_bar`), drawn at 0 at once."""
        return Bar(self.stream, self.words[key], total, seconds / total if total else 0.0, desc)

    def traceback(self, frames: str, error: str) -> str:
        """A traceback through SGLang's frames of `frames` (a startup phase, "unbalanced" for the
        memory-balance check, "warmup_poll" for the HTTP warmup's wait) ending in `error`."""
        lines = "".join(f'  File "{_SITE}/sglang/srt/{path}", line {line}, in {func}\n    {code}\n'
                        for path, line, func, code in self.frames[frames])
        return f"Traceback (most recent call last):\n{lines}{error}"

    def exception(self, frames: str, error: str) -> None:
        """`Scheduler hit an exception:` with the traceback of `frames`."""
        self.say("exception", traceback=self.traceback(frames, error))


class Bar:
    """A tqdm progress bar as tqdm writes it to a file that is not a terminal (a redirected stderr).

    Every redraw is a carriage return plus the formatted bar, padded with spaces over a longer
    previous one; closing redraws and writes a newline. A format ending in a newline (SGLang's
    BAR_FORMAT up to 0.5.9) so puts each redraw on its own line and adds an empty one at the
    end. Times follow the phase's (time-scaled) duration: item n is done at n x `seconds_per_it`.
    No logging prefix: tqdm writes to the stream itself.
    """

    def __init__(self, stream: TextIO, fmt: str, total: int, seconds_per_it: float, desc: str) -> None:
        self.stream, self.fmt, self.total, self.per_it, self.desc = stream, fmt, total, seconds_per_it, desc
        self.n = 0
        self.last_len = 0
        self.draw()

    def set_description(self, desc: str) -> None:
        self.desc = desc
        self.draw()

    def update(self) -> None:
        self.n += 1
        self.draw()

    def close(self) -> None:
        self.draw()
        self.stream.write("\n")
        self.stream.flush()

    def draw(self) -> None:
        text = self.format()
        self.stream.write("\r" + text + " " * max(self.last_len - len(text), 0))
        self.stream.flush()
        self.last_len = len(text)

    def format(self) -> str:
        """tqdm.format_meter's fields for a bar without unit scaling or a known width."""
        n, total = self.n, self.total
        elapsed = n * self.per_it
        rate = n / elapsed if elapsed else None
        if rate is None:
            rate_fmt = "?it/s"
        elif 1 / rate > 1:
            rate_fmt = f"{1 / rate:5.2f}s/it"
        else:
            rate_fmt = f"{rate:5.2f}it/s"
        frac = n / total if total else 0.0
        full, part = divmod(int(frac * _BAR_CELLS * (len(_BAR_CHARS) - 1)), len(_BAR_CHARS) - 1)
        bar = _BAR_CHARS[-1] * full
        if full < _BAR_CELLS:
            bar += _BAR_CHARS[part] + _BAR_CHARS[0] * (_BAR_CELLS - full - 1)
        percentage = frac * 100
        return self.fmt.format(
            desc=self.desc, percentage=percentage, n_fmt=n, total_fmt=total, elapsed=tqdm_time(elapsed),
            remaining=tqdm_time((total - n) / rate) if rate else "?", rate_fmt=rate_fmt, bar=bar,
            l_bar=(f"{self.desc}: " if self.desc else "") + f"{percentage:3.0f}%|")


def tqdm_time(seconds: float) -> str:
    """tqdm.format_interval: [H:]MM:SS."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"
