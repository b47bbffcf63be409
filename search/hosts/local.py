"""This machine as a host: servers are subprocesses in their own session, found again by marker.

Teardown never trusts the process tree alone: SGLang's scheduler ranks outlive a SIGKILLed
parent (they keep their GPUs), and a child may leave the process group. So every server gets
``SEARCH_TRIAL_MARKER=<marker>`` in its environment, and after the group is signalled we scan
``/proc/*/environ`` for the marker and kill what is left. Nothing is ever matched by name.
Whether the host is clean is read from the kernel (listening sockets in ``/proc/net/tcp*`` for
the port) and from ``nvidia-smi`` for the GPUs; `search.hosts.emulated` runs the emulator instead.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from search import gpu
from search.errors import InfrastructureFault
from search.hosts.base import MARKER_ENV, GpuSample, server_gpus
from search.logwatch import follow
from search.secret_env import set_secrets

if TYPE_CHECKING:
    from search.profile import LaunchProfile

_POLL_S = 0.02  # how often teardown looks whether the processes are gone
_KILL_WAIT_S = 5.0  # how long SIGKILLed processes get to disappear before we call it a fault
_RELEASE_WAIT_S = 5.0  # how long port and GPUs get to be released once every process is gone


# --------------------------------------------------------------------------- /proc


def _proc_pids() -> Iterator[int]:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            yield int(entry.name)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) of a live process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may contain spaces
    return fields[0], int(fields[2])


def _carries(pid: int, needle: bytes) -> bool:
    try:
        return needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone, or another user's process: not ours either way
        return False


def _live_pids(marker: str, pgid: int | None = None) -> list[int]:
    """Processes (zombies excluded: they hold nothing) carrying ``marker`` or in group ``pgid``."""
    needle = f"{MARKER_ENV}={marker}".encode()
    me = os.getpid()
    found = []
    for pid in _proc_pids():
        if pid == me:
            continue
        stat = _stat(pid)
        if stat is None or stat[0] in ("Z", "X"):
            continue
        if stat[1] == pgid or _carries(pid, needle):
            found.append(pid)
    return found


def describe_pid(pid: int | None) -> str:
    """``pid 1234 (python -m search.emulator --tp 2 ...)`` for messages."""
    if pid is None:
        return "an unknown process (another user's?)"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        command = " ".join(a.decode(errors="replace") for a in argv if a)
    except OSError:
        return f"pid {pid}"
    if len(command) > 80:
        command = command[:77] + "..."
    return f"pid {pid} ({command})" if command else f"pid {pid}"


def _listening_inodes(port: int) -> list[int]:
    inodes = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # 0A = LISTEN
                inodes.append(int(cols[9]))
    return inodes


def _socket_owner(inodes: list[int]) -> int | None:
    wanted = {f"socket:[{i}]" for i in inodes}
    for pid in _proc_pids():
        try:
            for fd in os.scandir(f"/proc/{pid}/fd"):
                if os.readlink(fd.path) in wanted:
                    return pid
        except OSError:
            continue
    return None


# --------------------------------------------------------------------------- the handle


class _LogReader:
    """Follows the log in a thread (inotify via :func:`search.logwatch.follow`) into a queue."""

    def __init__(self, path: Path) -> None:
        self._lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(path,), name=f"log {path.name}", daemon=True)
        self._thread.start()

    def _run(self, path: Path) -> None:
        for line in follow(path, self._closed.is_set):
            self._lines.put(line)

    def take(self, timeout: float) -> list[str]:
        try:
            lines = [self._lines.get(timeout=timeout) if timeout > 0 else self._lines.get_nowait()]
        except queue.Empty:
            return []
        while True:
            try:
                lines.append(self._lines.get_nowait())
            except queue.Empty:
                return lines

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=1.0)


class LocalServer:
    """A server started by :class:`LocalHost`; the session leader is the launcher process."""

    def __init__(self, host: LocalHost, profile: LaunchProfile, marker: str, log_path: Path,
                 proc: subprocess.Popen[bytes]) -> None:
        self.host = host
        self.profile = profile
        self.marker = marker
        self.url = profile.url
        self.log_path = log_path
        self.pid = proc.pid
        self._proc = proc
        self._reader = _LogReader(log_path)

    def new_lines(self, timeout: float) -> list[str]:
        return self._reader.take(timeout)

    def returncode(self) -> int | None:
        return self._proc.poll()

    def _alive(self) -> list[int]:
        self._proc.poll()  # reap the leader so it stops counting
        return _live_pids(self.marker, self.pid)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the group and the marker, wait ``grace``, SIGKILL both, then check the host.

        A process that left the group but carries the marker gets the same SIGTERM and grace
        as the group: it may hold GPU memory it should release cleanly. Raises
        InfrastructureFault when a process survives SIGKILL or the port or a GPU is still held
        afterwards: the next trial must not start on a dirty host.
        """
        try:
            if alive := self._alive():
                self._signal(alive, signal.SIGTERM)
                deadline = time.monotonic() + grace
                while self._alive() and time.monotonic() < deadline:
                    time.sleep(_POLL_S)
            if survivors := self._alive():
                self._signal(survivors, signal.SIGKILL)
                _wait_gone(self._alive, _KILL_WAIT_S, f"trial {self.marker}")
            self._proc.wait()
            self.host.ensure_clean(self.profile, timeout=_RELEASE_WAIT_S)
        finally:
            self._reader.close()


    def _signal(self, pids: list[int], sig: signal.Signals) -> None:
        """``sig`` to the group, and to each of ``pids`` (from :meth:`_alive`) outside it."""
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass
        for pid in pids:
            if (stat := _stat(pid)) is not None and stat[1] != self.pid:  # escaped the group, or orphaned
                _signal(pid, sig)


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_gone(alive: Callable[[], list[int]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while (left := alive()) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    if left:
        held = ", ".join(describe_pid(pid) for pid in left)
        raise InfrastructureFault(f"{what}: {held} survived SIGKILL for {timeout:g} s; check the host by hand")


# --------------------------------------------------------------------------- the host


class LocalHost:
    """Runs servers on this machine: the profile's own launcher, GPUs as ``nvidia-smi`` reports them.

    `search.hosts.emulated.EmulatedHost` changes the three things that differ on the emulator:
    the command (:meth:`argv`), who holds a GPU (:meth:`gpu_holders`) and the ``nvidia-smi``
    that reports them (:meth:`nvidia_smi`).
    """

    available = True  # this machine does not go away between trials

    def __init__(self, *, name: str = "local", gpus: list[int] | None = None) -> None:
        if not name:
            raise ValueError("a host needs a name: it is recorded with every trial it runs")
        self.name = name
        self.gpus = gpus  # None: one trial at a time takes what its profile asks for

    def argv(self, profile: LaunchProfile) -> list[str]:
        """The command that starts ``profile`` here."""
        return list(profile.argv)

    def nvidia_smi(self) -> tuple[str, ...] | None:
        """The ``nvidia-smi`` command of this machine; None where there is none."""
        return ("nvidia-smi",) if shutil.which("nvidia-smi") else None

    def gpu_holders(self, profile: LaunchProfile, gpus: list[int]) -> list[str]:
        """Which of ``gpus`` another process holds, as ``GPU 3 by pid 12 (...)``."""
        samples = self.gpu_samples(profile.env)
        return gpu.busy(samples, gpus) if samples is not None else []

    def _environment(self, profile: LaunchProfile, marker: str | None = None) -> dict[str, str]:
        """Ours plus the profile's: secrets named by ``profile.secret_env`` pass through unwritten."""
        env = {**os.environ, **profile.env}
        set_secrets(profile.secret_env)  # those not set are warned about, as on every host
        if marker is not None:
            env[MARKER_ENV] = marker
        return env

    def adapt(self, profile: LaunchProfile) -> LaunchProfile:
        """The space's profile unchanged: this machine has no settings of its own."""
        return profile

    def start(self, profile: LaunchProfile, *, marker: str, log_path: Path) -> LocalServer:
        """Start ``profile`` in a new session with its output (stdout and stderr) in ``log_path``."""
        env = self._environment(profile, marker)
        argv = self.argv(profile)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        env=env, start_new_session=True, close_fds=True)
            except OSError as exc:
                raise InfrastructureFault(f"cannot start {argv[0]}: {exc.strerror}; check the launcher in the space") from None
        return LocalServer(self, profile, marker, log_path, proc)

    def held(self, profile: LaunchProfile) -> list[str]:
        """What keeps ``profile`` from starting now: ``["port 30000 by pid 12 (...)", ...]``."""
        found = []
        inodes = _listening_inodes(profile.port)
        if inodes:
            found.append(f"port {profile.port} by {describe_pid(_socket_owner(inodes))}")
        return found + self.gpu_holders(profile, self.trial_gpus(profile))

    def ensure_clean(self, profile: LaunchProfile, *, timeout: float) -> None:
        """Wait up to ``timeout`` s until nothing holds the profile's port and GPUs; never kills."""
        deadline = time.monotonic() + timeout
        while (held := self.held(profile)) and time.monotonic() < deadline:
            time.sleep(0.1)
        if held:
            raise InfrastructureFault(
                f"host {self.name} is not clean after {timeout:g} s: {'; '.join(held)} still held; "
                "stop that process (only if it is yours) and retry"
            )

    def kill_marker(self, marker: str) -> int:
        """SIGKILL every process carrying ``marker`` (a driver died mid-trial); return how many."""
        pids = _live_pids(marker)
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        _wait_gone(lambda: _live_pids(marker), _KILL_WAIT_S, f"trial {marker}")
        return len(pids)

    def trial_gpus(self, profile: LaunchProfile) -> list[int]:
        """The GPUs ``profile`` uses here: CUDA_VISIBLE_DEVICES of its environment, else the first its layout takes."""
        return server_gpus(profile.args, self._environment(profile))

    def gpu_samples(self, env: Mapping[str, str] | None = None) -> list[GpuSample] | None:
        """What :meth:`nvidia_smi` reports; None where there is none.

        ``env`` is a trial's own environment (its profile's): what it sets (the emulator's state
        directory) wins over this process's.
        """
        command = self.nvidia_smi()
        if command is None:
            return None
        done = subprocess.run(gpu.query_argv(command), capture_output=True, text=True,
                              env={**os.environ, **(env or {})}, timeout=30)
        if done.returncode != 0:
            raise InfrastructureFault(f"{command[-1]} failed ({done.returncode}): {done.stderr.strip()[-200:]}")
        return gpu.parse(done.stdout)
