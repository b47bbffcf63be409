"""Turn SGLang server log lines into lifecycle events: phases, loading progress, failures.

The patterns are data (``search/signatures/*.yaml``: ``common.yaml`` plus one file per SGLang
version family); this module only applies them. A classifier is fed lines one at a time, so the
same code serves a live log (:func:`follow`), a saved one (:func:`classify_file`), and the
trial lifecycle, which also asks :meth:`LogClassifier.check_stall` whether a phase went silent
for longer than its timeout.

Failure evidence arrives over several lines (``Received sigquit`` from the parent may be
flushed before the child's traceback). The classifier therefore emits a new ``failure`` event
whenever a *more informative* line supersedes the current one, and ``.failure`` always holds
the best so far: a caller that stops at the first failure event should keep feeding the lines
that are already there (or arrive within a fraction of a second) before reporting ``.failure``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import re
import select
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, BinaryIO

from search import yaml_data
from search.errors import BadInput

PHASES = ("starting", "loading", "kv_cache", "autotune", "cuda_graph", "warmup", "ready")
FAILURES = (
    "oom",
    "autotune_error",
    "cuda_graph_error",
    "unsupported",
    "nccl_error",
    "gpu_busy",
    "port_busy",
    "crash",
    "nan",
    "stall",
)
_PHASE_INDEX = {name: i for i, name in enumerate(PHASES)}
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Event:
    """One thing the log told us: a phase began, loading advanced, or the server failed."""

    kind: str  # "phase" | "progress" | "failure"
    name: str  # phase name or failure kind
    phase: str  # phase the server was in (for a failure: the phase it failed in)
    time: float  # time.time() when seen
    line: str  # the deciding line
    progress: float | None = None  # loading %, for kind "progress"


# --------------------------------------------------------------------------- signatures


@dataclass(frozen=True)
class _Failure:
    kind: str
    rank: int
    phase: str | None
    regex: re.Pattern[str]


@dataclass(frozen=True)
class Signatures:
    """The compiled patterns of one or more version families (see ``search/signatures``)."""

    families: tuple[str, ...]
    ansi: re.Pattern[str]
    head: re.Pattern[str]
    tail: re.Pattern[str]
    progress: tuple[re.Pattern[str], ...]
    phases: tuple[tuple[str, re.Pattern[str]], ...]
    frames: tuple[tuple[str, re.Pattern[str]], ...]
    traceback: re.Pattern[str]
    frame: re.Pattern[str]
    exception: re.Pattern[str]
    exception_kinds: Mapping[str, str]
    ignore: re.Pattern[str]
    failures: tuple[_Failure, ...]
    advice: re.Pattern[str]
    advice_lines: int
    # Literal strings at least one of which is in any line some pattern can match: most lines
    # (decode batches, NCCL chatter) contain none, and `in` tests cost far less than regexes.
    needles: tuple[str, ...]
    unneedled: re.Pattern[str] | None  # the patterns no literal could be derived from

    def worth_a_look(self, line: str) -> bool:
        """False when no pattern can match ``line`` (a cheap superset test)."""
        if any(needle in line for needle in self.needles):
            return True
        return self.unneedled is not None and self.unneedled.search(line) is not None


def _signature_dir() -> Traversable:
    return resources.files("search").joinpath("signatures")


def _read_yaml(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml_data.read("signatures", name) or {}
    return data


def _family_files() -> dict[str, dict[str, Any]]:
    files = {}
    for entry in _signature_dir().iterdir():
        if entry.name.startswith("sglang-") and entry.name.endswith(".yaml"):
            files[entry.name] = _read_yaml(entry.name)
    return files


def _alternation(patterns: list[str]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else re.compile(r"(?!)")


@cache
def load_signatures(version: str | None = None) -> Signatures:
    """Compile ``common.yaml`` plus the family file covering ``version``.

    ``version=None`` merges every family, so one classifier accepts all shipped wordings: the
    right default for logs of unknown origin (``search log classify`` on a user's file).
    """
    common = _read_yaml("common.yaml")
    families = _family_files()
    chosen = [
        data
        for data in families.values()
        if version is None or version in data.get("versions", ())
    ]
    if not chosen:
        known = sorted(v for data in families.values() for v in data.get("versions", ()))
        raise BadInput(
            f"no log signatures for SGLang {version}: known versions are {', '.join(known)}"
        )
    phase_patterns: dict[str, list[str]] = {}
    for data in [common, *chosen]:
        for phase, entries in (data.get("phases") or {}).items():
            if phase not in _PHASE_INDEX:
                raise BadInput(f"signature file names unknown phase {phase!r}: use one of {PHASES}")
            phase_patterns.setdefault(phase, []).extend(entry["pattern"] for entry in entries)
    frame_patterns = {phase: [entry["pattern"] for entry in entries]
                      for phase, entries in (common.get("frames") or {}).items()}
    failures = []
    for spec in common.get("failures", []):
        if spec["kind"] not in FAILURES:
            raise BadInput(f"signature names unknown failure {spec['kind']!r}: use one of {FAILURES}")
        failures.append(_Failure(spec["kind"], int(spec["rank"]), spec.get("phase"), re.compile(spec["pattern"])))
    failures.sort(key=lambda f: -f.rank)
    prefix = common["prefix"]
    progress = [re.compile(p) for p in common.get("progress", [])]
    phases = tuple(
        (phase, _alternation(pats)) for phase, pats in sorted(phase_patterns.items(), key=lambda kv: -_PHASE_INDEX[kv[0]])
    )
    frames = tuple((phase, _alternation(pats)) for phase, pats in frame_patterns.items())
    every = (
        [p.pattern for p in progress]
        + [p for pats in phase_patterns.values() for p in pats]
        + [p for pats in frame_patterns.values() for p in pats]
        + [common["traceback"], common["exception"], common["frame"]]
        + [f.regex.pattern for f in failures]
    )
    needles: set[str] = set()
    unneedled: list[str] = []
    for pattern in every:
        found = _needles(pattern)
        if found is None:
            # The prefilter runs on the raw line (prefix still on): without anchors, a superset.
            unneedled.append(pattern.removeprefix("^").removesuffix("$"))
        else:
            needles |= found
    return Signatures(
        families=tuple(str(data.get("family")) for data in chosen),
        ansi=re.compile(prefix["ansi"]),
        head=re.compile(prefix["head"]),
        tail=re.compile(prefix["tail"]),
        progress=tuple(progress),
        phases=phases,
        frames=frames,
        traceback=re.compile(common["traceback"]),
        frame=re.compile(common["frame"]),
        exception=re.compile(common["exception"]),
        exception_kinds=dict(common.get("exception_kinds") or {}),
        ignore=_alternation(common.get("ignore") or []),
        failures=tuple(failures),
        advice=re.compile(common["advice"]),
        advice_lines=int(common["advice_lines"]),
        needles=tuple(sorted(needles)),
        unneedled=_alternation(unneedled) if unneedled else None,
    )


def signature_version(version: str | None) -> str | None:
    """``version`` when a signature family covers it, else None (every family merged) with a warning.

    A space may target a release newer than the shipped signature files (a live manifest of
    0.5.10): its log most likely uses one of the known wordings, and refusing to start the
    server would lose the trial for want of a file. An explicit ``--sglang-version`` given to
    ``search log`` stays strict (:func:`load_signatures` raises).
    """
    if version is None or any(version in data.get("versions", ()) for data in _family_files().values()):
        return version
    _log.warning("no log signatures for SGLang %s: reading its log with every known version's wording", version)
    return None


_MIN_NEEDLE = 3


def _needles(pattern: str) -> set[str] | None:
    """Literal substrings, one of which every match of ``pattern`` contains; None if unknown."""
    from re import _parser as sre_parse  # type: ignore[attr-defined]  # the stdlib's own regex parser, untyped

    def of_sequence(items: Any) -> set[str] | None:
        best: set[str] | None = None
        run = ""

        def consider(candidate: set[str] | None) -> None:
            nonlocal best
            if candidate and min(map(len, candidate)) >= _MIN_NEEDLE:
                if best is None or min(map(len, candidate)) > min(map(len, best)):
                    best = candidate

        for op, arg in items:
            if op is sre_parse.LITERAL:
                run += chr(arg)
                continue
            consider({run} if run else None)
            run = ""
            if op is sre_parse.SUBPATTERN:
                consider(of_sequence(arg[-1]))
            elif op is sre_parse.BRANCH:
                branches = [of_sequence(branch) for branch in arg[1]]
                if all(b is not None for b in branches):
                    consider(set().union(*(b for b in branches if b is not None)))
            elif op in (sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT) and arg[0] >= 1:
                consider(of_sequence(arg[2]))
        consider({run} if run else None)
        return best

    return of_sequence(sre_parse.parse(pattern))


# --------------------------------------------------------------------------- classifier


class LogClassifier:
    """Feed it log lines; it tracks the phase reached, loading progress and the failure.

    Phases only move forward (ranks log the same milestone at different moments). The failure
    names the phase it happened in: a traceback frame's phase when one says so, else the phase
    reached when the failing line arrived.
    """

    def __init__(self, version: str | None = None, *, clock: Callable[[], float] = time.time) -> None:
        self.signatures = load_signatures(version)
        self._clock = clock
        self.phase: str | None = None
        self.failure: Event | None = None
        self.progress: float | None = None
        self.phase_line: str | None = None  # the line that started the current phase
        self.phase_times: dict[str, float] = {}  # phase -> time it began
        self.started_at = clock()
        self.last_output_time = self.started_at
        self.last_line: str | None = None
        self._failure_rank: float = -1
        self._frame_phase: str | None = None  # phase named by the open traceback's frames
        self._pending: Event | None = None  # an exception after ready, fatal only if a crash follows
        self._frame_head: str | None = None  # the prefix and indentation of a frame line just seen
        self.advice: list[str] = []  # lines after the failure that name a flag: what SGLang suggests

    def message(self, line: str) -> str:
        """The line without ANSI codes, Ray/time/rank/level prefix and Ray's repeat suffix."""
        sig = self.signatures
        if "\x1b" in line:
            line = sig.ansi.sub("", line)
        line = sig.head.sub("", line, count=1).rstrip()
        if line.endswith("cluster]"):
            line = sig.tail.sub("", line)
        return line

    def feed(self, line: str) -> list[Event]:
        """Classify one line (tqdm's ``\\r`` redraws count as separate lines); return new events."""
        now = self._clock()
        self.last_output_time = now
        raw = line.rstrip("\n")
        events: list[Event] = []
        if self.phase is None:
            events.append(self._enter("starting", raw, now))
        if not raw.strip():  # an empty line, or the empty piece before a tqdm bar's first "\r"
            return events
        self.last_line = raw
        if self._frame_head is not None:
            frame_head, self._frame_head = self._frame_head, None
            if self._is_source(raw, frame_head):
                return events
        if self.failure is not None and "--" in raw:
            self._note_advice(raw)
        for part in raw.split("\r") if "\r" in raw else (raw,):
            if self.signatures.worth_a_look(part):
                self._classify(part, now, events)
        return events

    def _classify(self, raw: str, now: float, events: list[Event]) -> None:
        sig = self.signatures
        msg = self.message(raw)
        if sig.ignore.search(msg):
            return
        for phase, pattern in sig.phases:
            if pattern.search(msg):
                if _PHASE_INDEX[phase] > _PHASE_INDEX[self.phase or "starting"]:
                    events.append(self._enter(phase, raw, now))
                break
        for pattern in sig.progress:
            found = None
            for found in pattern.finditer(msg):  # noqa: B007  (the last match is the bar's latest redraw)
                pass
            if found is not None:
                pct = float(found.group("pct"))
                if self.progress is None or pct > self.progress:
                    self.progress = pct
                    events.append(Event("progress", "loading", self.phase or "loading", now, raw, pct))
        if sig.frame.search(msg):
            self._frame_head = self._head(raw)
        if sig.traceback.search(msg):
            self._frame_phase = None
        else:
            # The innermost frame that names a phase is the startup step that failed: 0.5.23
            # autotunes inside init_cuda_graphs, so an autotune frame under it decides.
            named = next((phase for phase, pattern in sig.frames if pattern.search(msg)), None)
            if named is not None:
                self._frame_phase = named
                self._relocate(now, events)
        self._failure(raw, msg, now, events)

    def _head(self, raw: str) -> str:
        """What :meth:`message` strips from the front: Ray/time/level prefix and indentation."""
        if "\x1b" in raw:
            raw = self.signatures.ansi.sub("", raw)
        head = self.signatures.head.match(raw)
        assert head is not None, "the head pattern matches any line (it may match nothing)"
        return head.group()

    def _is_source(self, raw: str, frame_head: str) -> bool:
        """Whether ``raw``, the line after a frame line, is that frame's source code.

        Source code (``raise RuntimeError(f"NCCL error: ...")``) is not evidence. It sits under
        its frame: the same prefix (none, or the same Ray one), indented more deeply; in a
        paste that lost all indentation, equally flush. A frame without source (``<frozen
        runpy>``, ``<string>``, a .pyc-only install) is followed by the next frame, the
        exception itself, or another process's line, none of which may be skipped.
        """
        head = self._head(raw)
        if head.rstrip() != frame_head.rstrip() or (len(head) <= len(frame_head) and frame_head):
            return False
        msg = self.message(raw)
        return not (self.signatures.frame.search(msg) or self.signatures.exception.search(msg))

    def _note_advice(self, raw: str) -> None:
        """Keep a line after the failure that names a flag (not the failure line itself), once:
        with TP > 1 every rank prints the same advice, and how many ranks get to before the
        verdict is timing, not information."""
        sig = self.signatures
        msg = self.message(raw).strip()
        assert self.failure is not None, "advice is noted only after a failure"
        if (len(self.advice) < sig.advice_lines and raw != self.failure.line and sig.advice.search(msg)
                and not sig.frame.search(msg) and msg not in self.advice):
            self.advice.append(msg)

    def _enter(self, phase: str, line: str, now: float) -> Event:
        self.phase = phase
        self.phase_line = line
        self.phase_times[phase] = now
        return Event("phase", phase, phase, now, line)

    def _failure(self, raw: str, msg: str, now: float, events: list[Event]) -> None:
        sig = self.signatures
        matched = [f for f in sig.failures if f.regex.search(msg)]
        pinned = next((f.phase for f in matched if f.phase), None)
        # Frames of a traceback while serving (a graph replay) do not mean the startup step.
        frame = self._frame_phase if self.phase != "ready" else None
        where = pinned or frame or self.phase or "starting"
        is_exception = sig.exception.search(msg) is not None
        if matched:
            # Among equals, the exception line itself says more than a line mentioning it.
            kind, rank = matched[0].kind, matched[0].rank + (0.5 if is_exception else 0)
        elif is_exception:
            kind, rank = "crash", 20
        else:
            return
        kind = self._kind_in(kind, where)
        candidate = Event("failure", kind, where, now, raw)
        if rank == 20 and self.phase == "ready" and self.failure is None:
            # A traceback while serving may be one request's error; it decides only if the
            # server then dies.
            self._pending = candidate
            return
        if rank < 20 and self._pending is not None and self.failure is None:
            candidate, rank = self._pending, 20
        if rank > self._failure_rank:
            self._failure_rank = rank
            self.failure = candidate
            events.append(candidate)

    def _kind_in(self, kind: str, phase: str) -> str:
        """A crash during autotune or graph capture is that step's error (see ``exception_kinds``)."""
        return self.signatures.exception_kinds.get(phase, kind) if kind == "crash" else kind

    def _relocate(self, now: float, events: list[Event]) -> None:
        """A traceback header ("Scheduler hit an exception") came before the frames that say
        which startup step died: move the failure there."""
        current, frame = self.failure, self._frame_phase
        if current is None or frame is None or self._failure_rank >= 20 or self.phase == "ready":
            return
        if frame != current.phase:
            self.failure = Event("failure", self._kind_in(current.name, frame), frame, now, current.line)
            events.append(self.failure)

    def check_stall(self, now: float, timeouts: Mapping[str, float]) -> Event | None:
        """A ``stall`` failure when the current phase printed nothing for longer than its timeout.

        ``timeouts`` maps phase -> seconds (the space's ``timeouts``); a phase without one never
        stalls, nor does a server that is ready or already failed. The event's line says how
        long it was silent and quotes the last line seen (issue 9917: silence after
        ``Loading safetensors checkpoint shards: 100%``).
        """
        if self.failure is not None or self.phase == "ready":
            return None
        phase = self.phase or "starting"
        limit = timeouts.get(phase)
        silent = now - self.last_output_time
        if limit is None or silent <= limit:
            return None
        after = f"; last line: {self.message(self.last_line)}" if self.last_line else ""
        line = f"no output for {silent:.0f} s (timeout {limit:g} s){after}"
        self.failure = Event("failure", "stall", phase, now, line)
        self._failure_rank = 100
        return self.failure

    def summary(self) -> dict[str, Any]:
        """``{"phase", "failure", "line", "progress"}``: the verdict ``search log classify`` prints.

        ``phase`` is the last phase reached: the failure's own phase when a traceback frame puts
        it later than the last phase line (a graph-capture OOM whose capture line was never
        logged still reached cuda_graph).
        """
        line = self.failure.line if self.failure else self.phase_line
        reached = self.phase
        if self.failure is not None and _PHASE_INDEX[self.failure.phase] > _PHASE_INDEX[reached or "starting"]:
            reached = self.failure.phase
        return {
            "phase": reached,
            "failure": self.failure.name if self.failure else None,
            "line": self.signatures.ansi.sub("", line).strip() if line is not None else None,
            "progress": self.progress,
        }


_VERBS = {
    "oom": "out of memory",
    "autotune_error": "crashed",
    "cuda_graph_error": "crashed",
    "crash": "crashed",
    "unsupported": "unsupported",
    "nccl_error": "NCCL error",
    "gpu_busy": "GPU busy (another process holds it; not the config's fault)",
    "port_busy": "port busy (another process holds it; not the config's fault)",
    "nan": "NaN",
    "stall": "stalled",
}
_MODULE_PATH = re.compile(r"^(?:[a-z_]\w*\.)+(?=[A-Z]\w*(?::|$))")


def describe(failure: Event, *, width: int = 200) -> str:
    """One line a user reads: ``crashed at autotune: CalledProcessError: Command '['ninja', ...``."""
    text = _MODULE_PATH.sub("", _plain_message(failure.line))
    if len(text) > width:
        keep = width - 5
        text = f"{text[: keep * 2 // 3]} ... {text[-(keep - keep * 2 // 3):]}"
    where = "while serving" if failure.phase == "ready" else f"at {failure.phase}"
    return f"{_VERBS.get(failure.name, failure.name)} {where}: {text}"


def _plain_message(line: str) -> str:
    sig = load_signatures()
    line = sig.head.sub("", sig.ansi.sub("", line), count=1)
    return sig.tail.sub("", line).strip()


def read_log(path: str | os.PathLike[str], version: str | None = None) -> LogClassifier:
    """A classifier that has read a whole saved log (``BadInput`` when the file is missing)."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"log file {path} not found: give the path of a saved SGLang server log")
    classifier = LogClassifier(version)
    with path.open(encoding="utf-8", errors="replace", newline="\n") as fh:
        for line in fh:
            classifier.feed(line)
    return classifier


def classify_file(path: str | os.PathLike[str], version: str | None = None) -> dict[str, Any]:
    """Run the classifier over a saved log; see :meth:`LogClassifier.summary`."""
    return read_log(path, version).summary()


# --------------------------------------------------------------------------- following a file

_POLL_S = 0.1  # longest wait before stop() is asked again; also the fallback poll interval
_IN_MODIFY, _IN_ATTRIB, _IN_CLOSE_WRITE = 0x2, 0x4, 0x8
_IN_MOVE_SELF, _IN_DELETE_SELF, _IN_CREATE, _IN_MOVED_TO = 0x800, 0x400, 0x100, 0x80


class _Waker:
    """Blocks until the watched file (or its directory) changes, or ``timeout`` passes.

    inotify through ctypes on Linux, so a written line wakes us at once with no polling; where
    inotify is missing it degrades to a ``timeout`` sleep, still within the 100 ms contract.
    """

    def __init__(self, path: Path) -> None:
        self._fd = -1
        name = ctypes.util.find_library("c")
        libc = ctypes.CDLL(name, use_errno=True) if name else None
        if libc is None or not hasattr(libc, "inotify_init1"):
            return
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return
        mask_file = _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVE_SELF | _IN_DELETE_SELF
        mask_dir = _IN_CREATE | _IN_MOVED_TO
        ok = libc.inotify_add_watch(fd, os.fsencode(path), mask_file) >= 0
        ok = libc.inotify_add_watch(fd, os.fsencode(path.parent or Path(".")), mask_dir) >= 0 and ok
        if not ok:
            os.close(fd)
            return
        self._fd = fd

    def wait(self, timeout: float) -> None:
        if self._fd < 0:
            time.sleep(timeout)
            return
        ready, _, _ = select.select([self._fd], [], [], timeout)
        if ready:
            try:
                while os.read(self._fd, 65536):
                    pass
            except BlockingIOError:
                pass

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def split_pieces(buffer: bytes) -> tuple[list[bytes], bytes]:
    """The complete pieces of ``buffer`` and the incomplete rest.

    A piece ends at ``\n``, ``\r\n`` or a lone ``\r``: tqdm in a file redraws its bar with
    ``\r`` and writes ``\n`` only when done (SGLang's ``Capturing batches (bs=...)``, FlashInfer's
    autotuner), so a redraw is complete once the next one begins. A trailing ``\r`` is kept in
    the rest, since it may be the first half of ``\r\n``.
    """
    *lines, rest = buffer.split(b"\n")
    if b"\r" not in buffer:
        return lines, rest
    pieces: list[bytes] = []
    for line in lines:
        pieces.extend(line.removesuffix(b"\r").split(b"\r") if b"\r" in line else (line,))
    cut = rest.rfind(b"\r", 0, len(rest) - 1)
    if cut >= 0:
        pieces.extend(rest[:cut].split(b"\r"))
        rest = rest[cut + 1 :]
    return pieces, rest


def follow(path: str | os.PathLike[str], stop: Callable[[], bool], *, from_start: bool = True) -> Iterator[str]:
    """Yield the complete lines of a growing file as they are written, without the terminator.

    A tqdm redraw ended by ``\r`` counts as a line (see :func:`split_pieces`), so a progress bar
    reaches the classifier, and resets the stall timer, while it runs. Waits for the file to
    appear; survives truncation (reads again from the top) and replacement (reopens the new
    file). A line written without its terminator is held until it comes, and given out as it
    is when ``stop()`` turns true. ``stop`` is asked at least every 100 ms, also while lines
    keep coming.
    """
    path = Path(path)
    while not path.exists():
        if stop():
            return
        time.sleep(_POLL_S / 2)
    waker = _Waker(path)
    fh: BinaryIO = path.open("rb")
    try:
        if not from_start:
            fh.seek(0, os.SEEK_END)
        pending = b""
        asked = time.monotonic()
        while True:
            chunk = fh.read(1 << 20)
            if chunk:
                lines, pending = split_pieces(pending + chunk)
                for raw in lines:
                    yield raw.decode("utf-8", errors="replace")
                if time.monotonic() - asked < _POLL_S:
                    continue
            if stop():
                if pending:
                    yield pending.decode("utf-8", errors="replace")
                return
            asked = time.monotonic()
            if not chunk:
                reopened = _reopen_if_replaced(path, fh)
                if reopened is not None:
                    fh, pending = reopened, b""
                    waker.close()
                    waker = _Waker(path)
                    continue
                if os.fstat(fh.fileno()).st_size < fh.tell():  # truncated: start over
                    fh.seek(0)
                    pending = b""
                    continue
                waker.wait(_POLL_S)
    finally:
        fh.close()
        waker.close()


def _reopen_if_replaced(path: Path, fh: BinaryIO) -> BinaryIO | None:
    """The new file when ``path`` now names another file than ``fh`` (log rotated), else None."""
    try:
        current = os.stat(path)
    except FileNotFoundError:
        return None
    mine = os.fstat(fh.fileno())
    if (current.st_ino, current.st_dev) == (mine.st_ino, mine.st_dev):
        return None
    fh.close()
    return path.open("rb")


__all__ = [
    "PHASES",
    "FAILURES",
    "Event",
    "LogClassifier",
    "Signatures",
    "load_signatures",
    "signature_version",
    "classify_file",
    "read_log",
    "describe",
    "follow",
    "split_pieces",
]
