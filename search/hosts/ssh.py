"""A remote GPU machine over SSH (paramiko), behind the same interface as the local host.

Safety first: the host key is checked against known_hosts (an unknown key is recorded only
when the user says so, a changed key never), no password is ever used, and every remote
command is ``shlex``-quoted argv, so a value with spaces, quotes, ``;`` or ``$(...)`` arrives
literally. The server runs detached in its own session under ``<work_dir>/<marker>/`` with the
trial marker in its environment; its log is mirrored into the local trial directory by offset,
so a dropped connection loses nothing. Reconnects are automatic; a host that stays down is
marked unavailable, and a trial whose remote state is gone is an InfrastructureFault.
"""

from __future__ import annotations

import os
import re
import select
import shlex
import stat
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, TypeVar

import paramiko

from search import gpu
from search.errors import BadInput, InfrastructureFault, RunFailed
from search.hosts.base import MARKER_ENV, GpuSample, server_gpus
from search.hosts.config import HostConfig
from search.logwatch import split_pieces
from search.secret_env import set_secrets

if TYPE_CHECKING:
    from search.profile import LaunchProfile

T = TypeVar("T")

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MARKER = re.compile(r"^[A-Za-z0-9_.-]+$")  # it names the remote run directory too
_POLL_S = 0.1  # log and process polling over the connection
_KILL_WAIT_S = 5.0
_RELEASE_WAIT_S = 5.0
_COMMAND_TIMEOUT_S = 120.0
_CONNECTION_ERRORS = (paramiko.SSHException, OSError, EOFError)

# Remote process table scan (the host's Python is the one thing every target has): count, or
# signal, the live processes in group argv[1] or carrying the marker argv[2]. Zombies hold
# nothing and are skipped; so is this scan itself.
_PROCS_PY = """\
import os, sys
pgid, needle, sig = int(sys.argv[1]), sys.argv[2].encode(), int(sys.argv[3])
n = 0
for p in os.listdir("/proc"):
    if not p.isdigit() or int(p) == os.getpid():
        continue
    try:
        text = open("/proc/%s/stat" % p).read()
        fields = text[text.rindex(")") + 2:].split()
        if fields[0] in ("Z", "X"):
            continue
        if int(fields[2]) != pgid and needle not in open("/proc/%s/environ" % p, "rb").read().split(b"\\0"):
            continue
        if sig:
            os.kill(int(p), sig)
        n += 1
    except (OSError, ValueError):
        pass
print(n)
"""

# Whether TCP port argv[1] can be listened on (what the next server will try).
_PORT_BUSY_PY = """\
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("0.0.0.0", int(sys.argv[1])))
    print("free")
except OSError:
    print("busy")
"""

# Start: export the secrets read from stdin (never on a command line), then launch argv[4:]
# detached in a new session, under a shell that records its exit status in argv[1]. The
# shell's TERM trap lets it outlive the group SIGTERM long enough to write that status.
_START_SH = """\
cd "$2" || exit 1
while IFS= read -r kv; do export "$kv"; done
log=$3; rc=$1; shift 3
setsid sh -c 'trap : TERM INT HUP; "$@"; echo $? > "$0"' "$rc" "$@" > "$log" 2>&1 < /dev/null &
echo $!
"""


def command_line(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """One remote shell command running ``argv`` with ``env``; every word quoted (``shlex``)."""
    return shlex.join([*env_words(env), *argv] if env else argv)


def env_words(env: Mapping[str, str]) -> list[str]:
    """``env K=V ...``: words setting ``env`` for the command that follows them."""
    bad = [k for k in env if not _ENV_NAME.match(k)]
    if bad:
        raise BadInput(f"environment variable name {bad[0]!r} is not valid; use letters, digits and _")
    return ["env", *(f"{k}={v}" for k, v in env.items())]


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Unknown key: refuse, or (``--accept-new-host-key``) append it to known_hosts once."""

    def __init__(self, config: HostConfig, accept_new: bool) -> None:
        self._config = config
        self._accept_new = accept_new

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        path = self._config.known_hosts
        if not self._accept_new:
            raise BadInput(
                f"host {self._config.name}: unknown host key for {hostname} ({key.get_name()} {key.fingerprint}) "
                f"in {path}; verify it and rerun `search host check {self._config.name} --accept-new-host-key` to record it"
            )
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(path, "a") as known:
            known.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)


class SSHHost:
    """Runs servers on ``config``'s machine; safe to use from the trial and a telemetry thread."""

    def __init__(self, config: HostConfig, *, accept_new_host_key: bool = False) -> None:
        self.name = config.name
        self.config = config
        self.available = True  # False once reconnecting failed; the study skips the host
        self.last_error: str | None = None
        self._accept_new = accept_new_host_key
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._work_dir: str | None = None
        self._lock = threading.RLock()
        self._sftp_lock = threading.Lock()  # see with_sftp
        self._unstopped: set[str] = set()  # markers whose stop broke off (host lost): swept before the next trial

    # ------------------------------------------------------------------ connection

    def _connect_once(self) -> paramiko.SSHClient:
        cfg = self.config
        client = paramiko.SSHClient()
        if cfg.known_hosts.exists():
            client.load_host_keys(str(cfg.known_hosts))
        client.set_missing_host_key_policy(_HostKeyPolicy(cfg, self._accept_new))
        if cfg.key_file is not None and not cfg.key_file.is_file():  # not a host that is down: retrying cannot help
            raise BadInput(f"host {cfg.name}: key file {cfg.key_file} does not exist; fix key_file in the hosts file, "
                           "or leave it out to use the SSH agent's keys")
        try:
            client.connect(
                cfg.address, port=cfg.port, username=cfg.user,
                key_filename=str(cfg.key_file) if cfg.key_file else None,
                allow_agent=cfg.key_file is None, look_for_keys=cfg.key_file is None,
                timeout=cfg.connect_timeout, banner_timeout=cfg.connect_timeout, auth_timeout=cfg.connect_timeout,
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            host = cfg.address if cfg.port == 22 else f"[{cfg.address}]:{cfg.port}"  # as known_hosts names it
            raise BadInput(
                f"host {cfg.name}: the host key of {host} CHANGED (now {exc.key.fingerprint}) and does not match "
                f"{cfg.known_hosts}; if the machine was reinstalled, run `ssh-keygen -R '{host}' -f {cfg.known_hosts}` "
                "and check again with --accept-new-host-key, otherwise someone may be intercepting the connection"
            ) from None
        except paramiko.PasswordRequiredException:
            client.close()
            raise BadInput(
                f"host {cfg.name}: key file {cfg.key_file} is passphrase-protected; load it into the SSH agent "
                "(ssh-add) and leave key_file out of the hosts file"
            ) from None
        except paramiko.AuthenticationException:
            client.close()
            how = f"key file {cfg.key_file}" if cfg.key_file else "the SSH agent's keys"
            raise BadInput(f"host {cfg.target}: authentication failed with {how}; authorise that key there") from None
        except BaseException:
            client.close()
            raise
        transport = client.get_transport()
        assert transport is not None
        transport.set_keepalive(15)  # notice a dead peer while only polling
        return client

    def _connected(self) -> paramiko.SSHClient:
        """The live connection, reconnecting with backoff; InfrastructureFault when the host stays down."""
        with self._lock:
            transport = self._client.get_transport() if self._client else None
            if transport is not None and transport.is_active():
                return self._client  # type: ignore[return-value]
            self._drop()
            cfg = self.config
            delay = cfg.reconnect_delay
            for attempt in range(cfg.reconnect_attempts):
                try:
                    self._client = self._connect_once()
                    self.available, self.last_error = True, None
                    return self._client
                except _CONNECTION_ERRORS as exc:
                    self.last_error = str(exc) or type(exc).__name__
                if attempt + 1 < cfg.reconnect_attempts:
                    time.sleep(delay)
                    delay *= 2
            self.available = False
            raise InfrastructureFault(
                f"host {cfg.target} unreachable after {cfg.reconnect_attempts} attempts ({self.last_error}); "
                "marked unavailable: check that it is up and sshd answers"
            )

    def _drop(self) -> None:
        if self._client is not None:
            self._client.close()
        self._client = self._sftp = None

    def _retrying(self, action: Callable[[], T], *, retry: bool = True) -> T:
        """Run ``action`` (it uses the connection); after a drop, reconnect and (``retry``: it is idempotent) run it again.

        The one place a connection error becomes an InfrastructureFault: callers (the trial's
        finally, the health thread, the study) handle host faults, never paramiko's exceptions.
        """
        error: Exception | None = None
        for _ in range(2 if retry else 1):
            try:
                return action()
            except _CONNECTION_ERRORS as exc:
                error = exc
                with self._lock:
                    self._drop()
        again = " (also after reconnecting)" if retry else ""
        raise InfrastructureFault(f"host {self.config.target}: {type(error).__name__} over SSH{again}: {error}; "
                                  "check the host and its network")

    def close(self) -> None:
        """Close the connection (a later call reconnects)."""
        with self._lock:
            self._drop()

    def sftp(self) -> paramiko.SFTPClient:
        """The connection's SFTP session (reopened after a reconnect)."""
        with self._lock:
            client = self._connected()
            if self._sftp is None:
                self._sftp = client.open_sftp()
                channel = self._sftp.get_channel()
                if channel is not None:  # a reply that never comes then raises instead of blocking forever
                    channel.settimeout(_COMMAND_TIMEOUT_S)
            return self._sftp

    def with_sftp(self, action: Callable[[paramiko.SFTPClient], T]) -> T:
        """``action(sftp)`` on the connection's SFTP session, one thread at a time, retried after a drop.

        paramiko's SFTPClient takes whichever reply arrives next and drops one it did not ask for:
        two trials' log reads on one host took each other's replies, and one waited forever
        (a side-by-side study over SSH hung until pytest's timeout).
        """
        def locked() -> T:
            with self._sftp_lock:
                return action(self.sftp())
        return self._retrying(locked)

    # ------------------------------------------------------------------ commands

    def _open_session(self) -> paramiko.Channel:
        """A new channel on the live connection, opened while no other thread opens one or drops it.

        paramiko keeps why a channel was refused in one slot per connection, cleared when read:
        concurrent openers (the trial, its health check, its telemetry) took each other's reason,
        and a drop by one under another's open left only "Unable to open channel." or EOFError.
        """
        with self._lock:
            transport = self._connected().get_transport()
            assert transport is not None
            return transport.open_session(timeout=self.config.connect_timeout)

    def _exec(self, command: str, stdin: bytes, timeout: float) -> tuple[int, str, str]:
        channel = self._open_session()
        try:
            channel.exec_command(command)
            if stdin:
                channel.sendall(stdin)
            channel.shutdown_write()
            out, err = bytearray(), bytearray()
            deadline = time.monotonic() + timeout
            while True:
                while channel.recv_ready():
                    out += channel.recv(1 << 16)
                while channel.recv_stderr_ready():
                    err += channel.recv_stderr(1 << 16)
                if channel.exit_status_ready() and not channel.recv_ready() and not channel.recv_stderr_ready():
                    if channel.eof_received or channel.closed:
                        break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise InfrastructureFault(
                        f"host {self.name}: `{command[:80]}` did not finish within {timeout:g} s; check the host"
                    )
                select.select([channel], [], [], min(left, 1.0))
            status = channel.recv_exit_status()
            if status == -1:  # paramiko's "none sent": the connection dropped, or a signal killed the command there
                raise paramiko.SSHException("the command's channel closed without an exit status")
            return status, out.decode(errors="replace"), err.decode(errors="replace")
        finally:
            channel.close()

    def execute(
        self, argv: Sequence[str], *, stdin: str = "", env: Mapping[str, str] | None = None,
        timeout: float = _COMMAND_TIMEOUT_S, retry: bool = True,
    ) -> tuple[int, str, str]:
        """Run ``argv`` there (quoted; ``config.env`` and ``env`` set); (exit status, stdout, stderr).

        ``retry`` runs it again after a dropped connection: only for commands safe to repeat.
        """
        command = command_line(argv, {**self.config.env, **(env or {})})
        data = stdin.encode()
        return self._retrying(lambda: self._exec(command, data, timeout), retry=retry)

    def run(self, argv: Sequence[str], stdin: str = "", *, timeout: float = _COMMAND_TIMEOUT_S) -> str:
        """stdout of ``argv`` there; RunFailed quoting stderr's last line on a non-zero exit.

        Its ``(argv, stdin)`` shape is :func:`search.manifests.live`'s remote runner.
        """
        status, out, err = self.execute(argv, stdin=stdin, timeout=timeout)
        if status != 0:
            last = (err.strip().splitlines() or ["no output"])[-1]
            raise RunFailed(f"host {self.name}: `{shlex.join(argv)[:80]}` exited {status}: {last}")
        return out

    def work_dir(self) -> str:
        """The absolute remote work directory, created on first use."""
        if self._work_dir is None:
            relative = self.config.work_dir.removeprefix("~/")
            self._work_dir = self.run(["sh", "-c", 'mkdir -p -- "$1" && cd -- "$1" && pwd', "sh", relative]).strip()
        return self._work_dir

    # ------------------------------------------------------------------ Host protocol

    @property
    def gpus(self) -> list[int] | None:
        """The hosts file's ``gpus``: trials are placed side by side on them."""
        return self.config.gpus

    def adapt(self, profile: LaunchProfile) -> LaunchProfile:
        """``profile`` listening on the hosts file's ``server_port`` when it sets one."""
        port = self.config.server_port
        return profile if port is None else profile.on_port(port)

    def gpu_samples(self, env: Mapping[str, str] | None = None) -> list[GpuSample] | None:
        """The configured ``nvidia_smi`` query (with a trial's ``env`` too); None only under ``nvidia_smi: null``.

        A command that is missing or fails is an InfrastructureFault: taking unknown GPUs as free
        would start trials on GPUs someone else holds.
        """
        command = self.config.nvidia_smi
        if command is None:
            return None
        status, out, err = self.execute(gpu.query_argv(command), env=env, timeout=30)
        if status != 0:
            what = "not found there" if status == 127 else f"exited {status}"
            last = (err.strip().splitlines() or out.strip().splitlines() or ["no output"])[-1]
            raise InfrastructureFault(
                f"host {self.name}: GPU query `{shlex.join(command)}` {what} ({last}); set nvidia_smi in the hosts "
                "file to the command answering nvidia-smi's query there, or nvidia_smi: null to run without GPU checks"
            )
        return gpu.parse(out)

    def trial_gpus(self, profile: LaunchProfile) -> list[int]:
        """The GPUs ``profile`` uses here: the host's ``gpus``, else CUDA_VISIBLE_DEVICES or the first its layout takes."""
        if self.config.gpus is not None and "CUDA_VISIBLE_DEVICES" not in profile.env:
            return list(self.config.gpus)
        return server_gpus(profile.args, {**self.config.env, **profile.env})

    def held(self, profile: LaunchProfile) -> list[str]:
        """What keeps ``profile`` from starting: its port in use, its GPUs holding memory."""
        found = []
        if self.run([self.config.python, "-c", _PORT_BUSY_PY, str(profile.port)]).strip() == "busy":
            found.append(f"port {profile.port} in use")
        samples = self.gpu_samples(profile.env)
        if samples is not None:
            found.extend(gpu.busy(samples, self.trial_gpus(profile)))
        return found

    def ensure_clean(self, profile: LaunchProfile, *, timeout: float) -> None:
        """Wait up to ``timeout`` s for the profile's port and GPUs; InfrastructureFault naming holders.

        A server whose stop broke off with the connection is killed by its marker first: it is
        ours, and it would hold the port and GPUs for good.
        """
        for marker in sorted(self._unstopped):
            self.kill_marker(marker)
            self._unstopped.discard(marker)
        deadline = time.monotonic() + timeout
        while (held := self.held(profile)) and time.monotonic() < deadline:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        if held:
            raise InfrastructureFault(
                f"host {self.name} is not clean after {timeout:g} s: {'; '.join(held)}; "
                "stop what holds them there (only if it is yours) and retry"
            )

    def _procs(self, pgid: int, marker: str, sig: int) -> int:
        needle = f"{MARKER_ENV}={marker}"
        return int(self.run([self.config.python, "-c", _PROCS_PY, str(pgid), needle, str(sig)]).strip())

    def kill_marker(self, marker: str) -> int:
        """SIGKILL every remote process carrying ``marker``; how many there were."""
        killed = self._procs(-1, marker, 9)
        _wait(lambda: self._procs(-1, marker, 0) == 0, _KILL_WAIT_S,
              f"host {self.name}: processes of trial {marker} survived SIGKILL; check the host by hand")
        return killed

    def start(self, profile: LaunchProfile, *, marker: str, log_path: Path) -> SSHServer:
        """Launch ``profile`` detached under ``<work_dir>/<marker>/``; its log mirrors into ``log_path``."""
        if not _MARKER.match(marker):
            raise BadInput(f"trial marker {marker!r} must be letters, digits, '.', '_' or '-'")
        secret_names = set_secrets(profile.secret_env)
        run_dir = str(PurePosixPath(self.work_dir()) / marker)
        env = {**self.config.env, **profile.env, MARKER_ENV: marker}
        if self.config.gpus is not None:
            env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(map(str, self.config.gpus)))
        multiline = [name for name in secret_names if "\n" in os.environ[name]]
        if multiline:
            raise BadInput(f"secret {multiline[0]} holds a line break; a remote host takes one-line secrets only")
        secrets = "".join(f"{name}={os.environ[name]}\n" for name in secret_names)  # sent on stdin
        argv = [
            "sh", "-c", _START_SH, "sh", f"{run_dir}/exit-status", run_dir, f"{run_dir}/server.log",
            *env_words(env), *self._launcher(profile),
        ]
        self.run(["mkdir", "-p", "--", run_dir])
        try:
            status, out, err = self.execute(argv, stdin=secrets, retry=False, timeout=30)
        except InfrastructureFault as exc:
            # Did it start before the connection broke? Leave nothing behind either way.
            self.kill_marker(marker)
            raise InfrastructureFault(f"host {self.name}: the connection broke while starting trial {marker}: {exc}") from None
        if status != 0 or not out.strip().isdigit():
            raise InfrastructureFault(f"host {self.name}: could not start the server in {run_dir}: {err.strip() or out.strip()}")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.touch()
        url_host = f"[{self.config.address}]" if ":" in self.config.address else self.config.address
        return SSHServer(self, profile, marker, log_path, run_dir, int(out), f"http://{url_host}:{profile.port}")

    def _launcher(self, profile: LaunchProfile) -> list[str]:
        """``profile.argv`` with its Python replaced by the host's (or the emulator, when emulating)."""
        if self.config.emulate:
            return [self.config.python, "-m", "search.emulator", *profile.args]
        launcher = list(profile.launcher)
        if launcher and PurePosixPath(launcher[0]).name.startswith("python"):
            launcher[0] = self.config.python
        return [*launcher, *profile.args]

    def fetch_dir(self, remote_dir: str, local_dir: Path, skip: Sequence[str] = ()) -> list[Path]:
        """Copy the regular files of ``remote_dir`` (recursively) into ``local_dir``.

        A connection dropped mid-copy reconnects and copies everything again (each file is
        rewritten whole), so a trial's results survive a blip during teardown.
        """
        return self.with_sftp(lambda sftp: _copy_tree(sftp, remote_dir, local_dir, skip))


def _copy_tree(sftp: paramiko.SFTPClient, remote_dir: str, local_dir: Path, skip: Sequence[str] = ()) -> list[Path]:
    copied = []
    for entry in sftp.listdir_attr(remote_dir):
        if entry.filename in skip:
            continue
        remote = f"{remote_dir}/{entry.filename}"
        local = local_dir / entry.filename
        if stat.S_ISDIR(entry.st_mode or 0):
            copied.extend(_copy_tree(sftp, remote, local))
        elif stat.S_ISREG(entry.st_mode or 0):
            local_dir.mkdir(parents=True, exist_ok=True)
            sftp.get(remote, str(local))
            # paramiko's get checks the bytes it wrote against the bytes it read: a connection cut
            # mid-copy ends the read early and passes. The remote size tells a short copy apart.
            if local.stat().st_size != entry.st_size:
                raise EOFError(f"copy of {remote} ended at {local.stat().st_size} of {entry.st_size} bytes")
            copied.append(local)
    return copied


def _wait(done: Callable[[], bool], timeout: float, failure: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() >= deadline:
            raise InfrastructureFault(failure)
        time.sleep(_POLL_S)


class SSHServer:
    """A server started by :class:`SSHHost`: process group ``pgid`` there, log mirrored here."""

    def __init__(self, host: SSHHost, profile: LaunchProfile, marker: str, log_path: Path,
                 run_dir: str, pgid: int, url: str) -> None:
        self.host = host
        self.profile = profile
        self.marker = marker
        self.log_path = log_path
        self.url = url
        self.run_dir = run_dir
        self.pgid = pgid
        self._offset = 0  # bytes of the remote log already mirrored
        self._partial = b""
        self._stopping = False

    def _pull(self) -> list[str]:
        """Append what the remote log gained since the offset; the complete lines of it."""
        remote = f"{self.run_dir}/server.log"

        def read(sftp: paramiko.SFTPClient) -> bytes:
            try:
                size = sftp.stat(remote).st_size or 0
            except FileNotFoundError:
                if self._offset:
                    raise InfrastructureFault(f"host {self.host.name}: the log of trial {self.marker} is gone; trial state lost") from None
                return b""
            if size < self._offset:
                raise InfrastructureFault(f"host {self.host.name}: the log of trial {self.marker} shrank; trial state lost")
            if size == self._offset:
                return b""
            with sftp.open(remote, "rb") as f:
                f.seek(self._offset)
                return f.read(size - self._offset)

        data = self.host.with_sftp(read)
        if not data:
            return []
        self._offset += len(data)
        with open(self.log_path, "ab") as local:
            local.write(data)
        complete, self._partial = split_pieces(self._partial + data)  # tqdm redraws count as lines
        return [line.decode(errors="replace") for line in complete]

    def new_lines(self, timeout: float) -> list[str]:
        """Complete lines since the last call, waiting up to ``timeout`` for the first."""
        deadline = time.monotonic() + timeout
        while True:
            lines = self._pull()
            if lines or time.monotonic() >= deadline:
                return lines
            time.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())))

    def returncode(self) -> int | None:
        """The exit status (negative signal number as subprocess gives it), None while running.

        A server gone without a recorded status (host rebooted, killed from outside while we were
        not stopping it) is an InfrastructureFault: its trial state is lost, not its config's fault.
        """
        status = self._recorded_status()
        if status is None:
            if self.host._procs(self.pgid, self.marker, 0):  # zombies excluded: they hold nothing
                return None
            status = self._recorded_status()  # it may have exited between the two looks
        if status is None:
            if self._stopping:
                return -9
            raise InfrastructureFault(
                f"host {self.host.name}: the server of trial {self.marker} vanished without an exit status; trial state lost"
            )
        return 128 - status if status > 128 else status  # the shell reports death by signal N as 128+N

    def _recorded_status(self) -> int | None:
        text = self.host.run(["sh", "-c", 'cat -- "$1" 2>/dev/null || true', "sh", f"{self.run_dir}/exit-status"])
        return int(text) if text.strip().lstrip("-").isdigit() else None

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the group, wait ``grace``, SIGKILL group and marker, check the port and GPUs.

        The rest of the log and any other files of the remote run directory are then copied
        next to ``log_path``. InfrastructureFault when something survives or stays held.
        """
        self._stopping = True
        host = self.host
        host._unstopped.add(self.marker)
        if host._procs(self.pgid, self.marker, 15):
            deadline = time.monotonic() + grace
            while host._procs(self.pgid, self.marker, 0) and time.monotonic() < deadline:
                time.sleep(_POLL_S)
        if host._procs(self.pgid, self.marker, 9):
            _wait(lambda: host._procs(self.pgid, self.marker, 0) == 0, _KILL_WAIT_S,
                  f"host {host.name}: processes of trial {self.marker} survived SIGKILL; check the host by hand")
        host._unstopped.discard(self.marker)
        self._pull()
        host.fetch_dir(self.run_dir, self.log_path.parent, skip=("server.log",))
        host.ensure_clean(self.profile, timeout=_RELEASE_WAIT_S)
